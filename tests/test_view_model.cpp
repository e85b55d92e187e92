// Loading a run for the app (synchronously and on the loader thread), bad files, and every view drawn
// headless (an ImGui context without a window) from a synthetic run: draw lists must hold real geometry, and the timeline's cost must follow the
// pixels, not the events.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>

#include <imgui.h>

#include "app/model/precision_model.hpp"
#include "app/model/run_model.hpp"
#include "app/model/synthetic_run.hpp"
#include "app/view/app.hpp"
#include "compare/compare.hpp"
#include "store/db.hpp"
#include "store_test_util.hpp"
#include "test_trainer_util.hpp"
#include "view_test_util.hpp"

using wb::test::Headless;

using namespace wb::app_model;
using namespace wb::view;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

std::shared_ptr<const RunModel> wait_for(RunLoader& loader) {
  for (int i = 0; i < 6000 && !loader.done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(loader.done());
  return loader.result();
}

}  // namespace

TEST_CASE("a run loads into the app's model with its levels and analyses", "[app]") {
  wb::test::TempDir dir;
  SyntheticRun spec;
  spec.ranks = 2;
  spec.steps = 3;
  spec.ranges_per_rank = 600;
  std::int64_t written = write_synthetic_run(dir / "run.sqlite", spec);
  auto m = load_run_model(dir / "run.sqlite");
  REQUIRE(m);
  CHECK(m->range_count == written);
  CHECK(m->run.rank_ids() == std::vector<int>{0, 1});
  CHECK(m->queue_capacity == 4);
  CHECK(m->device == "cpu");
  // Every thread track's levels hold all its ranges, one level per depth.
  std::size_t in_levels = 0;
  for (const auto& [track, levels] : m->levels) {
    for (const auto& l : levels) {
      in_levels += l.spans.size();
      for (std::size_t i = 1; i < l.spans.size(); ++i) CHECK(l.spans[i].start_ns >= l.spans[i - 1].end_ns);  // disjoint
    }
  }
  CHECK(static_cast<std::int64_t>(in_levels) == written);
  std::uint32_t main0 = m->run.main_track(0);
  REQUIRE(m->levels.at(main0).size() == 3);  // step, layers, ops
  // The extent covers all steps.
  for (const auto& s : m->run.steps) {
    CHECK(s.start_ns >= m->t_min_ns);
    CHECK(s.end_ns <= m->t_max_ns);
  }
  CHECK(m->breakdown.size() == 6);
  CHECK_FALSE(m->ops.by_name.empty());
  REQUIRE(m->split_model.has_value());
  CHECK(m->split_model->size() == 16);
  CHECK(m->split_model->current_split == std::vector<int>{8});
  // Durations of one op gather every occurrence over both ranks.
  auto id = m->find_name("step");
  REQUIRE(id.has_value());
  auto d = m->durations(*id, wb::store::Category::step);
  REQUIRE(d.size() == 6);
  CHECK(std::is_sorted(d.begin(), d.end()));
  CHECK_FALSE(m->find_name("no such op").has_value());

  RunLoader loader(dir / "run.sqlite");
  auto async = wait_for(loader);
  REQUIRE(async);
  CHECK(async->range_count == written);
  CHECK_THAT(loader.fraction(), WithinAbs(1.0, 1e-12));
  CHECK(loader.error().empty());
}

TEST_CASE("bad run files are errors naming the file, never crashes", "[app]") {
  wb::test::TempDir dir;
  std::ofstream(dir / "junk.sqlite") << "this is not a database";
  REQUIRE_THROWS_AS(load_run_model(dir / "junk.sqlite"), wb::store::StoreError);
  REQUIRE_THROWS_AS(load_run_model(dir / "missing.sqlite"), wb::store::StoreError);
  // A truncated run: the first 4 KiB of a real one.
  SyntheticRun spec;
  spec.ranks = 1;
  write_synthetic_run(dir / "ok.sqlite", spec);
  {
    std::ifstream in(dir / "ok.sqlite", std::ios::binary);
    std::string head(4096, '\0');
    in.read(head.data(), 4096);
    std::ofstream(dir / "cut.sqlite", std::ios::binary) << head;
  }
  REQUIRE_THROWS_AS(load_run_model(dir / "cut.sqlite"), wb::store::StoreError);
  RunLoader loader(dir / "junk.sqlite");
  CHECK_FALSE(wait_for(loader));
  CHECK(loader.error().find("junk.sqlite") != std::string::npos);
}

