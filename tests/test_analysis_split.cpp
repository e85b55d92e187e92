// The split-point model: predicted timelines, the DP optimum against brute force, MG-WFBP and DDP on
// hand cases, and a model built from a recorded run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "profiler/analysis/report.hpp"
#include "profiler/analysis/split_model.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using analysis::SplitModel;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

SplitModel model(std::vector<double> ready, std::vector<double> bytes, double alpha, double beta, double compute_end) {
  SplitModel m;
  m.ready_ns = std::move(ready);
  m.bytes = std::move(bytes);
  m.alpha_ns = alpha;
  m.beta_ns_per_byte = beta;
  m.compute_end_ns = compute_end;
  for (std::size_t i = 0; i < m.ready_ns.size(); ++i) m.names.push_back(analysis::concat("p", std::to_string(i)));
  return m;
}

}  // namespace

TEST_CASE("predict runs buckets last-first on one stream", "[analysis]") {
  // Forward order: parameter 2 is ready first (backward runs in reverse).
  auto m = model({30, 20, 10}, {100, 100, 100}, 5, 0.1, 30);
  m.measured_step_ns = 1000;
  m.measured_exposed_ns = 40;

  auto one = analysis::predict(m, std::vector<int>{});
  REQUIRE(one.buckets.size() == 1);
  CHECK_THAT(one.buckets[0].start_ns, WithinAbs(30, 1e-9));
  CHECK_THAT(one.comm_end_ns, WithinAbs(30 + 5 + 30, 1e-9));
  CHECK_THAT(one.exposed_ns, WithinAbs(35, 1e-9));
  CHECK_THAT(one.step_ns, WithinAbs(1000 - 40 + 35, 1e-9));

  std::vector<int> split{1, 2};
  auto three = analysis::predict(m, split);
  REQUIRE(three.buckets.size() == 3);
  CHECK(three.buckets[0].first == 2);  // the last bucket runs first
  CHECK_THAT(three.buckets[0].end_ns, WithinAbs(25, 1e-9));
  CHECK_THAT(three.buckets[1].start_ns, WithinAbs(25, 1e-9));  // waits for the stream, not for readiness
  CHECK_THAT(three.buckets[1].end_ns, WithinAbs(40, 1e-9));
  CHECK_THAT(three.buckets[2].start_ns, WithinAbs(40, 1e-9));
  CHECK_THAT(three.comm_end_ns, WithinAbs(55, 1e-9));
  CHECK_THAT(three.exposed_ns, WithinAbs(25, 1e-9));
}

TEST_CASE("invalid splits are rejected with a clear error", "[analysis]") {
  auto m = model({3, 2, 1, 0}, {1, 1, 1, 1}, 1, 1, 3);
  REQUIRE_THROWS_AS(analysis::predict(m, std::vector<int>{0}), analysis::AnalysisError);
  REQUIRE_THROWS_AS(analysis::predict(m, std::vector<int>{2, 1}), analysis::AnalysisError);
  REQUIRE_THROWS_AS(analysis::predict(m, std::vector<int>{2, 2}), analysis::AnalysisError);
  REQUIRE_THROWS_AS(analysis::predict(m, std::vector<int>{4}), analysis::AnalysisError);
  REQUIRE_THROWS_AS(analysis::optimal_split(SplitModel{}), analysis::AnalysisError);
  REQUIRE_NOTHROW(analysis::predict(m, std::vector<int>{1, 3}));
}

