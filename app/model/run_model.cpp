#include "app/model/run_model.hpp"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "store/reader.hpp"
#include "store/summary.hpp"

namespace wb::app_model {

void tune_allocator_for_viewer() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

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

std::shared_ptr<RunModel> copy_without_rows(const std::shared_ptr<const RunModel>& shared) {
  const RunModel& from = *shared;
  auto m = std::make_shared<RunModel>();
  m->tables = from.tables ? from.tables : shared;
  const auto& r = from.run;
  auto& run = m->run;
  run.path = r.path;
  run.meta = r.meta;
  run.config = r.config;
  run.strings = r.strings;
  run.ranks = r.ranks;
  run.tracks = r.tracks;
  run.params = r.params;
  run.evaluations = r.evaluations;
  run.capture_windows = r.capture_windows;
  run.calibration = r.calibration;
  run.split_trials = r.split_trials;
  run.pipeline_spans = r.pipeline_spans;
  run.pipeline_steps = r.pipeline_steps;
  m->t_min_ns = from.t_min_ns;
  m->t_max_ns = from.t_max_ns;
  m->range_count = from.range_count;
  m->kernel_count = from.kernel_count;
  m->counter_count = from.counter_count;
  m->device = from.device;
  m->queue_capacity = from.queue_capacity;
  m->pipeline_plan = from.pipeline_plan;
  m->comparisons = from.comparisons;
  m->main_tracks = from.main_tracks;
  m->open_seconds = from.open_seconds;
  m->analysed.store(from.analysed.load());
  return m;
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

void check_cancel(const LoadProgress* p, const std::filesystem::path& path) {
  if (p && p->cancel.load()) throw analysis::LoadCancelled(path.string() + ": loading cancelled");
}

// Tells the progress (if any) what the load is doing and how far along it is.
void set_stage(LoadProgress* progress, const char* text, double fraction) {
  if (!progress) return;
  progress->set_stage(text);
  progress->fraction.store(fraction);
}

// Reads the run's rows, the comparisons and the row counts; the rows are ~70 % of the open.
void read_rows(store::Reader& reader, RunModel& model, LoadProgress* progress, unsigned threads) {
  analysis::LoadOptions options;
  options.threads = threads;
  if (progress) {
    options.progress = [progress](std::int64_t done, std::int64_t total) {
      progress->fraction.store(0.7 * static_cast<double>(done) / static_cast<double>(std::max<std::int64_t>(total, 1)));
    };
    options.cancel = &progress->cancel;
  }
  auto& run = model.run;
  run = analysis::load_run(reader, options);
  model.comparisons = reader.comparisons();
  for (const auto& [id, rows] : run.ranges) model.range_count += static_cast<std::int64_t>(rows.size());
  for (const auto& [id, rows] : run.kernels) model.kernel_count += static_cast<std::int64_t>(rows.size());
  for (const auto& [id, rows] : run.counters) model.counter_count += static_cast<std::int64_t>(rows.size());
}

// The timeline levels of every thread and stream track, on as many threads; throws LoadCancelled when
// the load is cancelled meanwhile.
void build_all_levels(RunModel& model, LoadProgress* progress, unsigned threads, const std::filesystem::path& path) {
  const auto& run = model.run;
  std::vector<std::uint32_t> tracks;
  for (const auto& [id, rows] : run.ranges) tracks.push_back(id);
  for (const auto& [id, rows] : run.kernels) tracks.push_back(id);
  std::vector<std::vector<Level>> levels(tracks.size());
  std::atomic<std::size_t> next{0};
  auto build = [&] {
    for (std::size_t i = next++; i < tracks.size(); i = next++) {
      if (progress && progress->cancel.load()) return;
      auto r = run.ranges.find(tracks[i]);
      levels[i] = r != run.ranges.end() ? build_levels(r->second) : build_levels(run.kernels.at(tracks[i]));
    }
  };
  {
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < threads && k < tracks.size(); ++k) pool.emplace_back(build);
    build();
    for (auto& th : pool) th.join();
  }
  check_cancel(progress, path);
  for (std::size_t i = 0; i < tracks.size(); ++i) model.levels[tracks[i]] = std::move(levels[i]);
}

// The time the timeline spans: every range level, kernel, counter, step and allreduce (0..0 when the
// run has none).
void find_time_extent(RunModel& model) {
  const auto& run = model.run;
  std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = std::numeric_limits<std::int64_t>::min();
  auto extend = [&](std::int64_t a, std::int64_t b) {
    lo = std::min(lo, a);
    hi = std::max(hi, b);
  };
  for (const auto& [id, rows] : run.ranges)
    for (const auto& level : model.levels[id])
      if (!level.spans.empty()) extend(level.spans.front().start_ns, level.spans.back().end_ns);
  for (const auto& [id, rows] : run.kernels)
    for (const auto& level : model.levels[id])
      for (const auto& s : level.spans) extend(s.start_ns, s.end_ns);
  for (const auto& [id, rows] : run.counters)
    if (!rows.empty()) extend(rows.front().t_ns, rows.back().t_ns);
  for (const auto& s : run.steps) extend(s.start_ns, s.end_ns);
  for (const auto& a : run.allreduces) extend(std::min(a.ready_ns, a.start_ns), a.end_ns);
  if (lo > hi) lo = hi = 0;
  model.t_min_ns = lo;
  model.t_max_ns = hi;
}

// The analyses the views show once the run is open, each announced as a stage.
void analyze_run(RunModel& model, LoadProgress* progress, const std::filesystem::path& path) {
  const auto& run = model.run;
  set_stage(progress, "step breakdown", 0.8);
  model.breakdown = analysis::step_breakdown(run);
  set_stage(progress, "op statistics", 0.83);
  model.ops = analysis::op_stats(run);
  check_cancel(progress, path);
  set_stage(progress, "input starvation", 0.9);
  model.starvation = analysis::starvation(run, 8);
  {
    std::vector<const std::vector<store::RangeRow>*> workers;
    for (const auto& t : run.tracks)
      if (t.kind == store::TrackKind::thread && run.name(t.name).rfind("data-worker", 0) == 0) workers.push_back(&run.ranges_of(t.id));
    model.producer_ops = analysis::compute_op_stats(workers, run.strings);
  }
  set_stage(progress, "allreduce overlap", 0.93);
  model.comms = analysis::step_comms(run);
  model.warnings = analysis::run_warnings(run);
  model.stragglers = analysis::find_stragglers(run);
  model.straggle = analysis::analyze_stragglers(run);
  model.memory = analysis::analyze_memory(run);
  if (run.kernel_rows > 0) {
    model.tb = analysis::tb_overview(run);
    model.hta = analysis::hta_analyses(run);
  }
  set_stage(progress, "critical path", 0.95);
  model.critical = analysis::critical_path(run);
  for (int r : run.rank_ids()) model.main_tracks[r] = run.main_track(r);
  check_cancel(progress, path);
  set_stage(progress, "split model", 0.97);
  try {
    model.split_model = analysis::build_split_model(run);
  } catch (const analysis::AnalysisError& e) {
    model.split_model_error = e.what();
  }
  try {
    model.pipeline = analysis::analyze_pipeline(run);
  } catch (const analysis::AnalysisError&) {
    model.pipeline.reset();  // a malformed plan: the run shows without its pipeline figures
  }
}

// Whether the run opens windowed; builds and saves the summary a windowed open needs when the file lacks
// it (then the summarised row count decides). A file that cannot take the summary opens in full.
bool decide_windowed(const std::filesystem::path& path, LoadProgress* progress, OpenMode mode) {
  if (mode == OpenMode::full) return false;
  std::int64_t rows = 0;
  bool has = false;
  {
    store::Reader reader(path);
    has = store::has_summary(reader.db());
    if (has)
      for (const auto& t : store::summary_tracks(reader.db())) rows += t.rows;
    if (!has && reader.meta()["schema_version"] != std::to_string(store::kSchemaVersion)) {
      if (mode == OpenMode::windowed)
        std::fprintf(stderr, "wb-view: %s: a file of an older schema opens in full (wb merge or a new recording writes the current one)\n",
                     path.c_str());
      return false;
    }
  }
  if (!has) {
    if (mode == OpenMode::automatic && std::filesystem::file_size(path) < 256u << 20) return false;  // a small file: in full
    set_stage(progress, "summarising the timeline (once; saved in the file)", 0.0);
    try {
      store::Db db(path, store::OpenMode::read_write);
      store::ProgressFn on_track;
      if (progress)
        on_track = [progress](std::uint64_t done, std::uint64_t total) {
          progress->fraction.store(0.9 * static_cast<double>(done) / static_cast<double>(std::max<std::uint64_t>(total, 1)));
        };
      if (!store::build_summary(db, on_track, progress ? &progress->cancel : nullptr)) check_cancel(progress, path);
      for (const auto& t : store::summary_tracks(db)) rows += t.rows;
    } catch (const store::StoreError& e) {
      std::fprintf(stderr, "wb-view: %s: the timeline summary could not be saved, opening every row: %s\n", path.c_str(), e.what());
      return false;
    }
  }
  return mode == OpenMode::windowed || rows > kWindowedEvents;
}

// A windowed open's analyses read the rows of consecutive steps from the middle of the run (past the first
// steps' warm-up): as many as fit `budget` (kSampleRows) by the summary's estimate, at most kSampleSteps,
// so that memory stays bounded whatever the run's length. A step that alone holds more than four times the
// budget is not read.
constexpr std::size_t kSampleSteps = 64;

// A step's time on each rank that recorded it.
struct StepSpan {
  int step = 0;
  TimelineWindow::RankSpans ranks;
};

// The steps a sample may take, by step: in a triggered capture's file, only those of its windows (the
// others have no rows).
std::vector<StepSpan> sample_candidates(const analysis::RunData& run) {
  auto captured = [&](const store::StepRow& s) {
    if (run.capture_windows.empty()) return true;
    return std::any_of(run.capture_windows.begin(), run.capture_windows.end(), [&](const store::CaptureWindowRow& w) {
      return w.rank == s.rank && s.step >= w.first_step && s.step <= w.last_step;
    });
  };
  std::map<int, StepSpan> by_step;
  for (const auto& s : run.steps) {
    if (s.step < 0 || !captured(s)) continue;
    StepSpan& span = by_step[s.step];
    span.step = s.step;
    auto [it, fresh] = span.ranks.try_emplace(s.rank, s.start_ns, s.end_ns);
    if (fresh) continue;
    it->second = {std::min(it->second.first, s.start_ns), std::max(it->second.second, s.end_ns)};
  }
  std::vector<StepSpan> out;
  for (auto& [step, span] : by_step) out.push_back(std::move(span));
  return out;
}

// Each rank's time over steps[a..b].
TimelineWindow::RankSpans spans_of(const std::vector<StepSpan>& steps, std::size_t a, std::size_t b) {
  TimelineWindow::RankSpans out;
  for (std::size_t i = a; i <= b; ++i)
    for (const auto& [rank, span] : steps[i].ranks) {
      auto [it, fresh] = out.try_emplace(rank, span);
      if (!fresh) it->second = {std::min(it->second.first, span.first), std::max(it->second.second, span.second)};
    }
  return out;
}

// Indices [first, last] into `steps` of the sample, or nullopt with the reason in `why`.
std::optional<std::pair<std::size_t, std::size_t>> pick_sample(const std::vector<StepSpan>& steps,
                                                               const TimelineWindow& window, std::int64_t budget,
                                                               std::string& why) {
  if (steps.empty()) {
    why = "the run records no steps";
    return std::nullopt;
  }
  auto rows = [&](std::size_t a, std::size_t b) { return window.estimate_rows(spans_of(steps, a, b)); };
  std::size_t a = steps.size() / 2, b = a;
  if (const std::int64_t one = rows(a, b); one > 4 * budget) {
    why = "step " + std::to_string(steps[a].step) + " alone holds about " + std::to_string(one / 1'000'000) +
          "M ranges and kernels, more than these views read at once";
    return std::nullopt;
  }
  for (bool right = true; b - a + 1 < kSampleSteps; right = !right) {
    const bool can_right = b + 1 < steps.size(), can_left = a > 0;
    if (!can_right && !can_left) break;
    std::size_t na = a, nb = b;
    if ((right && can_right) || !can_left) ++nb;
    else --na;
    if (rows(na, nb) > budget) break;
    a = na;
    b = nb;
  }
  return std::make_pair(a, b);
}

template <class Row, class Keep>
void keep_only(std::vector<Row>& rows, Keep keep) {
  rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const Row& r) { return !keep(r); }), rows.end());
}

