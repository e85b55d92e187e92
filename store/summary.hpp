#pragma once
// Level-of-detail summaries of a run file's timeline, so a viewer can draw any zoom of a run of any size
// without reading its rows: per thread or stream track and nesting depth, a pyramid of time buckets.
// Level 0 has buckets of `bucket_ns`; each level above halves their number (level L: bucket_ns << L) up
// to a single bucket. A bucket holds the ranges (or kernels) that start in it, the busy time of that
// depth inside it, and the name holding most of that time.
//
// The summaries are derived from the rows and rebuilt from them at will (build_summary), so they live
// outside the versioned schema, in two tables created when first built:
//   summary_track  (track_id, depth, origin_ns, bucket_ns, levels, rows, longest_ns, first_ns, last_ns,
//                  long_ns)
//   summary_bucket (track_id, depth, level, bucket, count, busy_ns, name_id, category), keyed by its
//                  first four
// A bucket with nothing in it is not stored. A third table keeps each thread track's longest ranges:
//   summary_long   (track_id, start_ns, kind, end_ns, name_id): every range of at least
//                  summary_track.long_ns, a power of two of ns (from 1 us) doubled until at most 4,096 such
//                  ranges are left; kind is range_data's (depth * 16 + category)
// so the ranges overlapping a window are those starting at most long_ns before it, and those of these
// that reach into it: a window read never scans back by the run's longest range (a 3 s step).
// meta.summary_version says the tables are complete.
//
// Level 0's bucket is a power of two of nanoseconds, at least 1 us, chosen so level 0 has at most 65,536
// buckets and the stored ones hold 32 rows or more on average: a viewer reads a summary of any window
// in a few thousand rows, and the rows themselves once a window holds few enough.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "store/db.hpp"
#include "store/reader.hpp"

namespace wb::store {

inline constexpr int kSummaryVersion = 3;  // bump when the tables change: older ones are rebuilt

struct SummaryTrack {
  std::uint32_t track = 0;
  int depth = 0;
  std::int64_t origin_ns = 0;  // bucket 0 of every level starts here (the run's clock)
  std::int64_t bucket_ns = 0;  // level 0's bucket width
  int levels = 0;              // levels 0 .. levels - 1; the last has one bucket
  std::int64_t rows = 0;       // ranges or kernels at this depth
  std::int64_t longest_ns = 0; // the longest of them (bounds a window's key scan: Reader::known_longest)
  std::int64_t first_ns = 0;   // the first start and the last end among them
  std::int64_t last_ns = 0;
  std::int64_t long_ns = 0;    // the track's summary_long threshold (every depth's row holds it)
  std::int64_t width(int level) const { return bucket_ns << level; }
};

struct SummaryBucket {
  std::int64_t start_ns = 0;  // the bucket's extent on the run's clock
  std::int64_t end_ns = 0;
  std::int64_t count = 0;     // rows that start in it
  std::int64_t busy_ns = 0;   // time inside it covered by this depth's rows (kernels: summed, may exceed)
  std::uint32_t name = 0;     // string.id of the name holding most of that time
  std::uint8_t category = 0;  // its category (a range's store::Category, a kernel's store::KernelKind)
};

// The summaries of rows handed over one track after another, built as they go by: a writer of many rows
// builds them on its own thread while the writer's thread inserts the rows, instead of reading them back
// from the file after (build_summary feeds it the file's rows). Each track's rows must come in the order
// build_summary reads them: ranges by start, then depth and category (enclosing ranges first); kernels by
// start. A row out of that order, or a row of a track already ended, makes in_order() false: such a
// builder's tables would differ from build_summary's, and its user builds them from the file instead.
class SummaryBuilder {
 public:
  SummaryBuilder();
  ~SummaryBuilder();
  SummaryBuilder(const SummaryBuilder&) = delete;
  SummaryBuilder& operator=(const SummaryBuilder&) = delete;

  // A range of a thread track (times on the run's clock) or a kernel of a stream track.
  void add(const RangeRow& r);
  void add(const KernelRow& k);
  // A row as range_data or the kernel table holds it: start and end on the run's clock, `kind` the
  // stored one (range_table.hpp; a kernel's KernelKind).
  void add(std::uint32_t track, bool thread, std::int64_t start, std::int64_t end, std::int64_t kind,
           std::uint32_t name);
  // The track's rows are all in: its buckets are made and its level-0 cells freed.
  void end_track(std::uint32_t track);
  bool in_order() const { return in_order_; }
  // Ends every track, and replaces the summary tables of `db` (opened read-write) with these, in one
  // transaction. Throws StoreError.
  void write(Db& db);

 private:
  struct State;
  std::unique_ptr<State> s_;
  bool in_order_ = true;
};

// True when `db` holds complete summaries of this summary version.
bool has_summary(Db& db);

// Builds the summaries of every thread and stream track of `db` (opened read-write), replacing any, in
// one transaction. progress(rows read, rows in total) is called as tracks go by; a set `cancel` stops
// the build (nothing is written) and returns false.
bool build_summary(Db& db, const ProgressFn& progress = {}, const std::atomic<bool>* cancel = nullptr);

// What the summaries of an open file hold: every (track, depth) summarised, ordered by track and depth.
std::vector<SummaryTrack> summary_tracks(Db& db);
// The distinct starts of the track's long ranges (summary_long) in [from_ns, before_ns) that end at or
// after ends_at_or_after_ns.
std::vector<std::int64_t> summary_long_starts(Db& db, std::uint32_t track, std::int64_t from_ns, std::int64_t before_ns,
                                             std::int64_t ends_at_or_after_ns);
// Every long range of a track (summary_long) by start, with its depth, category and name (no step or
// corr_id): a depth whose every range is among them (SummaryTrack::rows of them) is drawn exactly.
std::vector<RangeRow> summary_long_rows(Db& db, std::uint32_t track);
// The stored buckets of one (track, depth) at `level` that overlap [t0_ns, t1_ns], in time order.
std::vector<SummaryBucket> summary_buckets(Db& db, const SummaryTrack& track, int level, std::int64_t t0_ns,
                                           std::int64_t t1_ns);

}  // namespace wb::store
