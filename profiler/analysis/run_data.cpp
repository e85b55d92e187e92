#include "profiler/analysis/run_data.hpp"

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "store/db.hpp"
#include "store/reader.hpp"

namespace wb::analysis {

namespace {
const std::vector<store::RangeRow> kNoRanges;
const std::string kEmpty;
}  // namespace

const std::string& RunData::name(std::uint32_t id) const { return id < strings.size() ? strings[id] : kEmpty; }

const store::TrackRow* RunData::track(std::uint32_t id) const {
  for (const auto& t : tracks)
    if (t.id == id) return &t;
  return nullptr;
}

std::vector<int> RunData::rank_ids() const {
  // Rows come in runs of one rank: a set insert per step and allreduce row cost a long run's frame more
  // than its drawing.
  std::vector<int> ids;
  auto add = [&](int rank) {
    if (ids.empty() || ids.back() != rank) ids.push_back(rank);
  };
  for (const auto& r : ranks) add(r.rank);
  for (const auto& t : tracks) add(t.rank);
  for (const auto& s : steps) add(s.rank);
  for (const auto& a : allreduces) add(a.rank);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

OverlapFinder::OverlapFinder(const std::vector<store::RangeRow>& rows, std::int64_t short_ns)
    : rows_(&rows), short_ns_(std::max<std::int64_t>(short_ns, 0)) {
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].end_ns - rows[i].start_ns > short_ns_) long_.push_back(i);
}

std::size_t OverlapFinder::first_start_after(std::int64_t t) const {
  auto it = std::upper_bound(rows_->begin(), rows_->end(), t,
                             [](std::int64_t v, const store::RangeRow& r) { return v < r.start_ns; });
  return static_cast<std::size_t>(it - rows_->begin());
}

StepIndex::StepIndex(const RunData& run) : run_(run) {
  for (const auto& s : run.steps) {
    rows_[{s.rank, s.step}] = &s;
    longest_ = std::max(longest_, s.end_ns - s.start_ns);
  }
}

const store::StepRow* StepIndex::step_row(int rank, int step) const {
  auto it = rows_.find({rank, step});
  return it != rows_.end() ? it->second : nullptr;
}

const std::vector<store::RangeRow>& StepIndex::main_rows(int rank) {
  auto [it, fresh] = main_.try_emplace(rank, 0);
  if (fresh) it->second = run_.main_track(rank);
  return run_.ranges_of(it->second);
}

const OverlapFinder& StepIndex::finder(int rank) {
  auto it = finders_.find(rank);
  if (it == finders_.end()) it = finders_.emplace(rank, OverlapFinder(main_rows(rank), longest_)).first;
  return it->second;
}

std::uint32_t RunData::main_track(int rank) const {
  std::uint32_t best = 0, named_main = 0, most = 0;
  std::size_t best_steps = 0, most_ranges = 0;
  for (const auto& t : tracks) {
    if (t.rank != rank || t.kind != store::TrackKind::thread) continue;
    const auto& rows = ranges_of(t.id);
    std::size_t n_steps = static_cast<std::size_t>(std::count_if(rows.begin(), rows.end(), [](const auto& r) {
      return r.category == static_cast<std::uint8_t>(store::Category::step);
    }));
    if (n_steps > best_steps) {
      best_steps = n_steps;
      best = t.id;
    }
    if (name(t.name) == "main" && named_main == 0) named_main = t.id;
    if (rows.size() > most_ranges) {
      most_ranges = rows.size();
      most = t.id;
    }
  }
  if (best != 0) return best;
  if (named_main != 0) return named_main;
  return most;
}

const std::vector<store::RangeRow>& RunData::ranges_of(std::uint32_t track) const {
  auto it = ranges.find(track);
  return it == ranges.end() ? kNoRanges : it->second;
}

std::int64_t RunData::dropped_events() const {
  std::int64_t n = 0;
  for (const auto& r : ranks) n += r.dropped_events;
  return n;
}

bool RunData::complete() const {
  auto it = meta.find("complete");
  return it != meta.end() && it->second == "1";
}

