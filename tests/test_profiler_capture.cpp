// profiler::Capture on scripted steps, through a real Writer and the run file read back: slow steps
// judged against the running median (none before 5 steps), overlapping windows merged, rows that arrive
// late (after their step was decided) kept or dropped like the others, kernels placed by time, windows
// cut at the run's end; and parse_capture's accepted forms.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "profiler/record/capture.hpp"
#include "profiler/record/recorder.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using wb::test::TempDir;

namespace {

constexpr std::int64_t kMs = 1'000'000;
constexpr std::int64_t kStepGap = 1000 * kMs;  // step s starts at s * 1 s

store::WriterOptions writer_options(const fs::path& file) {
  store::WriterOptions o;
  o.path = file;
  o.handle_signals = false;
  return o;
}

store::RangeRow range(std::int32_t step, std::int64_t t) { return store::RangeRow{1, 1, t, t + 10, 0, 0, step, 0}; }

std::map<std::int32_t, int> per_step(const std::vector<store::RangeRow>& rows) {
  std::map<std::int32_t, int> out;
  for (const auto& r : rows) ++out[r.step];
  return out;
}

}  // namespace

TEST_CASE("capture slow:K: windows around slow steps, merged when they overlap, late rows and kernels placed",
          "[profiler][capture]") {
  TempDir dir;
  const fs::path file = dir / "capture.sqlite";
  std::vector<store::CaptureWindowRow> seen;
  {
    store::Writer writer(writer_options(file));
    profiler::CaptureConfig cfg = profiler::parse_capture("slow:3", 2);
    profiler::Capture cap(writer, cfg, 0);
    // 30 steps of 10 ms; step 2 (too early to judge), 12, 15 and 25 take 100 ms.
    const std::set<int> slow = {2, 12, 15, 25};
    for (int s = 0; s < 30; ++s) {
      const std::int64_t start = s * kStepGap, dur = (slow.count(s) ? 100 : 10) * kMs;
      const store::RangeRow r = range(s, start + kMs);
      cap.hold(std::span<const store::RangeRow>(&r, 1));
      const store::CounterRow c{2, start + 2 * kMs, 1.0};
      const std::int32_t cs = s;
      cap.hold(std::span<const store::CounterRow>(&c, 1), std::span<const std::int32_t>(&cs, 1));
      // A kernel of this step that the device reports only now, after the step's host end.
      const store::KernelRow k{3, 1, start + 3 * kMs, start + 4 * kMs, 0, 0, {1, 1, 1}, {1, 1, 1}, 0};
      cap.hold(std::span<const store::KernelRow>(&k, 1));
      const unsigned t = cap.triggers(s, dur);
      CHECK(((t & profiler::kTriggerSlow) != 0) == (slow.count(s) && s >= 5));
      cap.end_step(s, t, start + dur);
      // Rows that reach the capture late: step s-1 (still held) and step s-3 (decided already).
      if (s >= 3) {
        const store::RangeRow late[] = {range(s - 1, (s - 1) * kStepGap + 5 * kMs), range(s - 3, (s - 3) * kStepGap + 6 * kMs)};
        cap.hold(std::span<const store::RangeRow>(late, 2));
      }
      // A row outside any step never reaches the file.
      const store::RangeRow outside = range(-1, 0);
      cap.hold(std::span<const store::RangeRow>(&outside, 1));
    }
    cap.finish();
    seen = cap.windows();
    CHECK(cap.steps_kept() == 8 + 5);
  }
  store::Reader reader(file);
  const auto windows = reader.capture_windows();
  CHECK(windows == seen);
  REQUIRE(windows.size() == 2);
  CHECK(windows[0].first_step == 10);
  CHECK(windows[0].last_step == 17);  // 12's [10, 14] and 15's [13, 17], merged
  CHECK(windows[0].trigger == "slow");
  CHECK(windows[0].trigger_step == 12);
  CHECK(windows[0].detail.find("step 12: 100.0 ms, 10.0x the running median (10.0 ms)") == 0);
  CHECK(windows[0].detail.find("; then step 15: 100.0 ms") != std::string::npos);
  CHECK(windows[1].first_step == 23);
  CHECK(windows[1].last_step == 27);
  CHECK(windows[1].trigger_step == 25);

  std::set<std::int32_t> kept;
  for (int s = 10; s <= 17; ++s) kept.insert(s);
  for (int s = 23; s <= 27; ++s) kept.insert(s);
  const auto ranges = reader.ranges(1);
  const auto counts = per_step(ranges);
  std::set<std::int32_t> range_steps;
  for (const auto& [s, n] : counts) {
    range_steps.insert(s);
    CAPTURE(s);
    // Its own row, the late row one step on and the late row three steps on (none after the last step).
    const int expected = 1 + (s + 1 < 30 ? 1 : 0) + (s + 3 < 30 ? 1 : 0);
    CHECK(n == expected);
  }
  CHECK(range_steps == kept);
  const auto counters = reader.counters(2);
  CHECK(counters.size() == kept.size());
  for (const auto& c : counters) CHECK(kept.count(static_cast<std::int32_t>(c.t_ns / kStepGap)) == 1);
  const auto kernels = reader.kernels(3);
  CHECK(kernels.size() == kept.size());
  for (const auto& k : kernels) CHECK(kept.count(static_cast<std::int32_t>(k.start_ns / kStepGap)) == 1);
}

TEST_CASE("capture steps:A-B and signal windows are cut at the run's end", "[profiler][capture]") {
  TempDir dir;
  for (const char* text : {"steps:3-40", "steps:50-60"}) {
    CAPTURE(text);
    const fs::path file = dir / (std::string(text).substr(6) + ".sqlite");
    {
      store::Writer writer(writer_options(file));
      profiler::Capture cap(writer, profiler::parse_capture(text, 5), 1);
      for (int s = 0; s < 10; ++s) {
        const store::RangeRow r = range(s, s * kStepGap);
        cap.hold(std::span<const store::RangeRow>(&r, 1));
        cap.end_step(s, cap.triggers(s, 10 * kMs), s * kStepGap + 10 * kMs);
      }
      cap.finish();
    }
    store::Reader reader(file);
    const auto w = reader.capture_windows();
    const auto ranges = reader.ranges(1);
    if (std::string(text) == "steps:3-40") {
      REQUIRE(w.size() == 1);
      CHECK(w[0].rank == 1);
      CHECK(w[0].first_step == 3);
      CHECK(w[0].last_step == 9);
      CHECK(ranges.size() == 7);
    } else {
      CHECK(w.empty());
      CHECK(ranges.empty());
    }
  }
}

TEST_CASE("parse_capture: the accepted forms and their description", "[profiler][capture]") {
  CHECK(profiler::describe(profiler::parse_capture("slow:2.5", 4)) == "slow:2.5 (window 4)");
  CHECK(profiler::describe(profiler::parse_capture("signal", 7)) == "signal (window 7)");
  const auto s = profiler::parse_capture("steps:0-0", 1);
  CHECK(s.mode == profiler::CaptureMode::steps);
  CHECK(s.first == 0);
  CHECK(s.last == 0);
  for (const char* bad : {"slow:1", "slow:", "slow:-3", "slow:nan", "steps:-1-3", "steps:3-", "steps:a-b", "Signal", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(profiler::parse_capture(bad, 5), profiler::ProfilerError);
  }
  CHECK_THROWS_AS(profiler::parse_capture("signal", 0), profiler::ProfilerError);
}
