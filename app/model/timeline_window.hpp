// The timeline of a run too large to hold in memory: opened from the run file's level-of-detail summaries
// (store/summary.hpp) and read window by window. Each frame the Timeline says which time it shows; when
// the rows of that window are few enough (kRowBudget), they are read on a background thread through the
// range key and published as a RunModel of their own (the lanes draw it as they draw a whole run); until
// then, and whenever the window holds more, the lanes draw the summary at about a bucket per pixel, read
// on the same thread when the coarse levels held from the open are not fine enough.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/reader.hpp"
#include "store/summary.hpp"

namespace wb::app_model {

struct RunModel;

// Summary buckets of one level for a time window, per (track, depth).
struct SummaryView {
  std::int64_t t0_ns = 0;  // the window they cover
  std::int64_t t1_ns = 0;
  std::int64_t bucket_ns = 0;  // the widest bucket among them
  std::map<std::pair<std::uint32_t, int>, std::vector<store::SummaryBucket>> buckets;
};

class TimelineWindow : public std::enable_shared_from_this<TimelineWindow> {
 public:
  // A window's rows are read once it holds at most this many (estimated from the summary), with half a
  // window either side: about 100,000 rows, read in well under 100 ms. More than that are 30 a pixel
  // across the lanes, which no one tells apart: the summary draws them as well.
  static constexpr std::int64_t kRowBudget = 50'000;
  // Levels with at most this many buckets are read at the open and held.
  static constexpr std::int64_t kCoarseBuckets = 4096;

  // Reads the summary's tracks and coarse levels from `path` (which must have them) and starts the reader
  // thread. `lean` is the model without rows that every window's model copies (copy_without_rows); its
  // own `window` stays null. Hold the window in a shared_ptr (take() hands out shared_from_this).
  TimelineWindow(const std::filesystem::path& path, std::shared_ptr<const RunModel> lean);
  ~TimelineWindow();  // stops and joins the reader thread
  TimelineWindow(const TimelineWindow&) = delete;
  TimelineWindow& operator=(const TimelineWindow&) = delete;

  const std::vector<store::SummaryTrack>& tracks() const { return tracks_; }
  // Depths a thread or stream track has (its lane's rows); 0 for a track without any.
  int depths(std::uint32_t track) const;
  // The summary of one (track, depth); null when it has none.
  const store::SummaryTrack* info(std::uint32_t track, int depth) const;
  // True when every range of a thread track's depth is among its long ranges (store::summary_long_rows):
  // those are read at the open and every window's model holds them, so the depth draws its own rows at
  // any zoom (steps, phases, layers: the long, few ranges).
  bool held_whole(std::uint32_t track, int depth) const { return whole_.count({track, depth}) > 0; }
  // The ranges of a track's depths held whole, by start (empty when none).
  const std::vector<store::RangeRow>& held(std::uint32_t track) const;
  std::int64_t rows() const { return rows_; }  // every range and kernel summarised
  // The extent of everything summarised (first > second when nothing is).
  std::pair<std::int64_t, std::int64_t> extent() const { return extent_; }
  // Rows starting in [t0, t1], estimated from the coarse levels (whole buckets: an upper bound).
  std::int64_t estimate_rows(std::int64_t t0_ns, std::int64_t t1_ns) const;

  // Called by the Timeline every frame with the window it draws: starts a read when neither the rows
  // nor a summary fine enough for it are there or on their way. Cheap when nothing is needed.
  void want(double t0_ns, double t1_ns, double width_px);
  // True when what that window needs is here: its rows, or a summary fine enough for it.
  bool shows(double t0_ns, double t1_ns, double width_px) const;
  // The model holding the rows of the latest window read (its `window` is this), once, then null until
  // the next read finishes.
  std::shared_ptr<const RunModel> take();
  // The buckets to draw for a window ns_per_px wide per pixel: the finest summary read that covers it,
  // else the coarse levels. Never null.
  std::shared_ptr<const SummaryView> summary_for(double t0_ns, double t1_ns, double ns_per_px) const;
  bool reading() const { return busy_.load(); }

