// The arithmetic and data paths behind the app's second-run, stored-comparison and tuner workflows,
// in-process: aligning a second run's timeline by step start, per-op deltas against a second run, a
// comparison saved into a run file and read back without the reference (rows, metrics, verdicts and
// first divergence equal to the computed ones), locating wb-train, and a split handle dragged by
// mouse input injected through ImGui's IO into the tuner's real widget (headless, synthetic run).
#include <catch2/catch.hpp>

#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include <imgui.h>

#include "app/model/child_process.hpp"
#include "app/model/layer_timing.hpp"
#include "app/model/ops_logic.hpp"
#include "app/model/synthetic_run.hpp"
#include "app/model/timeline_logic.hpp"
#include "app/view/app.hpp"
#include "compare/report.hpp"
#include "compare/stored_comparison.hpp"
#include "profiler/analysis/split_model.hpp"
#include "store/db.hpp"
#include "store_test_util.hpp"
#include "view_test_util.hpp"

using wb::test::Headless;

using namespace wb::app_model;
using namespace wb::view;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

wb::store::StepRow step_row(int rank, int step, std::int64_t start, std::int64_t end) {
  wb::store::StepRow s;
  s.rank = rank;
  s.step = step;
  s.start_ns = start;
  s.end_ns = end;
  return s;
}

wb::analysis::OpStat op(const std::string& name, wb::store::Category cat, std::int64_t count, std::int64_t total) {
  wb::analysis::OpStat o;
  o.name = name;
  o.category = cat;
  o.count = count;
  o.total_ns = total;
  o.mean_ns = static_cast<double>(total) / static_cast<double>(count);
  return o;
}

wb::store::HostTensor f32(const std::string& name, std::vector<std::int64_t> shape, const std::vector<float>& values) {
  wb::store::HostTensor t;
  t.name = name;
  t.dtype = wb::store::DType::F32;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(float));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

// A small step dump: input, two activations, the loss and a gradient, as a dumper names them.
wb::compare::TensorSet dump(const std::string& source, float act2_error) {
  wb::compare::TensorSet s;
  s.source = source;
  std::vector<float> input(2 * 3 * 4 * 4), act1(2 * 4 * 4 * 4), act2(2 * 4 * 2 * 2), grad(4 * 3 * 3 * 3);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < act1.size(); ++i) act1[i] = std::cos(0.11f * static_cast<float>(i)) + 0.5f;
  for (std::size_t i = 0; i < act2.size(); ++i) act2[i] = 1.0f + 0.01f * static_cast<float>(i);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = 0.001f * static_cast<float>(i % 7) - 0.003f;
  // A planted local fault: act.layer1 departs from the reference by act2_error (relative) in element 5.
  act2[5] *= 1.0f + act2_error;
  s.tensors.push_back({"input", 0, f32("input", {2, 3, 4, 4}, input)});
  s.tensors.push_back({"act.conv1", 1, f32("act.conv1", {2, 4, 4, 4}, act1)});
  s.tensors.push_back({"act.layer1", 2, f32("act.layer1", {2, 4, 2, 2}, act2)});
  s.tensors.push_back({"loss", 3, f32("loss", {}, {2.302585f})});
  s.tensors.push_back({"grad.conv1.weight", 4, f32("grad.conv1.weight", {4, 3, 3, 3}, grad)});
  s.index();
  return s;
}

}  // namespace

