// The `wb report` text and its warnings on hand-built multi-rank runs: dropped events, input-bound
// ranks, exposed communication, stragglers and incomplete runs are all named.
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>
#include <string>

#include "profiler/analysis/report.hpp"
#include "store/merge.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using analysis::concat;

namespace {

constexpr std::int64_t kMs = 1'000'000;

// A scratch directory with an empty run/ folder for rank files.
struct RunDir {
  wb::test::TempDir tmp;
  fs::path dir = tmp.path();
  RunDir() { fs::create_directories(dir / "run"); }
};

// Rank 0: 10 ms steps with 3 ms data wait and 1 ms of exposed allreduce. Rank 1: 12 ms steps, no wait,
// and 5 events dropped by its recorder.
void write_rank(const fs::path& dir, int rank, bool finish) {
  store::WriterOptions o;
  o.path = dir / concat("rank-", std::to_string(rank), ".sqlite");
  o.rank = rank;
  o.handle_signals = false;
  store::Writer w(o);
  w.set_meta("world_size", "2");
  std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
  std::uint32_t step = w.intern("step"), conv = w.intern("layer1.0.conv1"), wait = w.intern("data wait");
  for (int i = 0; i < 2; ++i) w.add(store::ParamRow{i, concat("layer1.0.conv", std::to_string(i + 1), ".weight"), {64}, 64, 0, true});
  std::int64_t len = rank == 0 ? 10 * kMs : 12 * kMs;
  for (int s = 0; s < 6; ++s) {
    std::int64_t t = s * 20 * kMs;
    w.add(store::RangeRow{main, step, t, t + len, 7, 0, s, 0});
    std::int64_t wait_ns = rank == 0 ? 3 * kMs : 0;
    if (wait_ns > 0) w.add(store::RangeRow{main, wait, t, t + wait_ns, 4, 1, s, 0});
    w.add(store::RangeRow{main, conv, t + wait_ns, t + wait_ns + 2 * kMs, 0, 1, s, 0});
    w.add(store::RangeRow{main, conv, t + wait_ns + 2 * kMs, t + len - 2 * kMs, 1, 1, s, 0});
    w.add(store::StepRow{rank, s, t, t + len, wait_ns, 0, 2.0, 0.1, 32});
    std::int64_t bwd_end = t + len - 2 * kMs;
    w.add(store::AllreduceRow{rank, s, 0, 0, 1, 512, bwd_end - kMs, bwd_end - kMs, bwd_end + kMs});
  }
  if (rank == 1) w.count_dropped(5);
  if (finish) w.finish();
}

bool has_warning(const std::vector<analysis::Warning>& w, const std::string& kind, const std::string& text) {
  for (const auto& x : w)
    if (x.kind == kind && x.message.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("report warnings name dropped events, input-bound ranks, exposed comm and stragglers", "[analysis]") {
  RunDir d;
  write_rank(d.dir / "run", 0, true);
  write_rank(d.dir / "run", 1, true);
  auto merged = store::merge_run(d.dir / "run");
  auto run = analysis::load_run(merged.out);
  REQUIRE(run.rank_ids() == std::vector<int>{0, 1});

  auto warnings = analysis::run_warnings(run);
  CAPTURE(warnings.size());
  CHECK(has_warning(warnings, "dropped", "rank 1 dropped 5 events"));
  CHECK_FALSE(has_warning(warnings, "dropped", "rank 0"));
  CHECK(has_warning(warnings, "input-bound", "rank 0 is highly input-bound: 30.0%"));
  CHECK_FALSE(has_warning(warnings, "input-bound", "rank 1"));
  // Exposed: 1 ms of 10 ms on rank 0 and of 12 ms on rank 1, both above 5 %.
  CHECK(has_warning(warnings, "exposed-comm", "rank 0: exposed allreduce time is 10.0%"));
  CHECK(has_warning(warnings, "straggler", "rank 1 is the slowest in 100% of steps"));
  CHECK_FALSE(has_warning(warnings, "incomplete", ""));

  auto stragglers = analysis::find_stragglers(run);
  REQUIRE(stragglers.size() == 1);
  CHECK(stragglers[0].rank == 1);

  std::ostringstream out;
  analysis::write_report(run, out);
  std::string text = out.str();
  CAPTURE(text);
  for (const char* section : {"Warnings (", "Time by category", "Top ops by total time", "Step breakdown", "Input pipeline",
                              "Allreduce buckets", "per step (DDP logger)", "Allreduce split suggestions", "optimal (DP)",
                              "MG-WFBP", "DDP 25 MB"}) {
    CHECK(text.find(section) != std::string::npos);
  }
  CHECK(text.find("dropped events 5") != std::string::npos);
  CHECK(text.find("[dropped] rank 1 dropped 5 events") != std::string::npos);
  CHECK(text.find("layer1.0.conv1") != std::string::npos);
}

TEST_CASE("a run without drops or problems reports none, and an unfinished one says so", "[analysis]") {
  RunDir d;
  {
    store::WriterOptions o;
    o.path = d.dir / "clean.sqlite";
    o.handle_signals = false;
    store::Writer w(o);
    std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
    std::uint32_t step = w.intern("step");
    for (int s = 0; s < 4; ++s) {
      w.add(store::RangeRow{main, step, s * kMs, (s + 1) * kMs, 7, 0, s, 0});
      w.add(store::StepRow{0, s, s * kMs, (s + 1) * kMs, 0, 0, 1.0, 0.1, 8});
    }
    w.finish();
  }
  auto run = analysis::load_run(d.dir / "clean.sqlite");
  CHECK(run.dropped_events() == 0);
  CHECK(analysis::run_warnings(run).empty());
  std::ostringstream out;
  analysis::write_report(run, out);
  CHECK(out.str().find("dropped events 0") != std::string::npos);
  CHECK(out.str().find("Warnings (0)") != std::string::npos);

  write_rank(d.dir, 0, false);  // never finished: meta.complete stays 0
  auto unfinished = analysis::load_run(d.dir / "rank-0.sqlite");
  CHECK(has_warning(analysis::run_warnings(unfinished), "incomplete", "incomplete"));
}

TEST_CASE("format_ns picks a readable unit", "[analysis]") {
  CHECK(analysis::format_ns(850) == "850 ns");
  CHECK(analysis::format_ns(12'345) == "12.3 us");
  CHECK(analysis::format_ns(3'500'000) == "3.500 ms");
  CHECK(analysis::format_ns(2'000'000'000) == "2.000 s");
}

TEST_CASE("the profiler's own cost: measured ns per event x events per step, against the step time", "[analysis]") {
  analysis::RunData run;
  run.meta["profiler_ns_per_event"] = "25.00";
  // 2 ranks x 4 steps of 10 ms; 8000 ranges and 800 counter samples in all: 1100 events per rank-step.
  for (int rank = 0; rank < 2; ++rank) {
    for (int s = 0; s < 4; ++s) run.steps.push_back({rank, s, s * 20 * kMs, s * 20 * kMs + 10 * kMs, 0, 0, 1.0, 0.1, 8});
  }
  run.ranges[1].resize(5000);
  run.ranges[2].resize(3000);
  run.counters[3].resize(800);
  const analysis::ProfilerCost c = analysis::profiler_cost(run);
  REQUIRE(c.known);
  CHECK(c.events_per_step == Approx(1100.0));
  CHECK(c.ns_per_step == Approx(27500.0));
  CHECK(c.percent == Approx(0.275));
  std::ostringstream out;
  analysis::write_report(run, out, {5, false});
  CHECK(out.str().find("profiler cost: 25.0 ns per host event (measured by the run) x 1100 events per step = 27.5 us per "
                       "step, 0.28% of the mean step time (10.000 ms)") != std::string::npos);
  run.meta.erase("profiler_ns_per_event");
  CHECK_FALSE(analysis::profiler_cost(run).known);
}
