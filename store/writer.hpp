// The recording side of a run file. Producers on any thread append rows to in-memory batches under a
// short lock; one background thread commits them in batched transactions with prepared statements.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "store/rows.hpp"

namespace wb::store {

class SummaryBuilder;  // summary.hpp

class Db;

struct WriterOptions {
  std::filesystem::path path;
  int rank = 0;
  // Rows waiting for the background thread beyond this are dropped and counted, so a stalled disk
  // never grows memory without bound.
  std::size_t max_pending_rows = std::size_t{1} << 22;
  // Instead of dropping rows over max_pending_rows, add() waits until the background thread has taken
  // the pending rows: for a writer that must lose nothing and can wait (wb import), this bounds the rows
  // held in memory while the inserts are behind.
  bool wait_for_room = false;
  // How often pending rows are committed; docs/ARCHITECTURE.md promises at most 200 ms of loss on a kill.
  std::chrono::milliseconds flush_interval{100};
  // Commit early once this many rows wait (at most half of max_pending_rows), so a burst is written
  // back to back instead of idling until the interval is up; 0 commits on the interval only.
  std::size_t eager_commit_rows = 65536;
  // Commit pending rows on SIGINT/SIGTERM and raise stop_requested() (see Writer).
  bool handle_signals = true;
  // Replace an existing file at path instead of failing.
  bool overwrite = false;
  // Build the schema's indexes when the writer closes. Rows are recorded without indexes (each one would
  // roughly double the cost of every insert); a per-rank file that wb merge will combine can skip them,
  // since merge builds the merged file's indexes itself.
  bool build_indexes = true;
  // Bulk load of a file that is renamed into place only once complete (wb import): no journal, and the
  // indexes exist from the start, which is cheaper than building them at the end when rows arrive in
  // index order (each track's ranges by start time) as an import writes them.
  bool bulk_load = false;
  // At the close, replace the file with a copy whose pages are packed full (write_packed_copy in
  // db.hpp): about 12% smaller, for about a tenth of a second per million ranges. Not where the file is
  // mostly dumped tensors.
  bool pack = true;
  // Print the first failed commit on stderr, saying the run will be marked incomplete (a training run
  // goes on). Off where the caller reports failure() itself (wb import, which then removes the file).
  bool report_failure = true;
};

// What the background thread has done so far, for overhead reports and benchmarks.
struct WriterStats {
  std::uint64_t rows_committed = 0;  // event rows (ranges, kernels, counters, ...) committed
  std::uint64_t commits = 0;         // transactions committed
  double commit_cpu_s = 0.0;         // CPU time the background thread spent committing
  double commit_wall_s = 0.0;        // wall time it spent committing
};

// Writes one rank's run file (RUN/rank-<r>.sqlite or a single-process RUN.sqlite).
//
// Signals (handle_signals): on SIGINT/SIGTERM everything pending is committed within one polling
// interval (<= 50 ms), stop_requested() becomes true so the training loop can stop cleanly, and if the
// process is still alive 3 s later the default handler is restored and the signal raised again.
//
// I/O errors (full disk, locked file) never reach the producers: the first is reported once on stderr,
// the rows of every failed batch are counted as dropped, and meta.complete stays 0.
class Writer {
 public:
  // Throws StoreError if the file exists (unless overwrite), or when another process is using it
  // (another Writer recording into it, or a lock held on it): "PATH: in use, ...".
  explicit Writer(WriterOptions opts);
  // Flushes, builds the indexes (unless opts.build_indexes is false) and closes; meta.complete is left
  // as it is. A killed writer leaves a file without indexes: readers still get every row (by scanning),
  // and open_run(read_write) or wb merge add the indexes.
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // A stable id for a string, memoized; the string row is written with the next commit. Thread-safe.
  std::uint32_t intern(std::string_view text);
  // A new track of this writer's rank. Thread-safe.
  std::uint32_t add_track(TrackKind kind, std::string_view name);

  void set_meta(std::string_view key, std::string_view value);
  // Replaces this rank's row (a default row with host and pid is written at creation).
  void set_rank(const RankRow& row);

