// The app's other pure logic with known answers: histogram binning, value axes, split-point editing
// and strip geometry, the tuner's suggestions against brute force, the alpha-beta fit, recent files,
// directory listings, and starting wb-train as a child process.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "app/model/child_process.hpp"
#include "app/model/files_logic.hpp"
#include "app/model/memory_logic.hpp"
#include "app/model/plot_logic.hpp"
#include "app/model/tuner_logic.hpp"
#include "profiler/analysis/allreduce.hpp"
#include "profiler/analysis/split_model.hpp"
#include "memory_test_util.hpp"
#include "store_test_util.hpp"

using namespace wb::app_model;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

using wb::test::TempDir;

TEST_CASE("histograms bin linearly and logarithmically", "[app]") {
  SECTION("linear: one value per bin, the top edge in the last bin") {
    std::vector<double> v = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    Histogram h = make_histogram(v, 10, 0.0, 10.0, false);
    REQUIRE(h.counts.size() == 10);
    for (std::size_t i = 0; i < 9; ++i) CHECK(h.counts[i] == 1);
    CHECK(h.counts[9] == 2);
    CHECK(h.max_count() == 2);
    CHECK(h.bin_of(3.5) == 3);
    CHECK(h.bin_of(11.0) == -1);
  }
  SECTION("log: decades") {
    std::vector<double> v = {1, 10, 100, 1000, 0.0, -5, std::nan(""), INFINITY};
    Histogram h = make_histogram(v, 3, 1.0, 1000.0, true);
    CHECK(h.counts == std::vector<std::int64_t>{1, 1, 2});
    CHECK(h.below == 2);  // 0 and -5 have no logarithm
    CHECK(h.nonfinite == 2);
    CHECK_THAT(h.edges[1], WithinRel(10.0, 1e-12));
    CHECK_THAT(h.edges[2], WithinRel(100.0, 1e-12));
  }
  SECTION("own range and out-of-range values") {
    std::vector<double> v = {2, 4, 6, 8};
    Histogram h = make_histogram(v, 3, false);
    CHECK_THAT(h.edges.front(), WithinAbs(2.0, 0.0));
    CHECK_THAT(h.edges.back(), WithinAbs(8.0, 0.0));
    CHECK(h.counts == std::vector<std::int64_t>{1, 1, 2});
    Histogram clipped = make_histogram(v, 2, 3.0, 7.0, false);
    CHECK(clipped.below == 1);
    CHECK(clipped.above == 1);
    CHECK(clipped.counts == std::vector<std::int64_t>{1, 1});
  }
  SECTION("bad arguments") {
    std::vector<double> v = {1};
    REQUIRE_THROWS_AS(make_histogram(v, 0, 0.0, 1.0, false), std::invalid_argument);
    REQUIRE_THROWS_AS(make_histogram(v, 4, 2.0, 1.0, false), std::invalid_argument);
    REQUIRE_THROWS_AS(make_histogram(v, 4, 0.0, 1.0, true), std::invalid_argument);
  }
}

TEST_CASE("value axes round outward to 1-2-5 steps", "[app]") {
  Axis a = nice_axis(0.0, 16317.0);  // 16317 / 5 = 3263: the 1-2-5 step nearest is 2000
  CHECK_THAT(a.step, WithinRel(2000.0, 1e-12));
  CHECK_THAT(a.lo, WithinAbs(0.0, 0.0));
  CHECK_THAT(a.hi, WithinRel(18000.0, 1e-12));
  Axis b = nice_axis(0.013, 0.087, 4.0);
  CHECK_THAT(b.step, WithinRel(0.02, 1e-9));
  CHECK_THAT(b.lo, WithinAbs(0.0, 1e-12));
  CHECK_THAT(b.hi, WithinRel(0.1, 1e-9));
  Axis c = nice_axis(5.0, 5.0);  // a constant series still gets a range
  CHECK(c.hi > c.lo);
  auto d = log_decades(3e-5, 0.2);
  REQUIRE(d.size() == 6);
  CHECK_THAT(d.front(), WithinRel(1e-5, 1e-12));
  CHECK_THAT(d.back(), WithinRel(1.0, 1e-12));
}

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

TEST_CASE("recent files: newest first, no duplicates, bounded, persisted", "[app]") {
  std::vector<std::string> list = {"/a", "/b", "/c"};
  push_recent(list, "/b");
  CHECK(list == std::vector<std::string>{"/b", "/a", "/c"});
  push_recent(list, "/d", 3);
  CHECK(list == std::vector<std::string>{"/d", "/b", "/a"});
  TempDir dir;
  auto file = dir.path() / "cfg" / "wb-view" / "recent.txt";
  CHECK(read_recent(file).empty());
  REQUIRE(write_recent(file, list));
  CHECK(read_recent(file) == list);
}

TEST_CASE("directory listings put folders first and filter by extension", "[app]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "zdir");
  std::filesystem::create_directories(dir.path() / ".hidden");
  for (const char* f : {"b.sqlite", "a.sqlite", "c.txt", "r.safetensors"}) std::ofstream(dir.path() / f) << "x";
  auto all = list_directory(dir.path(), {});
  REQUIRE(all.size() == 5);
  CHECK(all[0].name == "zdir");
  CHECK(all[0].is_dir);
  CHECK(all[1].name == "a.sqlite");
  auto runs = list_directory(dir.path(), {".sqlite"});
  REQUIRE(runs.size() == 3);
  CHECK(runs[1].name == "a.sqlite");
  CHECK(runs[2].name == "b.sqlite");
  CHECK(runs[2].size == 1);
  CHECK(list_directory(dir.path() / "missing", {}).empty());
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

TEST_CASE("the Memory view's holder rows fold the rest into one row and still sum to the peak", "[memory]") {
  wb::test::MemoryBuilder b;
  b.step(0, 0, 1000);
  for (int i = 0; i < 30; ++i) b.event(10 + i, 100 + i, wb::test::kActivation, wb::analysis::concat("layer", std::to_string(i)));
  b.step(1, 2000, 3000);
  b.event(2100, 1, wb::test::kGradient, "late");
  const wb::analysis::MemoryAnalysis mem = wb::analysis::analyze_memory(b.run);
  REQUIRE(mem.steps.size() == 2);
  const auto rows = wb::app_model::top_holders(mem.steps[0], 5);
  REQUIRE(rows.size() == 6);
  CHECK(rows[0].name == "layer29");
  CHECK(rows[5].name == "(25 others)");
  std::int64_t s = 0;
  for (const auto& r : rows) s += r.bytes;
  CHECK(s == mem.steps[0].peak_bytes);
  CHECK(rows[5].by_role[wb::test::kActivation] == rows[5].bytes);
  CHECK(wb::app_model::top_holders(mem.steps[0], 40).size() == 30);
  CHECK(wb::app_model::peak_step_index(mem, 0) == 1);
  CHECK(wb::app_model::peak_step_index(mem, 3) == -1);
  CHECK(wb::app_model::memory_ranks(mem) == std::vector<int>{0});
}
