// Step breakdown and input starvation on hand-built runs with known answers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "profiler/analysis/steps.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using store::Category;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

constexpr std::int64_t kMs = 1'000'000;

// A scratch directory for one run file.
struct RunDir {
  wb::test::TempDir tmp;
  fs::path dir = tmp.path();
  fs::path file() const { return dir / "run.sqlite"; }
};

store::RangeRow rr(std::uint32_t track, std::uint32_t name, std::int64_t s, std::int64_t e, Category c, int depth, int step) {
  return store::RangeRow{track, name, s, e, static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(depth), step, 0};
}

// Ten 10 ms steps: 3 ms waiting for data, 3 forward, 3 backward, 0.5 optimizer, 0.5 unaccounted.
// step_row_wait: whether the step rows carry data_wait_ns (else only the data ranges tell it).
void write_starved_run(const fs::path& file, bool step_row_wait, const std::string& config = "") {
  store::WriterOptions o;
  o.path = file;
  o.handle_signals = false;
  store::Writer w(o);
  if (!config.empty()) w.set_meta("config_json", config);
  std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
  std::uint32_t step = w.intern("step"), wait = w.intern("data wait"), fwd = w.intern("forward"), bwd = w.intern("backward"),
                sgd = w.intern("sgd"), batch = w.intern("batch");
  for (int i = 0; i < 10; ++i) {
    std::int64_t t = i * 10 * kMs;
    w.add(rr(main, step, t, t + 10 * kMs, Category::step, 0, i));
    w.add(rr(main, wait, t, t + 3 * kMs, Category::data, 1, i));
    w.add(rr(main, fwd, t + 3 * kMs, t + 6 * kMs, Category::forward, 1, i));
    w.add(rr(main, bwd, t + 6 * kMs, t + 9 * kMs, Category::backward, 1, i));
    w.add(rr(main, sgd, t + 9 * kMs, t + 9 * kMs + kMs / 2, Category::optimizer, 1, i));
    w.add(store::StepRow{0, i, t, t + 10 * kMs, step_row_wait ? 3 * kMs : 0, 0, 1.0, 0.1, 32});
  }
  // Step 0 also reduces gradients: one bucket from 8 to 9.5 ms, backward ends at 9 ms -> 0.5 ms exposed.
  w.add(store::AllreduceRow{0, 0, 0, 0, 9, 4096, 8 * kMs, 8 * kMs, 9 * kMs + kMs / 2});
  // Two data workers; each batch takes 20 ms -> 50 batches/s per worker.
  for (int k = 0; k < 2; ++k) {
    std::uint32_t worker = w.add_track(store::TrackKind::thread, "data-worker-" + std::to_string(k));
    for (int b = 0; b < 5; ++b) w.add(rr(worker, batch, b * 20 * kMs, (b + 1) * 20 * kMs, Category::data, 0, -1));
  }
  // Queue depth at every push and pop: 1 0 1 0 1 2 1 0 1 0 at 0,10,30,60,100,110,120,130,170,200 ms.
  std::uint32_t queue = w.add_track(store::TrackKind::queue, "batch queue");
  const double depth[] = {1, 0, 1, 0, 1, 2, 1, 0, 1, 0};
  const std::int64_t at[] = {0, 10, 30, 60, 100, 110, 120, 130, 170, 200};
  for (int i = 0; i < 10; ++i) w.add(store::CounterRow{queue, at[i] * kMs, depth[i]});
  w.finish();
}

}  // namespace

TEST_CASE("step breakdown splits each step into compute, data wait, exposed comm and other", "[analysis]") {
  RunDir d;
  write_starved_run(d.file(), true);
  auto run = analysis::load_run(d.file());
  auto steps = analysis::step_breakdown(run);
  REQUIRE(steps.size() == 10);
  CHECK(steps[0].total_ns == 10 * kMs);
  CHECK(steps[0].compute_ns == 6 * kMs + kMs / 2);
  CHECK(steps[0].data_wait_ns == 3 * kMs);
  CHECK(steps[0].comm_exposed_ns == kMs / 2);
  CHECK(steps[0].other_ns == 0);
  for (std::size_t i = 1; i < steps.size(); ++i) {
    CAPTURE(i);
    CHECK(steps[i].step == static_cast<int>(i));
    CHECK(steps[i].compute_ns == 6 * kMs + kMs / 2);
    CHECK(steps[i].comm_exposed_ns == 0);
    CHECK(steps[i].other_ns == kMs / 2);
  }
}

TEST_CASE("a consumer that waited exactly 30% of the time is reported 30% input-bound", "[analysis]") {
  for (bool from_step_rows : {true, false}) {
    SECTION(from_step_rows ? "wait from step rows" : "wait from data ranges") {
      RunDir d;
      write_starved_run(d.file(), from_step_rows);
      auto st = analysis::starvation(analysis::load_run(d.file()));
      REQUIRE(st.per_rank.size() == 1);
      CHECK(st.per_rank[0].steps == 10);
      CHECK(st.per_rank[0].wait_ns == 30 * kMs);
      CHECK_THAT(st.per_rank[0].percent, WithinAbs(30.0, 1e-9));
      CHECK(st.per_rank[0].level == analysis::InputBound::highly);
      CHECK_THAT(st.overall.percent, WithinAbs(30.0, 1e-9));
    }
  }
}

