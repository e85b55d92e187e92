// The pipeline analysis with known answers: the balanced split against brute force over every split,
// the micro-batch count for a bubble under 10% against GPipe's formula, and the bubble of hand-built
// pipeline_step rows (the end-to-end figures come from test_trainer_pipeline).
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>

#include "profiler/analysis/pipeline.hpp"

using namespace wb::analysis;
using Catch::Matchers::WithinAbs;

namespace {

double max_stage(const std::vector<double>& t, const std::vector<int>& first) {
  double worst = 0;
  for (std::size_t s = 0; s + 1 < first.size(); ++s) {
    double sum = 0;
    for (int u = first[s]; u < first[s + 1]; ++u) sum += t[static_cast<std::size_t>(u)];
    worst = std::max(worst, sum);
  }
  return worst;
}

// The smallest largest-stage sum over every way to cut t into `stages` non-empty contiguous runs.
double brute_force(const std::vector<double>& t, int stages) {
  const int n = static_cast<int>(t.size());
  double best = 1e300;
  std::vector<int> first{0};
  std::function<void(int)> go = [&](int from) {
    if (static_cast<int>(first.size()) == stages) {
      first.push_back(n);
      best = std::min(best, max_stage(t, first));
      first.pop_back();
      return;
    }
    for (int u = from + 1; u < n; ++u) {
      first.push_back(u);
      go(u);
      first.pop_back();
    }
  };
  go(0);
  return best;
}

}  // namespace

TEST_CASE("pipeline: the balanced split minimises the slowest stage (against brute force)", "[analysis][pipeline]") {
  CHECK(balanced_split({1, 1, 1, 1}, 2) == std::vector<int>{0, 2, 4});
  CHECK(balanced_split({5, 1, 1, 1, 1, 1}, 2) == std::vector<int>{0, 1, 6});
  CHECK(balanced_split({1, 2, 3}, 3) == std::vector<int>{0, 1, 2, 3});
  CHECK(balanced_split({1, 2}, 3).empty());  // more stages than units
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> time(0.1, 10.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 9);
    const int stages = 1 + static_cast<int>(rng() % std::min(n, 4));
    std::vector<double> t(static_cast<std::size_t>(n));
    for (auto& x : t) x = time(rng);
    const auto first = balanced_split(t, stages);
    CAPTURE(n, stages, t, first);
    REQUIRE(first.size() == static_cast<std::size_t>(stages) + 1);
    CHECK(first.front() == 0);
    CHECK(first.back() == n);
    for (std::size_t s = 0; s + 1 < first.size(); ++s) CHECK(first[s] < first[s + 1]);
    CHECK_THAT(max_stage(t, first), WithinAbs(brute_force(t, stages), 1e-9));
  }
}

TEST_CASE("pipeline: micro-batches for a bubble under 10% follow GPipe's formula", "[analysis][pipeline]") {
  CHECK_THAT(ideal_bubble(2, 4), WithinAbs(0.2, 1e-12));
  CHECK_THAT(ideal_bubble(4, 8), WithinAbs(3.0 / 11.0, 1e-12));
  // Equal stages: (S-1)/(M+S-1) < 0.1 first at M = 9(S-1) + 1.
  CHECK(micro_batches_for_bubble({1.0, 1.0}, 0.10) == 10);
  CHECK(micro_batches_for_bubble({2.0, 2.0, 2.0, 2.0}, 0.10) == 28);
  // Unequal stages: mean bubble 1 - M mean / ((M+S-1) max). 1.2 and 0.9: mean/max 0.875 < 0.9, never.
  CHECK_FALSE(micro_batches_for_bubble({1.2, 0.9}, 0.10).has_value());
  // 1.0 and 0.95: 1 - 0.975 M / (M+1) < 0.1  <=>  M > 0.9 / 0.075 = 12, so 13.
  CHECK(micro_batches_for_bubble({1.0, 0.95}, 0.10) == 13);
}

TEST_CASE("pipeline: the bubble of recorded steps, their mean and the imbalance", "[analysis][pipeline]") {
  RunData run;
  run.meta["pipeline_json"] =
      R"({"stages":2,"replicas":1,"micro_batches":4,"micro_batch_size":8,"schedule":"gpipe","loss":"sum",)"
      R"("stage_units":[{"first_unit":0,"end_unit":8,"first":"head","last":"layer2.3"},)"
      R"({"first_unit":8,"end_unit":18,"first":"layer3.0","last":"fc"}]})";
  // Step 0 warms up (left out of the means); steps 1 and 2 are steady.
  //                     rank step stage rep  start    end  busy  wact  wgrad  war
  run.pipeline_steps = {{0, 0, 0, 0, 0, 1000, 900, 0, 100, 0},
                        {1, 0, 1, 0, 0, 1000, 500, 500, 0, 0},
                        {0, 1, 0, 0, 1000, 2000, 800, 0, 200, 0},
                        {1, 1, 1, 0, 1000, 2000, 400, 100, 0, 0},
                        {0, 2, 0, 0, 2000, 3100, 800, 0, 200, 100},  // 100 ns of allreduce wait left out
                        {1, 2, 1, 0, 2000, 3000, 400, 300, 0, 0}};
  const auto a = analyze_pipeline(run);
  REQUIRE(a.has_value());
  CHECK(a->plan.stages == 2);
  CHECK(a->plan.stage_names == std::vector<std::string>{"head..layer2.3", "layer3.0..fc"});
  CHECK(a->steady_from_step == 1);
  CHECK_THAT(a->ideal, WithinAbs(0.2, 1e-12));
  REQUIRE(a->steps.size() == 6);
  CHECK_THAT(a->steps[4].bubble, WithinAbs(200.0 / 1000.0, 1e-12));
  REQUIRE(a->stages.size() == 2);
  CHECK_THAT(a->stages[0].bubble, WithinAbs(0.2, 1e-12));
  CHECK_THAT(a->stages[1].bubble, WithinAbs((0.1 + 0.3) / 2, 1e-12));
  CHECK_THAT(a->mean_bubble, WithinAbs((0.2 + 0.2) / 2, 1e-12));
  CHECK_THAT(a->stages[0].busy_ns, WithinAbs(800, 1e-9));
  CHECK_THAT(a->imbalance, WithinAbs(800.0 / 600.0, 1e-12));
  // A run without a pipeline has no analysis; a malformed plan is an error naming the key.
  RunData plain;
  CHECK_FALSE(analyze_pipeline(plain).has_value());
  run.meta["pipeline_json"] = "{\"stages\": 2}";
  CHECK_THROWS_WITH(analyze_pipeline(run), Catch::Contains("pipeline_json"));
}
