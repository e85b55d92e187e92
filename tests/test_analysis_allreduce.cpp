// Allreduce analyses: DDP overlap/exposed on hand-made spans, bucket statistics, alpha-beta fits.
#include <catch2/catch.hpp>

#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "profiler/analysis/allreduce.hpp"
#include "support/python.hpp"

using namespace wb;
using store::AllreduceRow;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

TEST_CASE("communication, overlap and exposed time follow DDP's logger", "[analysis]") {
  SECTION("communication that outlasts backward") {
    // Backward compute ends at 1000; buckets run 600-800 and 850-1200.
    std::vector<AllreduceRow> rows{{0, 3, 0, 5, 9, 100, 550, 600, 800}, {0, 3, 1, 0, 4, 300, 700, 850, 1200}};
    auto c = analysis::step_comm(rows, 1000);
    CHECK(c.rank == 0);
    CHECK(c.step == 3);
    CHECK(c.buckets == 2);
    CHECK(c.bytes == 400);
    CHECK(c.comm_start_ns == 600);
    CHECK(c.comm_end_ns == 1200);
    CHECK(c.comm_ns == 600);
    CHECK(c.overlap_ns == 400);
    CHECK(c.exposed_ns == 200);
  }
  SECTION("communication that starts after backward is all exposed") {
    std::vector<AllreduceRow> rows{{0, 0, 0, 0, 9, 100, 400, 600, 700}};
    auto c = analysis::step_comm(rows, 500);
    CHECK(c.overlap_ns == 0);
    CHECK(c.exposed_ns == 100);
  }
  SECTION("communication hidden behind backward") {
    std::vector<AllreduceRow> rows{{0, 0, 0, 0, 9, 100, 100, 200, 300}};
    auto c = analysis::step_comm(rows, 500);
    CHECK(c.overlap_ns == 100);
    CHECK(c.exposed_ns == 0);
  }
  REQUIRE_THROWS_AS(analysis::step_comm(std::vector<AllreduceRow>{}, 0), analysis::AnalysisError);
}

TEST_CASE("bucket statistics: ready-to-start latency and duration per bucket", "[analysis]") {
  std::vector<AllreduceRow> rows{
      {0, 0, 0, 85, 160, 1000, 100, 110, 160},  // latency 10, duration 50
      {0, 1, 0, 85, 160, 1000, 200, 230, 270},  // latency 30, duration 40
      {1, 0, 0, 85, 160, 1000, 100, 120, 180},  // latency 20, duration 60
      {0, 0, 1, 0, 84, 500, 300, 300, 310},
  };
  auto b = analysis::bucket_stats(rows);
  REQUIRE(b.size() == 2);
  CHECK(b[0].bucket == 0);
  CHECK(b[0].first_param == 85);
  CHECK(b[0].last_param == 160);
  CHECK(b[0].samples == 3);
  CHECK_THAT(b[0].mean_latency_ns, WithinAbs(20.0, 1e-12));
  CHECK(b[0].max_latency_ns == 30);
  CHECK_THAT(b[0].mean_duration_ns, WithinAbs(50.0, 1e-12));
  CHECK(b[0].max_duration_ns == 60);
  CHECK(b[1].samples == 1);
  CHECK_THAT(b[1].mean_latency_ns, WithinAbs(0.0, 1e-12));
}

TEST_CASE("the alpha-beta fit recovers a known alpha and beta", "[analysis]") {
  // t = 25 us + 0.5 ns/B * bytes, exactly.
  std::vector<AllreduceRow> rows;
  for (int i = 0; i < 8; ++i) {
    std::int64_t bytes = std::int64_t{4096} << (2 * i);
    std::int64_t dur = 25'000 + bytes / 2;
    rows.push_back({0, i, 0, 0, 0, bytes, 0, 1000, 1000 + dur});
  }
  auto fit = analysis::fit_alpha_beta(rows);
  REQUIRE(fit.valid);
  CHECK(fit.samples == 8);
  CHECK_THAT(fit.alpha_ns, WithinAbs(25'000.0, 1e-2));
  CHECK_THAT(fit.beta_ns_per_byte, WithinRel(0.5, 1e-12));
  CHECK_THAT(fit.r2, WithinAbs(1.0, 1e-12));
  CHECK_THAT(fit.predict(1e6), WithinRel(25'000.0 + 0.5e6, 1e-12));
}

TEST_CASE("the alpha-beta fit matches numpy.polyfit on noisy spans", "[analysis]") {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0.0, 2000.0);
  std::vector<std::pair<double, double>> xy;
  std::string xs, ys;
  for (int i = 0; i < 200; ++i) {
    double x = static_cast<double>(1 + rng() % 100'000'000);
    double y = 50'000.0 + 0.3 * x + noise(rng);
    xy.emplace_back(x, y);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g,", x);
    xs += buf;
    std::snprintf(buf, sizeof buf, "%.17g,", y);
    ys += buf;
  }
  auto fit = analysis::fit_alpha_beta(xy);
  const wb::test::ProcessResult py =
      wb::test::run_python("-c \"import numpy as np; x=np.array([" + xs + "]); y=np.array([" + ys +
                           "]); b,a=np.polyfit(x,y,1); r=np.corrcoef(x,y)[0,1]; print(repr(a), repr(b), repr(r*r))\"");
  INFO(py.output);
  REQUIRE(py.exit_code == 0);
  std::istringstream in(py.out);
  double a = 0, b = 0, r2 = 0;
  in >> a >> b >> r2;
  CHECK_THAT(fit.alpha_ns, WithinRel(a, 1e-6));
  CHECK_THAT(fit.beta_ns_per_byte, WithinRel(b, 1e-9));
  CHECK_THAT(fit.r2, WithinRel(r2, 1e-9));
}

TEST_CASE("the alpha-beta fit needs two sizes", "[analysis]") {
  std::vector<std::pair<double, double>> one_size{{1000, 50}, {1000, 70}};
  auto fit = analysis::fit_alpha_beta(one_size);
  CHECK_FALSE(fit.valid);
  CHECK_THAT(fit.alpha_ns, WithinAbs(60.0, 1e-12));
  CHECK_FALSE(analysis::fit_alpha_beta(std::vector<std::pair<double, double>>{}).valid);
}