TEST_CASE("input-bound thresholds follow TensorFlow Profiler", "[analysis]") {
  CHECK(analysis::classify_input_bound(4.99) == analysis::InputBound::no);
  CHECK(analysis::classify_input_bound(5.0) == analysis::InputBound::moderately);
  CHECK(analysis::classify_input_bound(20.0) == analysis::InputBound::moderately);
  CHECK(analysis::classify_input_bound(20.01) == analysis::InputBound::highly);
}

TEST_CASE("empty-queue ratio, starvation spells, rates and the workers needed", "[analysis]") {
  RunDir d;
  write_starved_run(d.file(), true);
  auto st = analysis::starvation(analysis::load_run(d.file()), 5);
  REQUIRE(st.queues.size() == 1);
  const auto& q = st.queues[0];
  CHECK(q.name == "batch queue");
  CHECK(q.samples == 10);
  CHECK(q.empty_samples == 4);
  CHECK_THAT(q.empty_ratio, WithinAbs(0.4, 1e-12));
  CHECK(q.flagged);  // above MindInsight's 30 %
  CHECK(q.pushes == 5);
  CHECK(q.pops == 5);
  CHECK_THAT(q.producer_per_s, WithinRel(25.0, 1e-12));  // 5 pushes in 200 ms
  CHECK_THAT(q.consumer_per_s, WithinRel(25.0, 1e-12));
  // Spells: 10-30, 60-100, 130-170 ms (the one opening at the last sample has no length).
  REQUIRE(q.longest_spells.size() == 3);
  CHECK(q.longest_spells[0].duration_ns() == 40 * kMs);
  CHECK(q.longest_spells[0].start_ns == 60 * kMs);
  CHECK(q.longest_spells[0].step == 6);
  CHECK(q.longest_spells[1].start_ns == 130 * kMs);
  CHECK(q.longest_spells[2].duration_ns() == 20 * kMs);
  CHECK(q.longest_spells[2].step == 1);
  // Demand: one batch per 7 ms of non-waiting step time; each worker makes 50 batches/s.
  CHECK(st.workers == 2);
  CHECK_THAT(st.demand_per_s, WithinRel(1000.0 / 7.0, 1e-12));
  CHECK_THAT(st.per_worker_per_s, WithinRel(50.0, 1e-12));
  CHECK(st.workers_needed == 3);
}

TEST_CASE("the configured worker count wins over counting worker tracks", "[analysis]") {
  RunDir d;
  write_starved_run(d.file(), true, R"({"data_workers": 4})");
  auto st = analysis::starvation(analysis::load_run(d.file()));
  CHECK(st.workers == 4);
  CHECK(st.workers_needed == 3);
}

TEST_CASE("empty_spells on edge cases", "[analysis]") {
  CHECK(analysis::empty_spells({}).empty());
  auto open = analysis::empty_spells({{1, 0, 0.0}, {1, 50, 0.0}, {1, 80, 0.0}});
  REQUIRE(open.size() == 1);  // still empty at the end: closes at the last sample
  CHECK(open[0].start_ns == 0);
  CHECK(open[0].end_ns == 80);
  CHECK(analysis::empty_spells({{1, 0, 2.0}, {1, 5, 1.0}}).empty());
}

TEST_CASE("OverlapFinder finds exactly the ranges a scan finds, long and zero-length ranges included", "[analysis]") {
  // Random nested and overlapping ranges by start, a few of them around everything; windows of every size.
  std::mt19937_64 rng(7);
  std::vector<store::RangeRow> rows;
  std::int64_t t = 0;
  for (int i = 0; i < 4000; ++i) {
    t += static_cast<std::int64_t>(rng() % 50);
    const std::int64_t d = i % 997 == 0 ? 1'000'000 : static_cast<std::int64_t>(rng() % 400);  // some zero
    rows.push_back(rr(1, 0, t, t + d, Category::forward, 0, 0));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  for (std::int64_t short_ns : {std::int64_t{0}, std::int64_t{100}, std::int64_t{399}, std::int64_t{5000}}) {
    analysis::OverlapFinder finder(rows, short_ns);
    for (int q = 0; q < 300; ++q) {
      const std::int64_t t0 = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(t + 500)) - 200;
      const std::int64_t t1 = t0 + static_cast<std::int64_t>(rng() % 3000);
      std::vector<const store::RangeRow*> want, got;
      for (const auto& r : rows)
        if (r.end_ns > t0 && r.start_ns < t1) want.push_back(&r);
      finder.each(t0, t1, [&](const store::RangeRow& r) { got.push_back(&r); });
      std::sort(got.begin(), got.end());
      CAPTURE(short_ns, t0, t1);
      REQUIRE(got == want);  // pointers into `rows`, in its order: each found once
    }
  }
}