TEST_CASE("the DP split is as good as brute force over every split set", "[analysis]") {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    int p = 1 + static_cast<int>(rng() % 10);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<double> ready(static_cast<std::size_t>(p)), bytes(static_cast<std::size_t>(p));
    // Mostly increasing in backward order, with some out-of-order readiness.
    double t = 0;
    for (int k = p - 1; k >= 0; --k) {
      t += 1000 * u(rng);
      ready[static_cast<std::size_t>(k)] = trial % 3 == 0 ? 5000 * u(rng) : t;
      bytes[static_cast<std::size_t>(k)] = 1 + std::floor(1e6 * u(rng));
    }
    double alpha = 2000 * u(rng);
    double beta = 0.002 * u(rng);
    auto m = model(ready, bytes, alpha, beta, *std::max_element(ready.begin(), ready.end()));

    double best = std::numeric_limits<double>::infinity();
    for (std::uint32_t mask = 0; mask < (1u << (p - 1)); ++mask) {
      std::vector<int> split;
      for (int i = 1; i < p; ++i)
        if (mask & (1u << (i - 1))) split.push_back(i);
      best = std::min(best, analysis::predict(m, split).comm_end_ns);
    }
    auto dp = analysis::optimal_split(m);
    CAPTURE(trial, p, analysis::format_split(dp));
    CHECK_THAT(analysis::predict(m, dp).comm_end_ns, WithinRel(best, 1e-12));
    // Neither heuristic beats the optimum.
    CHECK(analysis::predict(m, analysis::mgwfbp_split(m)).comm_end_ns >= best * (1 - 1e-12));
    CHECK(analysis::predict(m, analysis::ddp_split(m, 2e6, 5e5)).comm_end_ns >= best * (1 - 1e-12));
  }
}

TEST_CASE("MG-WFBP merges as its greedy rule says", "[analysis]") {
  SECTION("a short wait (less than alpha) is worth a merge") {
    // alpha 10, beta 1: tc = 20 each. Parameter 1 is ready 5 ns after 2 starts communicating (< alpha):
    // merge; parameter 0 is ready at 50, long after the merged bucket ends at 35: its own bucket.
    auto m = model({50, 5, 0}, {10, 10, 10}, 10, 1, 50);
    CHECK(analysis::mgwfbp_split(m) == std::vector<int>{1});
  }
  SECTION("a bucket that has not started yet merges for free") {
    // Parameter 2 runs 0-20 alone (1 is ready at 10, waiting 10 is not < alpha). Parameter 1 would start
    // at 20, after 0 is ready at 15: merge 1 into 0.
    auto m = model({15, 10, 0}, {10, 10, 10}, 10, 1, 15);
    CHECK(analysis::mgwfbp_split(m) == std::vector<int>{2});
    CHECK_THAT(analysis::predict(m, std::vector<int>{2}).comm_end_ns, WithinAbs(50, 1e-9));
    CHECK_THAT(analysis::predict(m, std::vector<int>{1, 2}).comm_end_ns, WithinAbs(60, 1e-9));
  }
}

TEST_CASE("DDP buckets: 1 MiB first, then 25 MiB, filled in reverse order", "[analysis]") {
  const double mib = 1024.0 * 1024.0;
  auto m = model({0, 0, 0, 0, 0, 0}, {10 * mib, 10 * mib, 10 * mib, 10 * mib, 0.5 * mib, 0.6 * mib}, 1, 1, 0);
  // Reverse: 0.6 (<1), +0.5 = 1.1 closes at 4; 10, 20, 30 >= 25 closes at 1; 10 remains.
  CHECK(analysis::ddp_split(m) == std::vector<int>{1, 4});
}

TEST_CASE("MindSpore's [85,160] applies to models with more than 160 parameters", "[analysis]") {
  auto small = model(std::vector<double>(100, 0.0), std::vector<double>(100, 1.0), 1, 1, 0);
  CHECK(analysis::mindspore_split(small).empty());
  auto resnet = model(std::vector<double>(161, 0.0), std::vector<double>(161, 1.0), 1, 1, 0);
  CHECK(analysis::mindspore_split(resnet) == std::vector<int>{85, 160});
  auto s = analysis::suggest_splits(resnet);
  CHECK(std::any_of(s.begin(), s.end(), [](const auto& x) { return x.strategy == "MindSpore [85,160]"; }));
}