RunData load_run(store::Reader& reader, const LoadOptions& options) {
  auto cancelled = [&] { return options.cancel && options.cancel->load(); };
  auto check_cancel = [&] {
    if (cancelled()) throw LoadCancelled(reader.path().string() + ": loading cancelled");
  };
  RunData run;
  run.path = reader.path();
  run.meta = reader.meta();
  run.config = reader.config();
  run.strings = reader.strings();
  run.ranks = reader.ranks();
  run.tracks = reader.tracks();
  auto& db = reader.db();
  run.kernel_rows = options.events ? db.query_int64("SELECT count(*) FROM kernel") : 0;
  const std::int64_t total = options.progress && options.events ? db.query_int64("SELECT count(*) FROM range") + run.kernel_rows : 0;

  std::vector<const store::TrackRow*> event_tracks;  // thread and stream tracks
  for (const auto& t : run.tracks) {
    if (t.kind == store::TrackKind::queue) run.counters[t.id] = reader.counters(t.id);
    else if (options.events) event_tracks.push_back(&t);
  }
  // Each thread takes the next track until none is left; the calling thread reads through `reader`,
  // the others through a connection of their own.
  struct TrackRows {
    std::vector<store::RangeRow> ranges;
    std::vector<store::KernelRow> kernels;
  };
  std::vector<TrackRows> loaded(event_tracks.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> rows_done{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&](store::Reader* own) {
    try {
      std::optional<store::Reader> opened;
      if (!own) own = &opened.emplace(run.path);
      for (std::size_t i = next++; i < event_tracks.size() && !cancelled(); i = next++) {
        const auto& t = *event_tracks[i];
        std::int64_t reported = 0;  // this track's rows already added to rows_done
        store::ProgressFn on_rows;
        if (options.progress)
          on_rows = [&](std::uint64_t n, std::uint64_t) {
            const auto rows = static_cast<std::int64_t>(n);
            options.progress(rows_done.fetch_add(rows - reported) + rows - reported, total);
            reported = rows;
          };
        if (t.kind == store::TrackKind::stream) loaded[i].kernels = own->kernels(t.id, on_rows);
        else loaded[i].ranges = own->ranges(t.id, on_rows);
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < options.threads && k < event_tracks.size(); ++k) pool.emplace_back(work, nullptr);
  work(&reader);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  check_cancel();
  for (std::size_t i = 0; i < event_tracks.size(); ++i) {
    const auto id = event_tracks[i]->id;
    if (!loaded[i].kernels.empty()) run.kernels[id] = std::move(loaded[i].kernels);
    if (!loaded[i].ranges.empty()) run.ranges[id] = std::move(loaded[i].ranges);
  }
  run.steps = reader.steps();
  run.allreduces = reader.allreduces();
  run.evaluations = reader.evaluations();
  run.capture_windows = reader.capture_windows();
  run.calibration = reader.comm_calibrations();
  run.split_trials = reader.split_trials();
  run.params = reader.params();
  run.pipeline_spans = reader.pipeline_spans();
  run.pipeline_steps = reader.pipeline_steps();
  if (options.events) run.memory = reader.memory();
  check_cancel();
  return run;
}

RunData load_run(const std::filesystem::path& path, const LoadOptions& options) {
  store::Reader reader(path);
  return load_run(reader, options);
}

std::int64_t union_length(std::vector<std::pair<std::int64_t, std::int64_t>> intervals, std::int64_t lo,
                          std::int64_t hi) {
  for (auto& iv : intervals) {
    iv.first = std::max(iv.first, lo);
    iv.second = std::min(iv.second, hi);
  }
  std::erase_if(intervals, [](const auto& iv) { return iv.second <= iv.first; });
  std::sort(intervals.begin(), intervals.end());
  std::int64_t total = 0, cur_start = 0, cur_end = INT64_MIN;
  for (const auto& [s, e] : intervals) {
    if (s > cur_end) {
      if (cur_end != INT64_MIN) total += cur_end - cur_start;
      cur_start = s;
      cur_end = e;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (cur_end != INT64_MIN) total += cur_end - cur_start;
  return total;
}

}  // namespace wb::analysis
