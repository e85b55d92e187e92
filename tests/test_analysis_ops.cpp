// Per-op statistics on hand-built ranges with known answers, and percentiles against numpy.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "profiler/analysis/op_stats.hpp"
#include "store/writer.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using analysis::OpStat;
using store::Category;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

store::RangeRow range(std::uint32_t name, std::int64_t s, std::int64_t e, Category c, int depth) {
  return store::RangeRow{1, name, s, e, static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(depth), 0, 0};
}

const OpStat& find(const std::vector<OpStat>& v, const std::string& name, Category c) {
  for (const auto& s : v)
    if (s.name == name && s.category == c) return s;
  FAIL("no stat for " << name);
  return v.front();
}

}  // namespace

TEST_CASE("nearest-rank percentiles", "[analysis]") {
  std::vector<std::int64_t> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  CHECK(analysis::percentile(v, 50) == 50);
  CHECK(analysis::percentile(v, 95) == 95);
  CHECK(analysis::percentile(v, 100) == 100);
  CHECK(analysis::percentile(v, 0) == 1);
  CHECK(analysis::percentile({7}, 95) == 7);
  CHECK(analysis::percentile({}, 50) == 0);
  CHECK(analysis::percentile({10, 20}, 50) == 10);  // ceil(0.5 * 2) = 1st
  CHECK(analysis::percentile({10, 20}, 51) == 20);
}

TEST_CASE("op stats: count, total, self time and percentiles on a hand-built track", "[analysis]") {
  // names: 0 step, 1 conv, 2 relu
  std::vector<std::string> strings{"step", "conv", "relu"};
  std::vector<store::RangeRow> track{
      range(0, 0, 1000, Category::step, 0),
      range(1, 100, 300, Category::forward, 1),
      range(2, 150, 200, Category::forward, 2),
      range(1, 400, 700, Category::forward, 1),
      range(1, 700, 950, Category::backward, 1),
  };
  // A second track: the same op elsewhere, not nested in anything.
  std::vector<store::RangeRow> other{range(1, 5000, 5100, Category::forward, 0)};
  auto stats = analysis::compute_op_stats({&track, &other}, strings);

  const OpStat& conv = find(stats.by_name, "conv", Category::forward);
  CHECK(conv.count == 3);
  CHECK(conv.total_ns == 200 + 300 + 100);
  CHECK(conv.self_ns == 150 + 300 + 100);  // relu's 50 ns are not conv's own time
  CHECK_THAT(conv.mean_ns, WithinAbs(200.0, 1e-9));
  CHECK(conv.p50_ns == 200);
  CHECK(conv.p95_ns == 300);
  CHECK(conv.max_ns == 300);

  const OpStat& conv_bwd = find(stats.by_name, "conv", Category::backward);
  CHECK(conv_bwd.count == 1);
  CHECK(conv_bwd.self_ns == 250);

  const OpStat& step = find(stats.by_name, "step", Category::step);
  CHECK(step.total_ns == 1000);
  CHECK(step.self_ns == 1000 - 200 - 300 - 250);  // children only, not grandchildren

  const OpStat& fwd = find(stats.by_category, "forward", Category::forward);
  CHECK(fwd.count == 4);
  CHECK(fwd.total_ns == 650);
  CHECK(fwd.self_ns == 600);
  // The self times of all categories partition the covered time: 1000 + 100 ns.
  std::int64_t self_sum = 0;
  for (const auto& s : stats.by_category) self_sum += s.self_ns;
  CHECK(self_sum == 1100);
  // Sorted by total time, largest first.
  CHECK(stats.by_name.front().name == "step");
}

TEST_CASE("op stats agree with numpy on random durations", "[analysis]") {
  std::mt19937_64 rng(11);
  std::vector<store::RangeRow> track;
  std::vector<std::int64_t> durations;
  std::int64_t t = 0;
  for (int i = 0; i < 997; ++i) {
    std::int64_t d = 1 + static_cast<std::int64_t>(rng() % 1'000'000);
    durations.push_back(d);
    track.push_back(range(0, t, t + d, Category::backward, 0));
    t += d + static_cast<std::int64_t>(rng() % 100);
  }
  auto stats = analysis::compute_op_stats({&track}, {"op"});
  const OpStat& s = stats.by_name.at(0);

  const wb::test::TempDir dir;
  {
    std::ofstream f(dir / "d.txt");
    for (auto d : durations) f << d << "\n";
  }
  const wb::test::ProcessResult py = wb::test::run_python(
      "-c \"import numpy as np,sys; x=np.loadtxt(sys.argv[1],dtype=np.int64); "
      "print(x.sum(), x.mean(), int(np.percentile(x,50,method='inverted_cdf')), "
      "int(np.percentile(x,95,method='inverted_cdf')), x.max())\" " +
      wb::test::shell_quote((dir / "d.txt").string()));
  INFO(py.output);
  REQUIRE(py.exit_code == 0);
  std::istringstream in(py.out);
  long long sum = 0, p50 = 0, p95 = 0, mx = 0;
  double mean = 0;
  in >> sum >> mean >> p50 >> p95 >> mx;
  CHECK(s.count == 997);
  CHECK(s.total_ns == sum);
  CHECK_THAT(s.mean_ns, WithinRel(mean, 1e-12));
  CHECK(s.p50_ns == p50);
  CHECK(s.p95_ns == p95);
  CHECK(s.max_ns == mx);
}

TEST_CASE("op stats read from a run file, per rank", "[analysis]") {
  const wb::test::TempDir dir;
  {
    store::WriterOptions o;
    o.path = dir / "run.sqlite";
    o.handle_signals = false;
    store::Writer w(o);
    std::uint32_t track = w.add_track(store::TrackKind::thread, "main");
    std::uint32_t conv = w.intern("conv");
    for (int i = 0; i < 10; ++i)
      w.add(store::RangeRow{track, conv, i * 100, i * 100 + 10 * (i + 1), 0, 0, i, 0});
    w.finish();
  }
  auto run = analysis::load_run(dir / "run.sqlite");
  auto stats = analysis::op_stats(run, 0);
  REQUIRE(stats.by_name.size() == 1);
  CHECK(stats.by_name[0].total_ns == 10 * 55);
  CHECK(stats.by_name[0].p95_ns == 100);
  CHECK(analysis::op_stats(run, 3).by_name.empty());
}