  void add(const RangeRow& row);
  void add(std::span<const RangeRow> rows);
  void add(const KernelRow& row);
  void add(std::span<const KernelRow> rows);
  // Takes every kernel row of a file that write_kernel_file wrote, in the next commit: its table copied
  // whole into this file's empty kernel table (SQLite's transfer of records as they are, far cheaper than
  // inserting them). The caller removes the file once this writer is closed. Kernel rows must not also
  // come through add.
  void adopt_kernels(const std::filesystem::path& file);
  void add(const CounterRow& row);
  void add(std::span<const CounterRow> rows);
  void add(const AllreduceRow& row);
  void add(std::span<const AllreduceRow> rows);
  void add(const StepRow& row);
  void add(std::span<const StepRow> rows);
  void add(const EvaluationRow& row);
  void add(const CaptureWindowRow& row);
  void add(std::span<const CommCalibrationRow> rows);
  void add(const MemoryRow& row);
  void add(std::span<const MemoryRow> rows);
  void add(const PipelineSpanRow& row);
  void add(std::span<const PipelineSpanRow> rows);
  void add(const PipelineStepRow& row);
  void add(std::span<const PipelineStepRow> rows);
  void add(ParamRow row);
  void add(TensorRow row);

  // Counts events a producer lost on its own (e.g. a full ring buffer) as dropped.
  void count_dropped(std::uint64_t n);
  // Rows lost so far (over max_pending_rows, failed commits, count_dropped).
  std::uint64_t dropped() const;
  // True once a commit has failed; the run will stay incomplete.
  bool failed() const;
  // What made the first failed commit fail (empty while none has).
  std::string failure() const;
  WriterStats stats() const;

  // Blocks until everything enqueued before the call has been committed (or counted as dropped).
  void flush();
  // Asks the background thread to commit what is pending now, without waiting for it. The Recorder's
  // flusher calls it after each hand-over, so its rows wait for one commit instead of also waiting out
  // the commit interval: what a kill loses is then one flush interval plus one commit.
  void commit_soon();
  // Flushes and marks the run complete (meta.complete = 1). Returns false, leaving complete = 0, when
  // any commit failed.
  bool finish();
  // The timeline summaries of every thread and stream track (summary.hpp), built by the caller from the
  // rows it handed over, while this writer's thread inserted them: written at close instead of being built
  // from the file. Built from the file all the same when the builder saw rows out of order or any row was
  // dropped.
  void use_summary(std::unique_ptr<SummaryBuilder> summary);

  const std::filesystem::path& path() const { return opts_.path; }
  int rank() const { return opts_.rank; }

  // True after SIGINT/SIGTERM was received by a process with a signal-handling Writer.
  static bool stop_requested();

 private:
  struct Pending;
  void run_background();
  // Under mutex_ (held by lk): room for n more rows, else counts them as dropped; with wait_for_room it
  // waits for the room instead.
  bool admit(std::unique_lock<std::mutex>& lk, std::size_t n);
  std::size_t eager_rows() const;  // pending rows that start a commit before the interval is up
  bool commit(Pending& batch);  // true when the batch was committed
  void insert_range_rows(Db& db, std::vector<RangeRow>& rows);
  void reclaim_wal();

  WriterOptions opts_;
  std::unique_ptr<Db> db_;
  int lock_fd_ = -1;  // an flock held on the file while this writer lives (in_use_by_another)

  mutable std::mutex mutex_;
  std::condition_variable wake_;       // producers/flush -> background thread
  std::condition_variable committed_;  // background thread -> flush()
  std::condition_variable room_;       // background thread -> add() waiting for room (wait_for_room)
  std::unique_ptr<Pending> pending_;
  std::size_t pending_rows_ = 0;
  std::uint64_t flush_requested_ = 0;
  std::uint64_t flush_done_ = 0;
  bool commit_soon_ = false;
  bool stopping_ = false;

  std::mutex intern_mutex_;
  std::unordered_map<std::string, std::uint32_t> strings_;
  std::uint32_t next_track_ = 1;

  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<bool> failed_{false};
  std::uint64_t dropped_written_ = 0;  // background thread only
  std::optional<std::int64_t> time_origin_ns_;  // background thread only: set by the first ranges
  bool origin_uncommitted_ = false;             // background thread only
  WriterStats stats_;                  // under mutex_
  std::string failure_;                // under mutex_: the first failed commit's error
  std::unique_ptr<SummaryBuilder> summary_;
  std::thread thread_;
};

// Writes kernel rows into a new file of their own, for Writer::adopt_kernels: another thread than the
// writer's inserts them there, beside the writer's thread. `indexes` must be what the adopting writer's
// file has (bulk_load and build_indexes both true), or the copy falls back to inserting row by row.
// Throws StoreError.
void write_kernel_file(const std::filesystem::path& file, const std::vector<std::span<const KernelRow>>& parts,
                       bool indexes);

// Appends a comparison and its rows to an existing run file; returns the comparison's id.
std::int64_t save_comparison(const std::filesystem::path& run, const ComparisonRow& comparison,
                             std::span<const ComparisonEntryRow> rows);
// Appends one split trial (wb tune-split) to an existing run file, migrating an older file first.
void save_split_trial(const std::filesystem::path& run, const SplitTrialRow& trial);

}  // namespace wb::store