// The model of a sample's rows: each rank's from the start of its step `first` to the end of its step
// `last` (ranks drift apart: one window for all would hold other steps of the ranks ahead); every table
// cut to them.
std::shared_ptr<RunModel> read_sample(const std::filesystem::path& path, const TimelineWindow& window, int first,
                                      int last, const TimelineWindow::RankSpans& span) {
  store::Reader reader(path);
  auto m = window.read_window(reader, span);
  auto& run = m->run;
  auto in_steps = [&](const auto& r) { return r.step >= first && r.step <= last; };
  // The sample is analysed as a run of its own: its own copies of the shared tables' rows it covers.
  const RunModel& tables = *m->tables;  // read_window's models share the lean model's
  std::copy_if(tables.run.steps.begin(), tables.run.steps.end(), std::back_inserter(run.steps), in_steps);
  std::copy_if(tables.run.allreduces.begin(), tables.run.allreduces.end(), std::back_inserter(run.allreduces),
               in_steps);
  keep_only(run.pipeline_spans, in_steps);
  keep_only(run.pipeline_steps, in_steps);
  keep_only(run.pipeline_spans, in_steps);
  keep_only(run.pipeline_steps, in_steps);
  auto within = [&](int rank, std::int64_t start, std::int64_t end) {
    auto it = span.find(rank);
    return it != span.end() && end >= it->second.first && start <= it->second.second;
  };
  auto rank_of = [&](std::uint32_t track) {
    const auto* t = run.track(track);
    return t ? t->rank : -1;
  };
  m->range_count = m->kernel_count = m->counter_count = 0;  // the sample's, not the run's
  for (auto& [track, rows] : run.ranges) {
    const int rank = rank_of(track);
    keep_only(rows, [&](const store::RangeRow& r) { return within(rank, r.start_ns, r.end_ns); });
    m->range_count += static_cast<std::int64_t>(rows.size());
  }
  for (auto& [track, rows] : run.kernels) {
    const int rank = rank_of(track);
    keep_only(rows, [&](const store::KernelRow& k) { return within(rank, k.start_ns, k.end_ns); });
    m->kernel_count += static_cast<std::int64_t>(rows.size());
  }
  run.kernel_rows = m->kernel_count;
  for (const auto& [track, from] : tables.run.counters) {
    const int rank = rank_of(track);
    auto& rows = run.counters[track];
    std::copy_if(from.begin(), from.end(), std::back_inserter(rows),
                 [&](const store::CounterRow& c) { return within(rank, c.t_ns, c.t_ns); });
    m->counter_count += static_cast<std::int64_t>(rows.size());
  }
  m->tables.reset();
  // Memory: what each rank held when its window began (so that a step's start, and what holds its peak,
  // are those of the whole run), then its events in the window.
  std::map<int, std::int64_t> starts;
  for (const auto& [rank, t] : span) starts[rank] = t.first;
  run.memory = reader.memory_before(starts);
  auto events = reader.memory_between(span);
  run.memory.insert(run.memory.end(), events.begin(), events.end());
  std::stable_sort(run.memory.begin(), run.memory.end(), [](const store::MemoryRow& a, const store::MemoryRow& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.t_ns < b.t_ns;
  });
  m->t_min_ns = std::numeric_limits<std::int64_t>::max();
  m->t_max_ns = std::numeric_limits<std::int64_t>::min();
  for (const auto& [rank, t] : span) {
    m->t_min_ns = std::min(m->t_min_ns, t.first);
    m->t_max_ns = std::max(m->t_max_ns, t.second);
  }
  return m;
}

