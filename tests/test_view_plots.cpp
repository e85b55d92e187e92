// The plots' arithmetic: histogram binning, linear and logarithmic, and value axes rounded to 1-2-5.
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