TEST_CASE("every view draws headless from a loaded run", "[app]") {
  wb::test::TempDir dir;
  SyntheticRun spec;
  spec.ranks = 2;
  spec.steps = 4;
  spec.ranges_per_rank = 4000;
  write_synthetic_run(dir / "run.sqlite", spec);
  auto model = load_run_model(dir / "run.sqlite");
  Headless ui;
  App::Options opt;
  opt.persist_recent = false;
  App app(opt);
  app.set_model(model);
  CHECK_FALSE(app.busy());
  std::map<ViewId, int> vertices;
  for (ViewId v : kAllViews) {
    CAPTURE(view_name(v));
    app.show_view(v);
    for (int i = 0; i < 3; ++i) vertices[v] = ui.frame(app);
    CHECK(app.current == v);
    CHECK(vertices[v] > 1000);  // text, tables and plots, not an empty window
  }
  CHECK_FALSE(app.error_shown());
  // The split editor started from the run's split and has suggestions to offer.
  CHECK(app.tuner.split == std::vector<int>{8});
  CHECK(app.tuner.suggestions.size() >= 4);
  // The timeline fitted the whole run.
  CHECK(app.timeline.view.t0_ns <= static_cast<double>(model->t_min_ns));
  CHECK(app.timeline.view.t1_ns >= static_cast<double>(model->t_max_ns));
  CHECK(app.timeline.lanes.size() == 8);  // per rank: main, worker, queue, allreduce
}