// The windowed run's analyses over a sample of its steps, handed to the window (TimelineWindow::sample).
// A failure leaves the views without them, saying why; the Timeline is unaffected.
void analyse_sample(const std::filesystem::path& path, const RunModel& lean, TimelineWindow& window,
                    std::int64_t budget) {
  const auto t_start = std::chrono::steady_clock::now();
  try {
    const std::vector<StepSpan> steps = sample_candidates(lean.run);
    std::string why;
    const auto pick = pick_sample(steps, window, budget, why);
    if (!pick) {
      window.set_sample(nullptr, "no analyses: " + why);
      return;
    }
    const auto [a, b] = *pick;
    const std::string span = std::to_string(steps[a].step) + "-" + std::to_string(steps[b].step);
    window.set_sample(nullptr, "analysing steps " + span + " ...");
    auto m = read_sample(path, window, steps[a].step, steps[b].step, spans_of(steps, a, b));
    RunModel::Sample s;
    s.first_step = steps[a].step;
    s.last_step = steps[b].step;
    s.steps = static_cast<int>(b - a + 1);
    s.run_steps = static_cast<int>(steps.size());
    s.rows = m->range_count + m->kernel_count;
    s.run_rows = lean.range_count + lean.kernel_count;
    analyze_run(*m, nullptr, path);
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    m->analysis_seconds = s.seconds;
    m->sample = s;
    m->analysed.store(true, std::memory_order_release);
    window.set_sample(std::move(m), "");
  } catch (const std::exception& e) {
    window.set_sample(nullptr, std::string("no analyses: reading the sample of steps failed: ") + e.what());
  }
}

