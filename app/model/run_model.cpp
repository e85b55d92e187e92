#include "app/model/run_model.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>

#include "store/db.hpp"
#include "store/reader.hpp"

namespace wb::app_model {

std::string RunModel::title() const { return run.path.filename().string(); }

std::vector<std::int64_t> RunModel::durations(std::uint32_t name, store::Category category) const {
  std::vector<std::int64_t> out;
  const auto cat = static_cast<std::uint8_t>(category);
  for (const auto& [track, rows] : run.ranges)
    for (const auto& r : rows)
      if (r.name == name && r.category == cat) out.push_back(r.end_ns - r.start_ns);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::uint32_t> RunModel::find_name(std::string_view text) const {
  for (std::uint32_t i = 0; i < run.strings.size(); ++i)
    if (run.strings[i] == text) return i;
  return std::nullopt;
}

void LoadProgress::set_stage(std::string text) {
  std::lock_guard lock(mutex);
  stage = std::move(text);
}

std::string LoadProgress::get_stage() const {
  std::lock_guard lock(mutex);
  return stage;
}

namespace {

class Cancelled : public std::exception {};

void check_cancel(LoadProgress* p) {
  if (p && p->cancel.load()) throw Cancelled();
}

}  // namespace

std::shared_ptr<const RunModel> load_run_model(const std::filesystem::path& path, LoadProgress* progress,
                                               const std::function<void(std::shared_ptr<const RunModel>)>& on_open) {
  using clock = std::chrono::steady_clock;
  auto t_start = clock::now();
  auto stage = [&](const char* text, double fraction) {
    if (!progress) return;
    progress->set_stage(text);
    progress->fraction.store(fraction);
  };
  auto model = std::make_shared<RunModel>();
  auto& run = model->run;

  stage("opening", 0.0);
  store::Reader reader(path);
  run.path = reader.path();
  run.meta = reader.meta();
  run.config = reader.config();
  run.strings = reader.strings();
  run.ranks = reader.ranks();
  run.tracks = reader.tracks();
  auto& db = reader.db();
  const std::int64_t total_ranges = db.query_int64("SELECT count(*) FROM range");
  const std::int64_t total_kernels = db.query_int64("SELECT count(*) FROM kernel");
  const double total = static_cast<double>(std::max<std::int64_t>(total_ranges + total_kernels, 1));
  // Reading rows is ~70 % of the open. Host and device tracks are read by a few threads, each with its
  // own connection, and each builds its tracks' timeline levels as it goes.
  std::vector<const store::TrackRow*> event_tracks;
  for (const auto& t : run.tracks) {
    if (t.kind == store::TrackKind::queue) {
      run.counters[t.id] = reader.counters(t.id);
      model->counter_count += static_cast<std::int64_t>(run.counters[t.id].size());
    } else {
      event_tracks.push_back(&t);
    }
  }
  struct TrackRows {
    std::vector<store::RangeRow> ranges;
    std::vector<store::KernelRow> kernels;
    std::vector<Level> levels;
  };
  std::vector<TrackRows> loaded(event_tracks.size());
  std::atomic<std::int64_t> rows_done{0};
  std::atomic<std::size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  stage("reading host ranges", 0.0);
  auto work = [&] {
    try {
      store::Reader own(path);
      for (std::size_t i = next++; i < event_tracks.size(); i = next++) {
        if (progress && progress->cancel.load()) return;
        const auto& t = *event_tracks[i];
        std::int64_t before = 0;
        auto on_rows = [&](std::uint64_t n, std::uint64_t) {
          std::int64_t now = rows_done.fetch_add(static_cast<std::int64_t>(n) - before) + static_cast<std::int64_t>(n) - before;
          before = static_cast<std::int64_t>(n);
          if (progress) progress->fraction.store(0.7 * static_cast<double>(now) / total);
        };
        if (t.kind == store::TrackKind::stream) {
          loaded[i].kernels = own.kernels(t.id, on_rows);
          loaded[i].levels = build_levels(loaded[i].kernels);
        } else {
          loaded[i].ranges = own.ranges(t.id, on_rows);
          loaded[i].levels = build_levels(loaded[i].ranges);
        }
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < threads && k < event_tracks.size(); ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  check_cancel(progress);
  for (std::size_t i = 0; i < event_tracks.size(); ++i) {
    const auto id = event_tracks[i]->id;
    if (event_tracks[i]->kind == store::TrackKind::stream) {
      model->kernel_count += static_cast<std::int64_t>(loaded[i].kernels.size());
      if (!loaded[i].kernels.empty()) {
        model->kernels[id] = std::move(loaded[i].kernels);
        model->levels[id] = std::move(loaded[i].levels);
      }
    } else {
      model->range_count += static_cast<std::int64_t>(loaded[i].ranges.size());
      if (!loaded[i].ranges.empty()) {
        run.ranges[id] = std::move(loaded[i].ranges);
        model->levels[id] = std::move(loaded[i].levels);
      }
    }
  }
  stage("reading steps and allreduce spans", 0.7);
  run.steps = reader.steps();
  run.allreduces = reader.allreduces();
  run.params = reader.params();
  run.kernel_rows = total_kernels;
  model->comparisons = reader.comparisons();
  check_cancel(progress);

  stage("indexing the timeline", 0.75);
  std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = std::numeric_limits<std::int64_t>::min();
  auto extend = [&](std::int64_t a, std::int64_t b) {
    lo = std::min(lo, a);
    hi = std::max(hi, b);
  };
  for (const auto& [id, rows] : run.ranges)
    for (const auto& level : model->levels[id])
      if (!level.spans.empty()) extend(level.spans.front().start_ns, level.spans.back().end_ns);
  for (const auto& [id, rows] : model->kernels)
    for (const auto& level : model->levels[id])
      for (const auto& s : level.spans) extend(s.start_ns, s.end_ns);
  for (const auto& [id, rows] : run.counters)
    if (!rows.empty()) extend(rows.front().t_ns, rows.back().t_ns);
  for (const auto& s : run.steps) extend(s.start_ns, s.end_ns);
  for (const auto& a : run.allreduces) extend(std::min(a.ready_ns, a.start_ns), a.end_ns);
  if (lo > hi) lo = hi = 0;
  model->t_min_ns = lo;
  model->t_max_ns = hi;
  auto it = run.meta.find("device");
  model->device = it != run.meta.end() ? it->second : (run.ranks.empty() ? "" : run.ranks.front().device);
  if (run.config.contains("prefetch") && run.config["prefetch"].is_number_integer())
    model->queue_capacity = run.config["prefetch"].get<int>();
  auto t_open = clock::now();
  model->open_seconds = std::chrono::duration<double>(t_open - t_start).count();
  check_cancel(progress);
  if (on_open) on_open(model);

  stage("step breakdown", 0.8);
  model->breakdown = analysis::step_breakdown(run);
  stage("op statistics", 0.83);
  model->ops = analysis::op_stats(run);
  check_cancel(progress);
  stage("input starvation", 0.9);
  model->starvation = analysis::starvation(run, 8);
  {
    std::vector<const std::vector<store::RangeRow>*> workers;
    for (const auto& t : run.tracks)
      if (t.kind == store::TrackKind::thread && run.name(t.name).rfind("data-worker", 0) == 0) workers.push_back(&run.ranges_of(t.id));
    model->producer_ops = analysis::compute_op_stats(workers, run.strings);
  }
  stage("allreduce overlap", 0.93);
  model->comms = analysis::step_comms(run);
  model->warnings = analysis::run_warnings(run);
  model->stragglers = analysis::find_stragglers(run);
  stage("split model", 0.97);
  try {
    model->split_model = analysis::build_split_model(run);
  } catch (const analysis::AnalysisError& e) {
    model->split_model_error = e.what();
  }
  model->analysis_seconds = std::chrono::duration<double>(clock::now() - t_open).count();
  model->analysed.store(true, std::memory_order_release);
  stage("done", 1.0);
  return model;
}

RunLoader::RunLoader(std::filesystem::path path) : path_(std::move(path)) {
  thread_ = std::thread([this] {
    try {
      auto model = load_run_model(path_, &progress_, [this](std::shared_ptr<const RunModel> m) {
        std::lock_guard lock(mutex_);
        opened_ = std::move(m);
      });
      std::lock_guard lock(mutex_);
      result_ = std::move(model);
    } catch (const Cancelled&) {
      std::lock_guard lock(mutex_);
      error_ = path_.string() + ": loading cancelled";
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      error_ = e.what();
    }
    done_.store(true);
  });
}

RunLoader::~RunLoader() {
  progress_.cancel.store(true);
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const RunModel> RunLoader::opened() const {
  std::lock_guard lock(mutex_);
  return opened_;
}

std::shared_ptr<const RunModel> RunLoader::result() const {
  std::lock_guard lock(mutex_);
  return result_;
}

std::string RunLoader::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

}  // namespace wb::app_model