TEST_CASE("a split model built from a recorded run", "[analysis]") {
  const wb::test::TempDir dir;
  // Parameters 0,1 of 200 floats and 2,3 of 100; backward of module m3 ends 100 ns after backward starts, m2 at 200,
  // m1 at 300, m0 at 400 (in both steps). Buckets [0,2) and [2,4); bucket sizes 800 B each; spans of
  // two sizes so the fit is determined: 1000 + 1 ns/B. Buckets [0,2) = 1600 B and [2,4) = 800 B.
  // `sharded`: a fifth parameter of 5000 floats in no bucket (bucket -1, as a --shard-fc slice).
  auto write = [&](const fs::path& file, bool sharded) {
    store::WriterOptions o;
    o.path = file;
    o.handle_signals = false;
    store::Writer w(o);
    std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
    for (int i = 0; i < 4; ++i) w.add(store::ParamRow{i, analysis::concat("m", std::to_string(i), ".weight"), {i < 2 ? 200 : 100}, i < 2 ? 200 : 100, i < 2 ? 1 : 0, true});
    if (sharded) w.add(store::ParamRow{4, "fc.weight", {5000}, 5000, -1, true});
    for (int s = 0; s < 2; ++s) {
      std::int64_t t = 1'000'000 * (s + 1);
      w.add(store::RangeRow{main, w.intern("step"), t, t + 10'000, 7, 0, s, 0});
      for (int k = 0; k < 4; ++k) {
        int module = 3 - k;
        w.add(store::RangeRow{main, w.intern(analysis::concat("m", std::to_string(module))), t + 100 * k, t + 100 * (k + 1), 1, 1, s, 0});
      }
      w.add(store::StepRow{0, s, t, t + 10'000, 0, 0, 1.0, 0.1, 8});
      // Bucket 0 = params [2,3] ready at +200, bucket 1 = [0,1] ready at +400.
      w.add(store::AllreduceRow{0, s, 0, 2, 3, 800, t + 200, t + 200, t + 200 + 1000 + 800});
      w.add(store::AllreduceRow{0, s, 1, 0, 1, 1600, t + 400, t + 2000, t + 2000 + 1000 + 1600});
    }
    w.finish();
  };
  const fs::path file = dir / "run.sqlite";
  write(file, false);
  auto run = analysis::load_run(file);
  auto m = analysis::build_split_model(run);
  REQUIRE(m.size() == 4);
  CHECK(m.steps_used == 2);
  CHECK_THAT(m.ready_ns[3], WithinAbs(100, 1e-9));
  CHECK_THAT(m.ready_ns[2], WithinAbs(200, 1e-9));
  CHECK_THAT(m.ready_ns[1], WithinAbs(300, 1e-9));
  CHECK_THAT(m.ready_ns[0], WithinAbs(400, 1e-9));
  CHECK_THAT(m.compute_end_ns, WithinAbs(400, 1e-9));
  CHECK_THAT(m.alpha_ns, WithinAbs(1000, 1e-6));
  CHECK_THAT(m.beta_ns_per_byte, WithinRel(1.0, 1e-9));
  // 2400 bytes over 600 elements in a step: 4 bytes per element.
  CHECK_THAT(m.bytes[0], WithinAbs(800, 1e-9));
  CHECK_THAT(m.bytes[3], WithinAbs(400, 1e-9));
  CHECK(m.current_split == std::vector<int>{2});
  CHECK_THAT(m.measured_step_ns, WithinAbs(10'000, 1e-9));
  // Measured exposed: comm ends at +4600, backward at +400.
  CHECK_THAT(m.measured_exposed_ns, WithinAbs(4200, 1e-9));
  auto current = analysis::predict(m, m.current_split);
  // The model replays the run: [2,4) 200-2000, then [0,2) waits for the stream: 2000-4600.
  CHECK_THAT(current.comm_end_ns, WithinAbs(4600, 1e-9));
  CHECK_THAT(current.exposed_ns, WithinAbs(m.measured_exposed_ns, 1e-9));
  // The optimum is never worse than the run's own split.
  CHECK(analysis::predict(m, analysis::optimal_split(m)).comm_end_ns <= current.comm_end_ns);
  CHECK(m.unbucketed == 0);
  // wb suggest-split's text: under the table, every strategy's whole split as a wb-train flag.
  std::ostringstream text;
  analysis::write_split_suggestions(run, text);
  CAPTURE(text.str());
  for (const auto& sug : analysis::suggest_splits(m)) {
    CHECK(text.str().find("    " + sug.strategy + ": wb-train --allreduce-split " +
                          analysis::format_split(sug.prediction.split) + "\n") != std::string::npos);
  }

  // A parameter in no bucket carries no bytes and leaves the others' bytes per element alone.
  const fs::path sharded_file = dir / "sharded.sqlite";
  write(sharded_file, true);
  auto sharded = analysis::build_split_model(analysis::load_run(sharded_file));
  REQUIRE(sharded.size() == 5);
  CHECK(sharded.unbucketed == 1);
  CHECK(sharded.bytes[4] == 0.0);
  CHECK_THAT(sharded.bytes[0], WithinAbs(800, 1e-9));
  CHECK_THAT(sharded.bytes[3], WithinAbs(400, 1e-9));
  CHECK_THAT(analysis::predict(sharded, sharded.current_split).comm_end_ns, WithinAbs(4600, 1e-9));

  fs::path empty = dir / "empty.sqlite";
  {
    store::WriterOptions o;
    o.path = empty;
    o.handle_signals = false;
    store::Writer w(o);
    w.finish();
  }
  REQUIRE_THROWS_AS(analysis::build_split_model(analysis::load_run(empty)), analysis::AnalysisError);
}

namespace {

// Two ranks, two parameters of 100 floats (400 B), buckets {p1} and {p0} (split 1), two steps each.
// Rank 0's backward runs t..t+2000 (m1 ends at +1000, m0 at +2000); rank 1's starts 500 ns later.
// Measured collectives: {p1} from each rank's ready time to t+1600; {p0} from each rank's ready time to
// t+2700. Calibration: alone 200 ns at 400 B and 2000 ns at 4000 B (0.5 ns/B), 600 ns at 400 B while
// backward runs, compute twice as slow while a collective runs (s = 1).
analysis::RunData calibrated_run() {
  analysis::RunData run;
  run.strings = {"", "main", "m0", "m1", "step"};
  for (int r = 0; r < 2; ++r) run.tracks.push_back(store::TrackRow{static_cast<std::uint32_t>(r + 1), r, store::TrackKind::thread, 1});
  run.params = {store::ParamRow{0, "m0.weight", {100}, 100, 1, true}, store::ParamRow{1, "m1.weight", {100}, 100, 0, true}};
  for (int s = 0; s < 2; ++s) {
    const std::int64_t t = 1'000'000 * (s + 1);
    for (int r = 0; r < 2; ++r) {
      const std::int64_t b = t + 500 * r;
      const auto track = static_cast<std::uint32_t>(r + 1);
      auto& ranges = run.ranges[track];
      ranges.push_back(store::RangeRow{track, 4, t - 5000, t + 5000, 7, 0, s, 0});
      ranges.push_back(store::RangeRow{track, 3, b, b + 1000, 1, 1, s, 0});
      ranges.push_back(store::RangeRow{track, 2, b + 1000, b + 2000, 1, 1, s, 0});
      run.steps.push_back(store::StepRow{r, s, t - 5000, t + 5000, 0, 0, 1.0, 0.1, 8});
      run.allreduces.push_back(store::AllreduceRow{r, s, 0, 1, 1, 400, b + 1000, b + 1000, t + 1600});
      run.allreduces.push_back(store::AllreduceRow{r, s, 1, 0, 0, 400, b + 2000, b + 2000, t + 2700});
    }
  }
  for (int r = 0; r < 2; ++r) {
    run.calibration.push_back(store::CommCalibrationRow{r, "allreduce", 400, 5, 200, 190});
    run.calibration.push_back(store::CommCalibrationRow{r, "allreduce", 4000, 5, 2000, 1900});
    run.calibration.push_back(store::CommCalibrationRow{r, "allreduce_during_compute", 400, 8, r == 0 ? 900 : 600, 500});
    run.calibration.push_back(store::CommCalibrationRow{r, "compute", 0, 9, 1000, 990});
    run.calibration.push_back(store::CommCalibrationRow{r, "compute_during_allreduce", 400, 9, 2000, 1900});
  }
  return run;
}

}  // namespace

TEST_CASE("the calibrated model simulates every rank, and a collective starts when the last rank joins",
          "[analysis]") {
  const analysis::RunData run = calibrated_run();
  const SplitModel m = analysis::build_split_model(run);
  REQUIRE(m.calibrated);
  REQUIRE(m.ranks.size() == 2);
  // The run's own collectives are points of the curves at their sizes, in place of the calibration's: {p1}
  // ran while backward did, 100 ns from its last rank's join (1500) to its end (1600), not the
  // calibration's 600; {p0} ran after backward, 200 ns from 2500 to 2700, as the calibration says alone.
  CHECK(m.run_point_bytes == std::vector<double>{400, 400});
  CHECK_THAT(analysis::allreduce_during_ns(m, 400), WithinAbs(100, 1e-9));
  CHECK_THAT(analysis::allreduce_ns(m, 400), WithinAbs(200, 1e-9));
  {
    // At a size the run did not reduce the calibration holds: while computing, the rank that marked last
    // is the collective's cost (rank 1's 6000 ns, not rank 0's 9000).
    analysis::RunData far = calibrated_run();
    for (auto& c : far.calibration)
      if (c.kind == "allreduce_during_compute") c = store::CommCalibrationRow{c.rank, c.kind, 4000, 8, c.rank == 0 ? 9000 : 6000, 5000};
    const SplitModel mf = analysis::build_split_model(far);
    CHECK_THAT(analysis::allreduce_during_ns(mf, 4000), WithinAbs(6000, 1e-9));
    CHECK_THAT(analysis::allreduce_during_ns(mf, 400), WithinAbs(100, 1e-9));
  }
  {
    // A larger message never costs less: a median of 3000 ns at 2000 B above 2000 ns at 4000 B is pooled
    // with it, 2500 ns at both; the run's own 200 ns at 400 B stays below them.
    analysis::RunData noisy = calibrated_run();
    for (int r = 0; r < 2; ++r) noisy.calibration.push_back(store::CommCalibrationRow{r, "allreduce", 2000, 5, 3000, 2900});
    const SplitModel mn = analysis::build_split_model(noisy);
    CHECK_THAT(analysis::allreduce_ns(mn, 400), WithinAbs(200, 1e-9));
    CHECK_THAT(analysis::allreduce_ns(mn, 2000), WithinAbs(2500, 1e-9));
    CHECK_THAT(analysis::allreduce_ns(mn, 4000), WithinAbs(2500, 1e-9));
  }
  CHECK_THAT(analysis::allreduce_ns(m, 800), WithinAbs(400, 1e-9));   // between the sizes
  CHECK_THAT(analysis::allreduce_ns(m, 8000), WithinAbs(4000, 1e-9)); // past the largest: the last slope
  CHECK_THAT(analysis::compute_slowdown(m, 400), WithinAbs(1.0, 1e-9));
  // Work: rank 0's {p1} collective ran 1000..1600 inside its backward: 600 ns at half speed, 300 ns of work
  // lost, so its backward is 1700 ns of work; rank 1's ran 1500..1600 (relative 1000..1100): 50 lost.
  CHECK_THAT(m.ranks[0].offset_ns, WithinAbs(0, 1e-9));
  CHECK_THAT(m.ranks[1].offset_ns, WithinAbs(500, 1e-9));
  CHECK_THAT(m.ranks[0].ready_work[1], WithinAbs(1000, 1e-9));
  CHECK_THAT(m.ranks[0].compute_work, WithinAbs(1700, 1e-9));
  CHECK_THAT(m.ranks[1].compute_work, WithinAbs(1950, 1e-9));
  CHECK_THAT(m.measured_tail_ns, WithinAbs(2700, 1e-9));

  // The run's own split, by hand: {p1} is ready on rank 0 at 1000 and on rank 1 at 1500; it starts at
  // 1500 (the last rank to join) and takes 100: 1500..1600. Rank 0 computes at half speed from 1000 to
  // 1600 (300 of work, 1300 done), then 400 more: p0 at 2000. Rank 1, half speed 1500..1600 (50 work,
  // 1050 done), 900 more: 2500. {p0} runs alone after backward: 2500..2700, the measured tail.
  const analysis::Prediction own = analysis::predict(m, m.current_split);
  REQUIRE(own.buckets.size() == 2);
  CHECK_THAT(own.buckets[0].start_ns, WithinAbs(1500, 1e-9));
  CHECK_THAT(own.buckets[0].end_ns, WithinAbs(1600, 1e-9));
  CHECK_THAT(own.buckets[1].ready_ns, WithinAbs(2500, 1e-9));
  CHECK_THAT(own.buckets[1].end_ns, WithinAbs(2700, 1e-9));
  CHECK_THAT(own.compute_end_ns, WithinAbs(2500, 1e-9));
  CHECK_THAT(m.current_tail_ns, WithinAbs(m.measured_tail_ns, 1e-9));
  CHECK_THAT(own.step_ns, WithinAbs(10'000, 1e-9));  // the measured step: the run's own split replayed

  // One bucket after backward: rank 0 ready at 1700, rank 1 at 500 + 1950 = 2450; 800 B alone: 400 ns.
  const analysis::Prediction single = analysis::predict(m, std::vector<int>{});
  CHECK_THAT(single.buckets[0].start_ns, WithinAbs(2450, 1e-9));
  CHECK_THAT(single.comm_end_ns, WithinAbs(2850, 1e-9));
  CHECK_THAT(single.step_ns, WithinAbs(10'000 + 2850 - 2700, 1e-9));

  // The alpha-beta model of the same run knows nothing of ranks: its {p1} starts at rank-mean ready time.
  CHECK(analysis::predict_alpha_beta(m, m.current_split).buckets[0].start_ns < 1500);
  // The report says which model it used.
  std::ostringstream text;
  analysis::write_split_suggestions(run, text);
  CHECK(text.str().find("cost model: the communicator's calibration, simulated across 2 ranks") != std::string::npos);
  CHECK(text.str().find("The model's pick:") != std::string::npos);
}

TEST_CASE("a rank waiting in a collective for a later rank is slowed as its calibration says", "[analysis]") {
  // The run above with a compute_while_waiting row: a convolution of 1000 ns takes 1500 while the rank's
  // communication thread waits for a late peer, s = 0.5.
  analysis::RunData run = calibrated_run();
  for (int r = 0; r < 2; ++r) run.calibration.push_back(store::CommCalibrationRow{r, "compute_while_waiting", 4096, 10, 1500, 1400});
  const SplitModel m = analysis::build_split_model(run);
  REQUIRE(m.wait_calibrated);
  CHECK_THAT(m.wait_slowdown, WithinAbs(0.5, 1e-12));
  // Rank 0 joined {p1} at 1000 and waited until rank 1 joined at 1500: 500 ns at s = 0.5 lose 166.67 of
  // work; then the collective 1500..1600 at s = 1 loses 50: 1783.33 of work. Rank 1 joined last: it never
  // waited, 1950 as without the row.
  CHECK_THAT(m.ranks[0].compute_work, WithinAbs(2000.0 - 500.0 / 3.0 - 50.0, 1e-6));
  CHECK_THAT(m.ranks[1].compute_work, WithinAbs(1950, 1e-9));
  // The run's own split replayed: rank 0 waits 1000..1500 (333.33 of work done), computes at half speed to
  // 1600 (1383.33), is ready with p0 at 2000; rank 1 as before at 2500: {p0} 2500..2700, the measured step.
  const analysis::Prediction own = analysis::predict(m, m.current_split);
  CHECK_THAT(own.buckets[0].ready_ns, WithinAbs(1500, 1e-9));
  CHECK_THAT(own.buckets[1].ready_ns, WithinAbs(2500, 1e-9));
  CHECK_THAT(own.step_ns, WithinAbs(10'000, 1e-9));
  // Without the row the wait costs the collective's own s (as in files calibrated before the row existed).
  const SplitModel old = analysis::build_split_model(calibrated_run());
  CHECK_FALSE(old.wait_calibrated);
  CHECK_THAT(old.ranks[0].compute_work, WithinAbs(1700, 1e-9));
  std::ostringstream text;
  analysis::write_split_suggestions(run, text);
  CHECK(text.str().find("while a rank waits in a collective for a later rank: backward slowed x1.50") != std::string::npos);
}
