// Hot-path cost of one host range (begin + end) with a running Recorder writing into a real run file.
// Prints the run-time-disabled cost for reference, then, last, the ns per range against the 20 ns goal.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "store/writer.hpp"

namespace fs = std::filesystem;
using namespace wb;

namespace {

double ns_per_range(profiler::NameId id, int n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    profiler::Range r(id, profiler::Category::forward);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

double nested_ns_per_range(profiler::NameId a, profiler::NameId b, int n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n / 2; ++i) {
    profiler::Range outer(a, profiler::Category::backward);
    profiler::Range inner(b, profiler::Category::backward);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / (n / 2 * 2);
}

// The hardware floor of a range: two timestamp reads and one 32-byte store, nothing else.
double clock_floor_ns(int n) {
  static profiler::detail::Record sink[1024];
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    std::int64_t a = profiler::now_ticks();
    std::int64_t b = profiler::now_ticks();
    sink[i & 1023] = profiler::detail::Record{a, b, 1, 0, 0, 0, 0, 0, 0};
    asm volatile("" ::: "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

}  // namespace

int main() {
  fs::path dir = fs::temp_directory_path() / ("wb_bench_profiler_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const int kPerRep = 1'000'000;
  const int kReps = 7;
  double best = 1e9, best_nested = 1e9, disabled = 1e9, floor = 1e9;
  std::vector<double> reps;
  std::uint64_t dropped = 0;
  {
    store::WriterOptions wo;
    wo.path = dir / "run.sqlite";
    wo.handle_signals = false;
    store::Writer writer(wo);
    profiler::RecorderOptions ro;
    ro.initial_chunks = 512;  // 2M records in flight: one repetition never waits on the flusher
    ro.max_chunks = 512;
    profiler::Recorder rec(writer, ro);
    profiler::set_thread_name("main");
    profiler::NameId a = rec.intern("layer1.0.conv1");
    profiler::NameId b = rec.intern("layer1.0.bn1");
    ns_per_range(a, 100'000);  // warm-up: attaches the thread, touches the chunks
    rec.flush();
    for (int r = 0; r < kReps; ++r) {
      double v = ns_per_range(a, kPerRep);
      reps.push_back(v);
      best = std::min(best, v);
      rec.flush();  // untimed: lets the store absorb the repetition
      best_nested = std::min(best_nested, nested_ns_per_range(a, b, kPerRep));
      rec.flush();
      floor = std::min(floor, clock_floor_ns(kPerRep));
    }
    rec.set_enabled(false);
    for (int r = 0; r < 3; ++r) disabled = std::min(disabled, ns_per_range(a, kPerRep));
    rec.stop();
    dropped = rec.dropped() + writer.dropped();
    writer.finish();
  }
  fs::remove_all(dir);
  std::sort(reps.begin(), reps.end());
  std::printf("clock: %s\n", profiler::ticks_are_tsc() ? "invariant TSC (calibrated to CLOCK_MONOTONIC)" : "CLOCK_MONOTONIC");
  std::printf("ranges per repetition: %d, repetitions: %d, dropped events: %llu\n", kPerRep, kReps,
              static_cast<unsigned long long>(dropped));
  std::printf("disabled at run time (--no-profile): %.2f ns per range\n", disabled);
  std::printf("floor (two timestamp reads + one record store): %.2f ns; recorder overhead above it: %.2f ns\n", floor,
              best - floor);
  std::printf("nested pairs: %.2f ns per range\n", best_nested);
  std::printf("median of repetitions: %.2f ns per range\n", reps[reps.size() / 2]);
  std::printf("ns per range (begin + end, best of %d): %.2f (goal <= 20)\n", kReps, best);
  return 0;
}