// A windowed open: every table but the events, and the summary's coarse levels; the analyses over a sample
// of the steps after that.
std::shared_ptr<const RunModel> open_windowed(const std::filesystem::path& path, LoadProgress* progress,
                                              const std::function<void(std::shared_ptr<const RunModel>)>& on_open,
                                              std::chrono::steady_clock::time_point t_start, std::int64_t sample_rows) {
  set_stage(progress, "reading the run without its events", 0.9);
  auto lean = std::make_shared<RunModel>();
  {
    store::Reader reader(path);
    analysis::LoadOptions options;
    options.events = false;
    lean->run = analysis::load_run(reader, options);
    lean->comparisons = reader.comparisons();
  }
  auto& run = lean->run;
  for (const auto& [id, rows] : run.counters) lean->counter_count += static_cast<std::int64_t>(rows.size());
  set_stage(progress, "reading the timeline summary", 0.95);
  auto window = std::make_shared<TimelineWindow>(path, lean);
  for (const auto& t : window->tracks()) {
    const auto* track = run.track(t.track);
    (track && track->kind == store::TrackKind::stream ? lean->kernel_count : lean->range_count) += t.rows;
  }
  auto [lo, hi] = window->extent();
  for (const auto& st : run.steps) lo = std::min(lo, st.start_ns), hi = std::max(hi, st.end_ns);
  for (const auto& [id, rows] : run.counters)
    if (!rows.empty()) lo = std::min(lo, rows.front().t_ns), hi = std::max(hi, rows.back().t_ns);
  for (const auto& a : run.allreduces) lo = std::min({lo, a.ready_ns, a.start_ns}), hi = std::max(hi, a.end_ns);
  if (lo > hi) lo = hi = 0;
  lean->t_min_ns = lo;
  lean->t_max_ns = hi;
  auto it = run.meta.find("device");
  lean->device = it != run.meta.end() ? it->second : (run.ranks.empty() ? "" : run.ranks.front().device);
  if (run.config.contains("prefetch") && run.config["prefetch"].is_number_integer())
    lean->queue_capacity = run.config["prefetch"].get<int>();
  try {
    lean->pipeline_plan = analysis::pipeline_plan(run);
  } catch (const analysis::AnalysisError&) {
    lean->pipeline_plan.reset();
  }
  for (int r : run.rank_ids()) lean->main_tracks[r] = run.main_track(r);
  lean->open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  lean->analysed.store(true);
  auto model = copy_without_rows(lean);
  model->window = window;
  for (const auto& t : run.tracks)  // the depths held whole draw their rows from the first frame
    if (const auto& held = window->held(t.id); !held.empty()) {
      model->run.ranges[t.id] = held;
      model->levels[t.id] = build_levels(held);
    }
  if (on_open) on_open(model);
  set_stage(progress, "analysing a sample of steps", 0.97);
  analyse_sample(path, *lean, *window, sample_rows);
  set_stage(progress, "done", 1.0);
  return model;
}

}  // namespace