  // Per rank, a time window [t0, t1] of its own (ranks drift apart: a step of one is not the same time as
  // the same step of another).
  using RankSpans = std::map<int, std::pair<std::int64_t, std::int64_t>>;
  // Rows of each rank's tracks starting in its window, estimated as estimate_rows does.
  std::int64_t estimate_rows(const RankSpans& spans) const;

  // The rows of [t0, t1] (every range and kernel that overlaps it, and the depths held whole) as a model
  // of its own, copied from the lean one: what each window's read publishes (with its timeline levels).
  std::shared_ptr<RunModel> read_window(store::Reader& reader, std::int64_t t0_ns, std::int64_t t1_ns) const;
  // The same for each rank's own window (none for a rank not in `spans`), without timeline levels: what a
  // windowed open analyses (run_model.cpp).
  std::shared_ptr<RunModel> read_window(store::Reader& reader, const RankSpans& spans) const;

  // The analyses of a windowed run, over the rows of a sample of its steps (set once by the loader, after
  // the Timeline can draw): null until they are done, and when none could be made; `sample_status` says
  // which (what is being analysed, or why nothing is).
  std::shared_ptr<const RunModel> sample() const;
  std::string sample_status() const;
  void set_sample(std::shared_ptr<const RunModel> model, std::string status);
  double last_read_seconds() const { return last_read_s_.load(); }

 private:
  struct Request {
    bool rows = false;  // rows, else a summary level
    std::int64_t t0_ns = 0, t1_ns = 0;            // what is read: the window with a margin
    std::int64_t want_t0 = 0, want_t1 = 0;        // the window drawn
    double ns_per_px = 1.0;
    std::int64_t level = 0;  // summary requests: the bucket width wanted (a power of two of ns)
  };
  Request plan(double t0_ns, double t1_ns, double width_px) const;
  bool satisfied_locked(const Request& r) const;  // under mutex_
  void run();
  void read_rows(store::Reader& reader, const Request& r);
  void read_summary(store::Reader& reader, const Request& r);
  // read_window for a window per track (none: the track has no rows read).
  using Span = std::optional<std::pair<std::int64_t, std::int64_t>>;
  std::shared_ptr<RunModel> read_tracks(store::Reader& reader, const std::function<Span(const store::TrackRow&)>& span,
                                        bool with_levels) const;
  int level_for(double ns_per_px) const;  // the level whose widest bucket is about a pixel

  std::filesystem::path path_;
  std::shared_ptr<const RunModel> lean_;
  std::vector<store::SummaryTrack> tracks_;
  std::map<std::uint32_t, int> depths_;
  std::map<std::uint32_t, int> rank_of_;  // track -> rank
  std::map<std::pair<std::uint32_t, int>, std::size_t> info_;  // (track, depth) -> index in tracks_
  std::set<std::pair<std::uint32_t, int>> whole_;
  std::map<std::uint32_t, std::vector<store::RangeRow>> held_;
  std::int64_t rows_ = 0;
  std::pair<std::int64_t, std::int64_t> extent_{0, 0};
  std::shared_ptr<const SummaryView> coarse_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<Request> pending_;
  std::optional<Request> in_flight_;  // the request being read (under mutex_)
  std::pair<std::int64_t, std::int64_t> rows_span_{0, -1};  // the rows of the latest read cover this
  std::shared_ptr<RunModel> fresh_;  // read, not yet taken; its window is set when taken (no cycle)
  std::shared_ptr<const SummaryView> fine_;
  std::shared_ptr<const RunModel> sample_;
  std::string sample_status_;
  std::int64_t fine_level_ = -1;  // the bucket width fine_ was read for
  bool stop_ = false;
  std::atomic<bool> busy_{false};
  std::atomic<double> last_read_s_{0.0};
  std::thread thread_;
};

}  // namespace wb::app_model
