// The split tuner: split points edited in order, the strip's geometry, Suggest against brute force,
// the alpha-beta fit, wb-train found and started as a child process whose output is read line by
// line, a re-run's settings, and a split handle dragged with injected mouse input.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <imgui.h>

#include "app/model/child_process.hpp"
#include "app/model/files_logic.hpp"
#include "app/model/memory_logic.hpp"
#include "app/model/plot_logic.hpp"
#include "app/model/tuner_logic.hpp"
#include "profiler/analysis/allreduce.hpp"
#include "profiler/analysis/split_model.hpp"
#include "memory_test_util.hpp"
#include "store_test_util.hpp"
#include "app/model/layer_timing.hpp"
#include "app/model/ops_logic.hpp"
#include "app/model/synthetic_run.hpp"
#include "app/model/timeline_logic.hpp"
#include "app/view/app.hpp"
#include "compare/report.hpp"
#include "compare/stored_comparison.hpp"
#include "store/db.hpp"
#include "view_test_util.hpp"

using namespace wb::app_model;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using wb::test::TempDir;
using wb::test::Headless;
using namespace wb::view;

TEST_CASE("split points are added, moved and removed in order", "[app]") {
  std::vector<int> split = {85, 160};
  CHECK(add_split(split, 40, 161));
  CHECK(split == std::vector<int>{40, 85, 160});
  CHECK_FALSE(add_split(split, 85, 161));   // present
  CHECK_FALSE(add_split(split, 0, 161));    // [0, ...) is not a split
  CHECK_FALSE(add_split(split, 161, 161));  // past the last parameter
  CHECK(move_split(split, 1, 30, 161) == 41);   // clamped above its left neighbour
  CHECK(move_split(split, 1, 200, 161) == 159); // and below its right one
  CHECK(move_split(split, 2, 500, 161) == 160); // the last stays within [1, P-1]
  CHECK(move_split(split, 1, 100, 161) == 100);
  CHECK(split == std::vector<int>{40, 100, 160});
  CHECK(remove_split(split, 0));
  CHECK(split == std::vector<int>{100, 160});
  CHECK_FALSE(remove_split(split, 5));
  CHECK(split_flags(split) == "--allreduce-split 100,160");
  CHECK(split_flags({}) == "--allreduce-split none");  // the single bucket
}

TEST_CASE("the tuner strip maps split points to x and back", "[app]") {
  const int P = 161;
  const double x0 = 10.0, width = 805.0;  // 5 px per parameter
  // Backward order: the last parameter's column is at the left.
  CHECK(param_at_x(11.0, P, x0, width) == 160);
  CHECK(param_at_x(814.0, P, x0, width) == 0);
  CHECK(param_at_x(5.0, P, x0, width) == -1);
  CHECK_THAT(split_x(160, P, x0, width), WithinAbs(15.0, 1e-9));  // between columns of 160 and 159
  CHECK_THAT(split_x(1, P, x0, width), WithinAbs(810.0, 1e-9));
  for (int s = 1; s < P; ++s) {
    CAPTURE(s);
    CHECK(split_at_x(split_x(s, P, x0, width), P, x0, width) == s);
    CHECK(split_at_x(split_x(s, P, x0, width) + 2.0, P, x0, width) == s);  // nearest boundary
  }
  CHECK(split_at_x(-1000.0, P, x0, width) == P - 1);
  CHECK(split_at_x(5000.0, P, x0, width) == 1);
  std::vector<int> split = {85, 160};
  CHECK(split_near_x(split, split_x(85, P, x0, width) + 3.0, P, x0, width, 6.0) == std::optional<std::size_t>(0));
  CHECK_FALSE(split_near_x(split, split_x(85, P, x0, width) + 30.0, P, x0, width, 6.0).has_value());
}

TEST_CASE("Suggest finds the brute-force optimum of the split model", "[app]") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    wb::analysis::SplitModel m;
    const int P = 3 + static_cast<int>(rng() % 9);  // up to 11 parameters: 1024 splits
    double t = 0;
    m.ready_ns.resize(static_cast<std::size_t>(P));
    m.bytes.resize(static_cast<std::size_t>(P));
    for (int k = P - 1; k >= 0; --k) {  // backward produces the last parameter first
      t += 10.0 + static_cast<double>(rng() % 500);
      m.ready_ns[static_cast<std::size_t>(k)] = t;
      m.bytes[static_cast<std::size_t>(k)] = 1000.0 + static_cast<double>(rng() % 100000);
      m.names.push_back(std::string("p").append(std::to_string(k)));
    }
    m.alpha_ns = 50.0 + static_cast<double>(rng() % 400);
    m.beta_ns_per_byte = 0.001 * static_cast<double>(1 + rng() % 20);
    m.compute_end_ns = t + 20.0;
    double best = INFINITY;
    for (std::uint32_t mask = 0; mask < (1u << (P - 1)); ++mask) {
      std::vector<int> split;
      for (int s = 1; s < P; ++s)
        if (mask & (1u << (s - 1))) split.push_back(s);
      best = std::min(best, wb::analysis::predict(m, split).comm_end_ns);
    }
    auto dp = wb::analysis::predict(m, wb::analysis::optimal_split(m));
    CHECK_THAT(dp.comm_end_ns, WithinRel(best, 1e-12));
    // The heuristics never beat the optimum.
    CHECK(wb::analysis::predict(m, wb::analysis::mgwfbp_split(m)).comm_end_ns >= best - 1e-6);
    CHECK(wb::analysis::predict(m, wb::analysis::ddp_split(m)).comm_end_ns >= best - 1e-6);
  }
}