std::shared_ptr<const RunModel> load_run_model(const std::filesystem::path& path, LoadProgress* progress,
                                               const std::function<void(std::shared_ptr<const RunModel>)>& on_open,
                                               OpenMode mode, std::int64_t sample_rows) {
  using clock = std::chrono::steady_clock;
  auto t_start = clock::now();
  set_stage(progress, "opening", 0.0);
  if (decide_windowed(path, progress, mode)) {
    return open_windowed(path, progress, on_open, t_start, sample_rows);
  }
  auto model = std::make_shared<RunModel>();
  auto& run = model->run;

  store::Reader reader(path);
  // Reading rows is ~70 % of the open: analysis::load_run reads the host and device tracks on a few
  // threads, each with its own connection.
  set_stage(progress, "reading host ranges", 0.0);
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  read_rows(reader, *model, progress, threads);
  check_cancel(progress, path);

  set_stage(progress, "building timeline levels", 0.7);
  build_all_levels(*model, progress, threads, path);

  set_stage(progress, "indexing the timeline", 0.75);
  find_time_extent(*model);
  auto it = run.meta.find("device");
  model->device = it != run.meta.end() ? it->second : (run.ranks.empty() ? "" : run.ranks.front().device);
  if (run.config.contains("prefetch") && run.config["prefetch"].is_number_integer())
    model->queue_capacity = run.config["prefetch"].get<int>();
  auto t_open = clock::now();
  try {
    model->pipeline_plan = analysis::pipeline_plan(model->run);
  } catch (const analysis::AnalysisError&) {
    model->pipeline_plan.reset();
  }
  model->open_seconds = std::chrono::duration<double>(t_open - t_start).count();
  check_cancel(progress, path);
  if (on_open) on_open(model);

  analyze_run(*model, progress, path);
  model->analysis_seconds = std::chrono::duration<double>(clock::now() - t_open).count();
  model->analysed.store(true, std::memory_order_release);
  set_stage(progress, "done", 1.0);
  return model;
}

RunLoader::RunLoader(std::filesystem::path path, OpenMode mode) : path_(std::move(path)) {
  thread_ = std::thread([this, mode] {
    try {
      auto model = load_run_model(path_, &progress_, [this](std::shared_ptr<const RunModel> m) {
        std::lock_guard lock(mutex_);
        opened_ = std::move(m);
      }, mode);
      std::lock_guard lock(mutex_);
      result_ = std::move(model);
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
