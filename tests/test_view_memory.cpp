// The Memory view: its holder rows fold the rest into one row and still sum to the peak.
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