TEST_CASE("a second run is aligned so that both runs' step N start at the same x", "[app]") {
  // Run A: two ranks, step 0 at 1000 (rank 1 at 1040), step 1 at 5000 (rank 0) and 4990 (rank 1).
  std::vector<wb::store::StepRow> a = {step_row(0, 0, 1000, 5000), step_row(1, 0, 1040, 4990), step_row(0, 1, 5000, 8000),
                                       step_row(1, 1, 4990, 8010), step_row(0, 2, 8000, 11000)};
  // Run B: its own clock; step 1 starts at 70'300 (earliest rank).
  std::vector<wb::store::StepRow> b = {step_row(0, 0, 60'000, 70'400), step_row(1, 0, 60'100, 70'300), step_row(0, 1, 70'400, 73'000),
                                       step_row(1, 1, 70'300, 73'100)};
  CHECK(step_start(a, 0) == std::optional<std::int64_t>(1000));
  CHECK(step_start(a, 1) == std::optional<std::int64_t>(4990));  // the earliest rank starts a step
  CHECK_FALSE(step_start(a, 7).has_value());
  CHECK(first_steady_step(a) == std::optional<int>(1));
  CHECK(first_steady_step(std::vector<wb::store::StepRow>{step_row(0, 3, 0, 10)}) == std::optional<int>(3));
  CHECK_FALSE(first_steady_step(std::vector<wb::store::StepRow>{}).has_value());

  SECTION("by the first steady step") {
    Alignment al = align_runs(a, 900, b, 59'000, first_steady_step(a));
    REQUIRE(al.step == std::optional<int>(1));
    CHECK_THAT(al.offset_ns, WithinAbs(70'300.0 - 4990.0, 1e-9));
    // Both step-1 starts land on the same pixel.
    TimeView v{4000.0, 9000.0, 1000.0};
    TimeView w = shifted(v, al.offset_ns);
    CHECK_THAT(w.to_px(70'300.0), WithinAbs(v.to_px(4990.0), 1e-9));
    CHECK_THAT(w.span_ns(), WithinAbs(v.span_ns(), 1e-9));
  }
  SECTION("by step 0") {
    Alignment al = align_runs(a, 900, b, 59'000, 0);
    CHECK_THAT(al.offset_ns, WithinAbs(60'000.0 - 1000.0, 1e-9));
  }
  SECTION("a step one run lacks falls back to the runs' starts") {
    Alignment al = align_runs(a, 900, b, 59'000, 2);
    CHECK_FALSE(al.step.has_value());
    CHECK_THAT(al.offset_ns, WithinAbs(59'000.0 - 900.0, 1e-9));
    Alignment off = align_runs(a, 900, b, 59'000, std::nullopt);
    CHECK_THAT(off.offset_ns, WithinAbs(58'100.0, 1e-9));
  }
}

TEST_CASE("per-op deltas against a second run match by name and category", "[app]") {
  using wb::store::Category;
  std::vector<wb::analysis::OpStat> first = {op("conv", Category::forward, 10, 5000), op("conv", Category::backward, 10, 9000),
                                             op("only_here", Category::loss, 2, 100)};
  std::vector<wb::analysis::OpStat> second = {op("conv", Category::backward, 5, 4000), op("conv", Category::forward, 20, 8000),
                                              op("elsewhere", Category::data, 1, 1)};
  auto d = op_deltas(first, second);
  REQUIRE(d.size() == 3);
  REQUIRE(d[0].present);
  CHECK_THAT(d[0].mean_ns, WithinAbs(500.0 - 400.0, 1e-9));
  CHECK_THAT(d[0].total_ns, WithinAbs(5000.0 - 8000.0, 1e-9));
  CHECK_THAT(d[0].mean_ratio, WithinRel(100.0 / 400.0, 1e-12));
  REQUIRE(d[1].present);
  CHECK_THAT(d[1].mean_ns, WithinAbs(900.0 - 800.0, 1e-9));
  CHECK_THAT(d[1].total_ns, WithinAbs(5000.0, 1e-9));
  CHECK_FALSE(d[2].present);
  CHECK(d[0].per_step_ratio == 0.0);  // step counts unknown
  // per step: 5000 over 4 steps here, 8000 over 2 there
  auto per_step = op_deltas(first, second, 4.0, 2.0);
  CHECK_THAT(per_step[0].per_step_ratio, WithinRel((5000.0 / 4) / (8000.0 / 2), 1e-12));
  CHECK_THAT(per_step[1].per_step_ratio, WithinRel((9000.0 / 4) / (4000.0 / 2), 1e-12));
  CHECK(per_step[2].per_step_ratio == 0.0);
}

TEST_CASE("a comparison saved in a run reads back equal, without the reference", "[app]") {
  wb::test::TempDir dir;
  const auto run = dir / "run.sqlite";
  SyntheticRun spec;
  spec.ranks = 1;
  spec.steps = 2;
  spec.ranges_per_rank = 50;
  write_synthetic_run(run, spec);
  const auto a = dump("A", 0.2f), b = dump("B", 0.0f);
  const auto computed = wb::compare::compare_sets(a, b);
  REQUIRE(computed.first_divergence);
  REQUIRE(computed.failed >= 1);
  const std::int64_t id = wb::compare::save_to_run(run, computed);

  wb::compare::StoredComparison stored = wb::compare::read_stored_comparison(run, id);
  const auto& c = stored.comparison;
  CHECK(stored.header.id == id);
  REQUIRE(c.rows.size() == computed.rows.size());
  CHECK(c.passed == computed.passed);
  CHECK(c.failed == computed.failed);
  CHECK(c.missing_a == computed.missing_a);
  CHECK(c.missing_b == computed.missing_b);
  CHECK(c.profile == computed.profile);
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    CAPTURE(i, computed.rows[i].name);
    const auto& r = c.rows[i];
    const auto& e = computed.rows[i];
    CHECK(r.name == e.name);
    CHECK(r.kind == e.kind);
    CHECK(r.status == e.status);
    CHECK(r.b_shape == e.b_shape);
    CHECK(r.reason == e.reason);
    REQUIRE(r.metrics.has_value() == e.metrics.has_value());
    if (e.metrics) {
      CHECK_THAT(r.metrics->rel_l2, WithinRel(e.metrics->rel_l2, 1e-12) || WithinAbs(e.metrics->rel_l2, 1e-300));
      CHECK_THAT(r.metrics->cosine, WithinRel(e.metrics->cosine, 1e-12));
      CHECK_THAT(r.metrics->max_abs, WithinRel(e.metrics->max_abs, 1e-12) || WithinAbs(e.metrics->max_abs, 1e-300));
      CHECK(r.metrics->max_abs_index == e.metrics->max_abs_index);
    }
    CHECK(r.thresholds.rel_l2_max == e.thresholds.rel_l2_max);
    CHECK(r.thresholds.cosine_min == e.thresholds.cosine_min);
    CHECK_FALSE(r.a_index.has_value());  // no tensors attached yet
  }
  REQUIRE(c.first_divergence);
  CHECK(c.first_divergence->name == "act.layer1");
  CHECK(c.first_divergence->name == computed.first_divergence->name);
  CHECK(c.first_divergence->row == computed.first_divergence->row);
  CHECK(c.first_divergence->local == computed.first_divergence->local);
  REQUIRE(c.first_divergence->worst.size() == computed.first_divergence->worst.size());
  CHECK(c.first_divergence->worst.front().index == 5);

  // Linking the rows to tensors again makes the detail computable.
  auto linked = c;
  wb::compare::attach_sets(linked, a, b);
  for (const auto& r : linked.rows) {
    CHECK(r.a_index == a.position(r.a_key));
    CHECK(r.b_index == b.position(r.b_key));
  }

  REQUIRE_THROWS_AS(wb::compare::read_stored_comparison(run, id + 5), wb::compare::CompareError);
  REQUIRE_THROWS_AS(wb::compare::read_stored_comparison(dir / "missing.sqlite", 1), wb::store::StoreError);
}

TEST_CASE("the sides of a stored comparison are found where they are, or reported gone", "[app]") {
  wb::test::TempDir dir;
  const auto run = dir / "run.sqlite";
  { std::ofstream(run) << "x"; }
  { std::ofstream(dir / "ref.safetensors") << "x"; }
  CHECK(wb::compare::locate_side((dir / "ref.safetensors").string(), run) == dir / "ref.safetensors");
  CHECK(wb::compare::locate_side("ref.safetensors", run) == dir / "ref.safetensors");  // relative to another directory: beside the run
  CHECK(wb::compare::locate_side("some/where/run.sqlite", run) == run);  // the run itself, moved
  CHECK_FALSE(wb::compare::locate_side((dir / "gone.safetensors").string(), run).has_value());
}

TEST_CASE("the tuner's wb-train is found next to the app or through WB_TRAIN_BIN", "[app]") {
  const char* old = std::getenv("WB_TRAIN_BIN");
  std::string saved = old ? old : "";
  ::setenv("WB_TRAIN_BIN", "/no/such/wb-train", 1);
  REQUIRE_THROWS_AS(train_executable(), ChildError);
  try {
    train_executable();
  } catch (const ChildError& e) {
    CHECK(std::string(e.what()).find("/no/such/wb-train") != std::string::npos);
    CHECK(std::string(e.what()).find("WB_TRAIN_BIN") != std::string::npos);
  }
  wb::test::TempDir dir;
  { std::ofstream(dir / "plain.txt") << "not a program"; }
  std::filesystem::permissions(dir / "plain.txt", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  ::setenv("WB_TRAIN_BIN", (dir / "plain.txt").c_str(), 1);  // a file, but not executable
  REQUIRE_THROWS_AS(train_executable(), ChildError);
  ::setenv("WB_TRAIN_BIN", dir.path().c_str(), 1);  // a directory
  REQUIRE_THROWS_AS(train_executable(), ChildError);
  ::setenv("WB_TRAIN_BIN", "/bin/true", 1);
  CHECK(train_executable() == "/bin/true");
  if (old) ::setenv("WB_TRAIN_BIN", saved.c_str(), 1);
  else ::unsetenv("WB_TRAIN_BIN");
}

TEST_CASE("a split handle dragged with injected mouse input moves the split and the prediction", "[app]") {
  wb::test::TempDir dir;
  SyntheticRun spec;
  spec.ranks = 2;
  spec.steps = 3;
  spec.ranges_per_rank = 300;
  write_synthetic_run(dir / "run.sqlite", spec);
  Headless h;
  App::Options opt;
  opt.run = (dir / "run.sqlite").string();
  opt.persist_recent = false;
  opt.tuner_drag = std::make_pair(8, 12);
  App app(opt);
  CHECK(app.current == ViewId::allreduce);
  for (int i = 0; i < 3000 && app.busy(); ++i) {
    h.frame(app);
    if (app.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE_FALSE(app.busy());
  CHECK_FALSE(app.error_shown());
  REQUIRE(app.tuner.initialised);
  REQUIRE(app.model->split_model);
  CHECK(app.model->split_model->current_split == std::vector<int>{8});
  CHECK(app.tuner.split == std::vector<int>{12});  // the handle went where the mouse let go
  CHECK(app.tuner.compare_label == "edited");
  // The report predicts for the moved split, which the model predicts differently from the run's.
  const std::string report = app.tuner_report();
  CAPTURE(report);
  CHECK(report.find("split 12\n") != std::string::npos);
  const std::vector<int> twelve{12};
  auto moved = wb::analysis::predict(*app.model->split_model, twelve);
  char line[64];
  std::snprintf(line, sizeof line, "predicted step_ms %.6f\n", moved.step_ns / 1e6);
  CHECK(report.find(line) != std::string::npos);

  SECTION("a drag from a point the split lacks is an error, not a guess") {
    App::Options bad = opt;
    bad.tuner_drag = std::make_pair(9, 12);
    App other(bad);
    for (int i = 0; i < 3000 && other.busy(); ++i) {
      h.frame(other);
      if (other.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    REQUIRE(other.error_shown());
    CHECK(other.error().find("--tuner-drag 9:12") != std::string::npos);
    CHECK(other.tuner.split == std::vector<int>{8});
  }
}

TEST_CASE("layer timing: a tensor's layer and direction, and the ratio's place on the colour scale", "[app]") {
  using wb::store::Category;
  wb::app_model::LayerTiming t;
  auto row = [](const char* name, Category dir, double a, double b) {
    wb::analysis::LayerDiffRow r;
    r.name = name;
    r.direction = dir;
    wb::analysis::LayerTime la, lb;
    la.ns = a;
    lb.ns = b;
    r.a = la;
    r.b = lb;
    return r;
  };
  t.diff.rows = {row("layer1.0.conv1", Category::forward, 300, 100), row("layer1.0.conv1", Category::backward, 100, 400),
                 row("loss", Category::loss, 5, 5), row("layer1.0.relu", Category::forward, 2, 1)};
  for (std::size_t i = 0; i < t.diff.rows.size(); ++i) t.index[{t.diff.rows[i].name, t.diff.rows[i].direction}] = i;
  REQUIRE(t.for_tensor("act.layer1.0.conv1") == &t.diff.rows[0]);
  REQUIRE(t.for_tensor("grad.layer1.0.conv1.weight") == &t.diff.rows[1]);
  REQUIRE(t.for_tensor("loss") == &t.diff.rows[2]);
  CHECK(t.for_tensor("act.layer1.0.relu.2") == &t.diff.rows[3]);  // the block's last relu, with the add
  CHECK(t.for_tensor("act.layer1.0.relu.0") == nullptr);            // fused into bn1 in wb-train
  CHECK(t.for_tensor("param.layer1.0.conv1.weight") == nullptr);
  CHECK(t.for_tensor("act.fc") == nullptr);
  CHECK(t.for_tensor("grad.x") == nullptr);
  CHECK(wb::app_model::ratio_heat(t.diff.rows[0].ratio()) == 1.0);   // 3x slower: red end
  CHECK(wb::app_model::ratio_heat(t.diff.rows[1].ratio()) == 0.0);   // 4x faster: green end
  CHECK(wb::app_model::ratio_heat(1.0) == 0.5);
  CHECK_THAT(wb::app_model::ratio_heat(std::sqrt(2.0)), WithinAbs(0.75, 1e-12));
  CHECK(wb::app_model::ratio_heat(std::nan("")) == 0.5);
}

TEST_CASE("a captured window clicked in the Overview shows its steps in the Timeline", "[app]") {
  wb::test::TempDir dir;
  const auto file = dir / "captured.sqlite";
  SyntheticRun spec;
  spec.ranks = 1;
  spec.steps = 12;
  spec.ranges_per_rank = 600;
  write_synthetic_run(file, spec);
  std::int64_t t0 = 0, t1 = 0;
  {
    // Two windows as wb-train --capture writes them, and the times the second one covers.
    wb::store::Db db(file, wb::store::OpenMode::read_write);
    db.exec("INSERT INTO capture_window VALUES (0, 2, 4, 'slow', 3, 'step 3: 40.0 ms, 4.0x the running median (10.0 ms)');"
            "INSERT INTO capture_window VALUES (0, 8, 10, 'slow', 9, 'step 9: 50.0 ms, 5.0x the running median (10.0 ms)');"
            "INSERT OR REPLACE INTO meta VALUES ('capture', 'slow:3 (window 1)');");
    t0 = db.query_int64("SELECT start_ns FROM step WHERE step = 8");
    t1 = db.query_int64("SELECT end_ns FROM step WHERE step = 10");
  }
  Headless h;
  App::Options opt;
  opt.run = file.string();
  opt.persist_recent = false;
  App app(opt);
  for (int i = 0; i < 3000 && app.busy(); ++i) {
    h.frame(app);
    if (app.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE_FALSE(app.busy());
  REQUIRE(app.model);
  REQUIRE(app.model->run.capture_windows.size() == 2);
  h.frame(app);
  REQUIRE(app.current == ViewId::overview);
  REQUIRE(app.capture_rows.size() == 2);
  // A click on the second window's row, as a hand would: hover, press, release.
  const float x = app.capture_rows[1].first, y = app.capture_rows[1].second;
  auto frame_with_mouse = [&](bool down) {
    ImGuiIO& io = ImGui::GetIO();
    io.DeltaTime = 1.0f / 60;
    io.MousePos = ImVec2(x, y);
    io.MouseDown[0] = down;
    ImGui::NewFrame();
    app.frame();
    ImGui::Render();
  };
  frame_with_mouse(false);
  frame_with_mouse(true);
  frame_with_mouse(false);
  CHECK(app.current == ViewId::timeline);
  h.frame(app);  // the Timeline draws and takes the request
  CHECK_FALSE(app.timeline.zoom_to.has_value());
  const double pad = 0.02 * static_cast<double>(t1 - t0);
  CHECK_THAT(app.timeline.view.t0_ns, Catch::Matchers::WithinAbs(static_cast<double>(t0) - pad, 1.0));
  CHECK_THAT(app.timeline.view.t1_ns, Catch::Matchers::WithinAbs(static_cast<double>(t1) + pad, 1.0));
}
