// The second run the app lays beside the first: its timeline aligned by step start, per-op deltas
// matched by name and category, and a layer's time against the second run's on the colour scale.
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