TEST_CASE("the app shows an error for a bad file and stays usable", "[app]") {
  wb::test::TempDir dir;
  std::ofstream(dir / "junk.sqlite") << "SQLite format 3 but not really";
  Headless ui;
  App::Options opt;
  opt.persist_recent = false;
  opt.run = (dir / "junk.sqlite").string();
  App app(opt);
  for (int i = 0; i < 2000 && app.busy(); ++i) {
    ui.frame(app);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ui.frame(app);
  CHECK(app.error_shown());
  CHECK(app.error().find("junk.sqlite") != std::string::npos);
  CHECK_FALSE(app.model);
  // Opening a good file afterwards works.
  write_synthetic_run(dir / "ok.sqlite", SyntheticRun{});
  app.open(dir / "ok.sqlite");
  for (int i = 0; i < 2000 && app.busy(); ++i) {
    ui.frame(app);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ui.frame(app);
  REQUIRE(app.model);
  CHECK(app.model->run.rank_ids().size() == 2);
}

TEST_CASE("a run opened windowed draws from its summary, then reads each window's rows as they are in the file", "[app]") {
  wb::test::TempDir dir;
  SyntheticRun spec;
  spec.ranks = 2;
  spec.steps = 4;
  spec.ranges_per_rank = 40000;
  const std::int64_t written = write_synthetic_run(dir / "run.sqlite", spec);
  auto full = load_run_model(dir / "run.sqlite", nullptr, {}, OpenMode::full);
  auto m = load_run_model(dir / "run.sqlite", nullptr, {}, OpenMode::windowed);
  REQUIRE(m->windowed());
  CHECK_FALSE(full->windowed());
  // Opened without its rows: the counts and the extent come from the summary, and equal the full open's.
  CHECK(m->range_count == written);
  // The only rows held from the open: the depths held whole (steps, phases, layers: the long, few ranges),
  // as the full open has them.
  std::int64_t held = 0;
  for (const auto& [track, rows] : m->run.ranges) {
    std::vector<std::tuple<std::int64_t, std::int64_t, std::uint32_t, int, int>> got, want;
    for (const auto& r : rows) got.emplace_back(r.start_ns, r.end_ns, r.name, r.depth, r.category);
    for (const auto& r : full->run.ranges_of(track))
      if (m->window->held_whole(track, r.depth)) want.emplace_back(r.start_ns, r.end_ns, r.name, r.depth, r.category);
    CAPTURE(track);
    CHECK(got == want);
    held += static_cast<std::int64_t>(rows.size());
  }
  CHECK(held > 0);
  CHECK(held < written / 20);
  CHECK(m->t_min_ns == full->t_min_ns);
  CHECK(m->t_max_ns == full->t_max_ns);

  Headless ui;
  App::Options opt;
  opt.persist_recent = false;
  opt.view = ViewId::timeline;
  App app(opt);
  app.set_model(m);
  int vertices = 0;
  for (int i = 0; i < 3; ++i) vertices = ui.frame(app);
  CHECK(vertices > 1000);  // the summary's buckets, not an empty lane
  CHECK(app.timeline.lanes.size() == 8);  // as the full open: per rank main, worker, queue, allreduce

  // Zoom to a window of a few thousand ranges: its rows are read in the background and swapped in.
  const double mid = 0.5 * static_cast<double>(m->t_min_ns + m->t_max_ns);
  const double span = static_cast<double>(m->t_max_ns - m->t_min_ns) / 40.0;
  app.timeline.view.t0_ns = mid - span / 2;
  app.timeline.view.t1_ns = mid + span / 2;
  ui.frame(app);
  const auto& v = app.timeline.view;
  for (int i = 0; i < 3000 && !app.model->window->shows(v.t0_ns, v.t1_ns, v.width_px); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ui.frame(app);
  }
  ui.frame(app);
  REQUIRE(app.model->window->shows(v.t0_ns, v.t1_ns, v.width_px));
  const RunModel& slice = *app.model;
  REQUIRE(slice.windowed());
  CHECK(static_cast<double>(slice.rows_t0_ns) <= v.t0_ns);
  CHECK(static_cast<double>(slice.rows_t1_ns) >= v.t1_ns);
  // Every range of the full open that overlaps the rows' window is in the slice, and nothing else is
  // but the depths held whole.
  std::int64_t expected = 0;
  for (const auto& [track, rows] : full->run.ranges) {
    std::vector<wb::store::RangeRow> want, got;
    auto in_window = [&](const wb::store::RangeRow& r) { return r.end_ns >= slice.rows_t0_ns && r.start_ns <= slice.rows_t1_ns; };
    for (const auto& r : rows)
      if (in_window(r)) want.push_back(r);
    for (const auto& r : slice.run.ranges_of(track)) {
      if (in_window(r)) got.push_back(r);
      else CHECK(m->window->held_whole(track, r.depth));
    }
    expected += static_cast<std::int64_t>(want.size());
    CAPTURE(track);
    CHECK(got == want);
  }
  CHECK(expected > 1000);
  CHECK(slice.range_count == written);  // the run's count, not the window's
  CHECK(app.timeline.lanes.size() == 8);
  // The window's model shares the run's step, collective and counter rows with the model read at open
  // (none copied per window), and they are the full open's.
  CHECK(slice.run.steps.empty());
  CHECK(slice.run.allreduces.empty());
  CHECK(slice.run.counters.empty());
  CHECK(&slice.steps() == &m->steps());
  CHECK(&slice.allreduces() == &m->allreduces());
  CHECK(&slice.counters() == &m->counters());
  auto step_keys = [](const RunModel& model) {
    std::vector<std::tuple<int, int, std::int64_t, std::int64_t>> keys;
    for (const auto& st : model.steps()) keys.emplace_back(st.rank, st.step, st.start_ns, st.end_ns);
    return keys;
  };
  CHECK(step_keys(slice) == step_keys(*full));
  CHECK_FALSE(full->steps().empty());
  CHECK(slice.allreduces().size() == full->allreduces().size());
  CHECK_FALSE(full->allreduces().empty());
  REQUIRE(slice.counters().size() == full->counters().size());
  for (const auto& [track, rows] : full->counters()) {
    CAPTURE(track);
    REQUIRE(slice.counters().count(track));
    CHECK(slice.counters().at(track).size() == rows.size());
  }

  // The views that need every step draw a sample of steps (or a note until it is read), with no error.
  app.show_view(ViewId::ops);
  for (int i = 0; i < 2; ++i) ui.frame(app);
  CHECK_FALSE(app.error_shown());
}

TEST_CASE("a run opened windowed analyses consecutive steps, with the figures a full open gives those steps", "[app]") {
  wb::test::TempDir dir;
  SyntheticRun spec;
  spec.ranks = 2;
  spec.steps = 24;
  spec.ranges_per_rank = 48000;  // 2,000 ranges a step and rank
  write_synthetic_run(dir / "run.sqlite", spec);
  auto full = load_run_model(dir / "run.sqlite", nullptr, {}, OpenMode::full);
  // A budget of about 6 steps' rows (the summary's estimate is an upper bound: fewer may fit).
  auto m = load_run_model(dir / "run.sqlite", nullptr, {}, OpenMode::windowed, 6 * 2 * 2000);
  REQUIRE(m->windowed());
  auto sample = m->window->sample();
  INFO(m->window->sample_status());
  REQUIRE(sample);
  REQUIRE(sample->sample);
  const auto& s = *sample->sample;
  CHECK_FALSE(sample->windowed());
  CHECK(s.run_steps == 24);
  CHECK(s.steps >= 3);
  CHECK(s.steps <= 6);
  CHECK(s.last_step - s.first_step + 1 == s.steps);
  CHECK(s.first_step <= 12);  // from the middle of the run
  CHECK(s.last_step >= 12);
  CHECK(s.run_rows == full->range_count + full->kernel_count);
  // The rows read are those of the sampled steps: every rank's ranges of those steps, and nothing else.
  std::int64_t in_steps = 0;
  for (const auto& [track, rows] : full->run.ranges)
    for (const auto& r : rows) in_steps += r.step >= s.first_step && r.step <= s.last_step;
  CHECK(s.rows == in_steps);

  // The independent reality: the full open's analyses of every row, for the same steps.
  auto key = [](const wb::analysis::StepBreakdown& b) {
    return std::tuple{b.rank, b.step, b.start_ns, b.total_ns, b.compute_ns, b.data_wait_ns, b.h2d_ns, b.comm_exposed_ns,
                      b.other_ns};
  };
  std::vector<decltype(key(full->breakdown.front()))> want, got;
  for (const auto& b : full->breakdown)
    if (b.step >= s.first_step && b.step <= s.last_step) want.push_back(key(b));
  for (const auto& b : sample->breakdown) got.push_back(key(b));
  CHECK(got.size() == static_cast<std::size_t>(2 * s.steps));
  CHECK(got == want);
  REQUIRE(sample->straggle.steps.size() == static_cast<std::size_t>(s.steps));
  for (const auto& st : sample->straggle.steps) {
    auto it = std::find_if(full->straggle.steps.begin(), full->straggle.steps.end(),
                           [&](const auto& f) { return f.step == st.step; });
    REQUIRE(it != full->straggle.steps.end());
    CHECK(st.last_rank == it->last_rank);
    CHECK(st.lag_ns == it->lag_ns);
    CHECK(st.wait_ns == it->wait_ns);
  }
  // Each op ran as often per sampled step as in the whole run's steps.
  REQUIRE(sample->ops.by_name.size() == full->ops.by_name.size());
  for (const auto& op : sample->ops.by_name) {
    auto it = std::find_if(full->ops.by_name.begin(), full->ops.by_name.end(),
                           [&](const auto& f) { return f.name == op.name && f.category == op.category; });
    REQUIRE(it != full->ops.by_name.end());
    CHECK(op.count * 24 == it->count * s.steps);
  }

  // Every analysis view draws the sample, under a line naming its steps; none shows an error.
  Headless ui;
  App::Options opt;
  opt.persist_recent = false;
  App app(opt);
  app.set_model(m);
  std::map<ViewId, int> drawn;
  for (ViewId v : {ViewId::overview, ViewId::ops, ViewId::queue, ViewId::allreduce, ViewId::memory}) {
    app.show_view(v);
    for (int i = 0; i < 3; ++i) drawn[v] = ui.frame(app);
    CHECK_FALSE(app.error_shown());
  }
  CHECK(app.model == m);  // the run's model again after each view

  // The Timeline outlines a sampled step's critical path, pinned as --path-step pins it, and zooms to it:
  // the full open's path of that step, segment by segment.
  const int pinned = (s.first_step + s.last_step) / 2;
  const auto* want_path = wb::app_model::path_step_at(full->critical, pinned, 0.0);
  const auto* got_path = wb::app_model::path_step_at(sample->critical, pinned, 0.0);
  REQUIRE(want_path != nullptr);
  REQUIRE(got_path != nullptr);
  auto segments = [](const wb::analysis::StepPath& p) {
    std::vector<std::tuple<int, std::string, std::int64_t, std::int64_t>> out;
    for (const auto& seg : p.segments) out.emplace_back(seg.rank, seg.name, seg.start_ns, seg.end_ns);
    return out;
  };
  CHECK(segments(*got_path) == segments(*want_path));
  app.show_view(ViewId::timeline);
  app.timeline.path_step = pinned;
  app.timeline.path_zoomed = false;
  for (int i = 0; i < 3; ++i) ui.frame(app);
  CHECK(app.timeline.path_shown == pinned);
  CHECK(app.timeline.view.t0_ns <= static_cast<double>(want_path->start_ns));
  CHECK(app.timeline.view.t1_ns >= static_cast<double>(want_path->end_ns));
  CHECK(app.timeline.view.span_ns() < 1.2 * static_cast<double>(want_path->end_ns - want_path->start_ns));

  // A budget no step fits: no analyses, and the views say why, in a few lines of text.
  auto tight = load_run_model(dir / "run.sqlite", nullptr, {}, OpenMode::windowed, 100);
  CHECK_FALSE(tight->window->sample());
  CHECK_THAT(tight->window->sample_status(), Catch::Matchers::Contains("more than these views read at once"));
  app.set_model(tight);
  for (auto [v, vertices] : drawn) {
    if (v == ViewId::memory) continue;  // the synthetic run records no memory events: a line says so
    app.show_view(v);
    int note = 0;
    for (int i = 0; i < 3; ++i) note = ui.frame(app);
    CAPTURE(static_cast<int>(v), vertices, note);
    CHECK(vertices > 2 * note);  // the sample's figures, not the note
  }
}

TEST_CASE("a wb-train run opened windowed: the sample's step and memory figures are the full open's", "[app]") {
  wb::test::TempDir dir;
  const auto run = dir / "run.sqlite";
  const auto r = wb::test::run_train({"--data", "synthetic", "--synthetic-samples", "64", "--batch-size", "2",
                                      "--image-size", "32", "--steps", "9", "--threads", "1", "--seed", "3", "--run",
                                      run.string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  auto full = load_run_model(run, nullptr, {}, OpenMode::full);
  REQUIRE(full->memory.recorded);
  // A budget of about two steps' rows: the sample holds a few steps from the middle.
  const std::int64_t per_step = full->range_count / 9;
  auto m = load_run_model(run, nullptr, {}, OpenMode::windowed, 3 * per_step);
  auto sample = m->window->sample();
  INFO(m->window->sample_status());
  REQUIRE(sample);
  const auto& s = *sample->sample;
  CHECK(s.steps >= 1);
  CHECK(s.steps <= 3);
  CHECK(s.first_step <= 4);
  CHECK(s.last_step >= 4);

  std::map<int, const wb::analysis::StepBreakdown*> want_steps;
  for (const auto& b : full->breakdown) want_steps[b.step] = &b;
  REQUIRE(sample->breakdown.size() == static_cast<std::size_t>(s.steps));
  for (const auto& b : sample->breakdown) {
    const auto& w = *want_steps.at(b.step);
    CAPTURE(b.step);
    CHECK(b.total_ns == w.total_ns);
    CHECK(b.compute_ns == w.compute_ns);
    CHECK(b.data_wait_ns == w.data_wait_ns);
    CHECK(b.other_ns == w.other_ns);
  }
  // Memory: each sampled step's start, peak, when and by which op, what it allocated and freed, and what
  // holds the peak, as the full open has them from every event of the run (the sample reads what each
  // rank held before its window: without it, every step began at 0 bytes).
  REQUIRE(sample->memory.recorded);
  REQUIRE(sample->memory.steps.size() == static_cast<std::size_t>(s.steps));
  for (const auto& got : sample->memory.steps) {
    auto it = std::find_if(full->memory.steps.begin(), full->memory.steps.end(),
                           [&](const auto& w) { return w.rank == got.rank && w.step == got.step; });
    REQUIRE(it != full->memory.steps.end());
    CAPTURE(got.step);
    CHECK(got.start_bytes == it->start_bytes);
    CHECK(got.peak_bytes == it->peak_bytes);
    CHECK(got.peak_ns == it->peak_ns);
    CHECK(got.peak_op == it->peak_op);
    CHECK(got.allocated_bytes == it->allocated_bytes);
    CHECK(got.freed_bytes == it->freed_bytes);
    CHECK(got.by_role == it->by_role);
    CHECK(got.peak_op_step == it->peak_op_step);
    REQUIRE(got.holders.size() == it->holders.size());
    for (std::size_t k = 0; k < got.holders.size(); ++k) {
      CHECK(got.holders[k].name == it->holders[k].name);
      CHECK(got.holders[k].by_role == it->holders[k].by_role);
    }
  }
}