TEST_CASE("the alpha-beta fit recovers a line and needs two sizes", "[app]") {
  std::vector<std::pair<double, double>> pts = {{1000, 150 + 0.5 * 1000}, {5000, 150 + 0.5 * 5000}, {20000, 150 + 0.5 * 20000}};
  auto fit = wb::analysis::fit_alpha_beta(pts);
  REQUIRE(fit.valid);
  CHECK_THAT(fit.alpha_ns, WithinRel(150.0, 1e-9));
  CHECK_THAT(fit.beta_ns_per_byte, WithinRel(0.5, 1e-9));
  CHECK_THAT(fit.predict(10000), WithinRel(5150.0, 1e-9));
  std::vector<std::pair<double, double>> one = {{1000, 5}, {1000, 7}};
  CHECK_FALSE(wb::analysis::fit_alpha_beta(one).valid);
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

TEST_CASE("a child process's output is read line by line, '\\r' included", "[app]") {
  ChildProcess p("/bin/sh", {"-c", "echo first; printf 'step 1/6\\rstep 2/6\\r'; echo err >&2; exit 3"});
  CHECK(p.wait() == 3);
  CHECK_FALSE(p.running());
  auto lines = p.lines();
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "first");
  CHECK(lines[1] == "step 1/6");
  CHECK(lines[2] == "step 2/6");
  CHECK(lines[3] == "err");
  REQUIRE_THROWS_AS(ChildProcess("/nonexistent/wb-train", {}), ChildError);
  auto prog = parse_progress("[####     ] step 2 [3/12]  epoch 0  loss 2.7");
  REQUIRE(prog.has_value());
  CHECK(prog->step == 2);
  CHECK(prog->done == 3);
  CHECK(prog->steps == 12);
  CHECK_FALSE(parse_progress("step 3/12  epoch 1").has_value());
  CHECK_FALSE(parse_progress("wb-train: 2 rank(s), step size").has_value());
}

TEST_CASE("a re-run keeps the run's settings and replaces run, config_file and the split", "[app]") {
  TempDir dir;
  nlohmann::json config = {{"batch_size", 8}, {"run", "/old.sqlite"}, {"config_file", "/x.json"}, {"allreduce_split", {85, 160}},
                           {"bucket_mb", 0.0}, {"nproc", 0}, {"lr", 0.01}};
  auto launch = make_train_launch(config, 2, {40, 120}, dir.path(), "rerun");
  CHECK(launch.run_path == dir.path() / "rerun.sqlite");
  std::ifstream in(launch.config_path);
  auto written = nlohmann::json::parse(in);
  CHECK_FALSE(written.contains("run"));
  CHECK_FALSE(written.contains("config_file"));
  CHECK(written["allreduce_split"] == nlohmann::json({40, 120}));
  CHECK(written["nproc"] == 2);
  CHECK(written["batch_size"] == 8);
  CHECK(written["bucket_mb"] == 0.0);
  // The split is written once: in the config, not again as a flag.
  CHECK(launch.args == std::vector<std::string>{"--config", launch.config_path.string(), "--run", launch.run_path.string()});
  auto single = make_train_launch(config, 1, {}, dir.path(), "single");
  std::ifstream in2(single.config_path);
  auto w2 = nlohmann::json::parse(in2);
  CHECK(w2["allreduce_split"] == "none");  // one bucket, said so
  CHECK(w2["bucket_mb"] == 0.0);
  CHECK(w2["nproc"] == 0);
  CHECK(single.args == std::vector<std::string>{"--config", single.config_path.string(), "--run", single.run_path.string()});
  REQUIRE_THROWS_AS(make_train_launch(config, 1, {120, 40}, dir.path(), "unsorted"), wb::allreduce::SplitError);
  REQUIRE_THROWS_AS(make_train_launch(config, 1, {}, "/proc/no-such-dir", "x"), ChildError);
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

TEST_CASE("wb tune-split's trials are summarised per candidate: rounds, median, change against current", "[app]") {
  using wb::store::SplitTrialRow;
  std::vector<SplitTrialRow> rows;
  auto add = [&](int round, const char* cand, const char* split, std::int64_t median, int rc = 0) {
    rows.push_back(SplitTrialRow{round, cand, split, 10, median, 900, 950, rc, "r.sqlite", "2026-11-28T00:00:00Z"});
  };
  add(0, "current", "81,132,144", 1000);
  add(0, "single bucket", "none", 880);
  add(1, "single bucket", "none", 920);
  add(1, "current", "81,132,144", 1100);
  add(2, "current", "81,132,144", 960);
  add(2, "single bucket", "none", 0, 3);  // a failed trial
  const auto s = wb::app_model::summarize_trials(rows);
  REQUIRE(s.size() == 2);
  CHECK(s[0].candidate == "current");
  CHECK(s[0].rounds == std::vector<std::int64_t>{1000, 1100, 960});
  CHECK(s[0].median_ns == 1000);
  CHECK(s[0].vs_current == 0.0);
  CHECK(s[1].split == "none");
  CHECK(s[1].rounds == std::vector<std::int64_t>{880, 920, -1});
  CHECK(s[1].median_ns == 900);  // the two that ran
  CHECK_THAT(s[1].vs_current, Catch::Matchers::WithinAbs(-0.1, 1e-12));
  CHECK(wb::app_model::summarize_trials({}).empty());
}
