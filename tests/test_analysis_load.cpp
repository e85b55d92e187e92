// Loading a run for the analyses (analysis::load_run, which `wb` and wb-view both use): the rows read by
// several threads are the rows read by one, progress counts every range and kernel row, and a raised
// cancel flag stops the load with an error naming the file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "profiler/analysis/run_data.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"

using namespace wb;

namespace {

constexpr int kThreads = 6;
constexpr int kStreams = 3;
constexpr std::int64_t kRangesPerThread = 500;
constexpr std::int64_t kKernelsPerStream = 300;

// Thread tracks with nested ranges, stream tracks with kernels, a queue track, steps and a parameter.
void write_run(const std::filesystem::path& path) {
  store::WriterOptions o;
  o.path = path;
  o.handle_signals = false;
  store::Writer w(o);
  const auto op = w.intern("op"), outer = w.intern("outer"), kernel = w.intern("kernel");
  for (int t = 0; t < kThreads; ++t) {
    const auto track = w.add_track(store::TrackKind::thread, "thread " + std::to_string(t));
    for (std::int64_t i = 0; i < kRangesPerThread; i += 2) {
      const std::int64_t start = i * 1000 + t;
      w.add(store::RangeRow{track, outer, start, start + 1900, 0, 0, 0, 0});
      w.add(store::RangeRow{track, op, start + 100, start + 900, 1, 1, 0, static_cast<std::uint64_t>(i + 1)});
    }
  }
  for (int s = 0; s < kStreams; ++s) {
    const auto track = w.add_track(store::TrackKind::stream, "stream " + std::to_string(s));
    for (std::int64_t i = 0; i < kKernelsPerStream; ++i)
      w.add(store::KernelRow{track, kernel, i * 700, i * 700 + 500, static_cast<std::uint64_t>(i + 1), 0, {1, 1, 1}, {32, 1, 1}, 0});
  }
  const auto queue = w.add_track(store::TrackKind::queue, "batches");
  for (int i = 0; i < 10; ++i) w.add(store::CounterRow{queue, i * 100, static_cast<double>(i % 4)});
  w.add(store::StepRow{0, 0, 0, 600'000, 0, 0, 2.0, 0.1, 32});
  w.finish();
}

}  // namespace

TEST_CASE("a run read by several threads holds the rows read by one, with progress over all of them", "[analysis]") {
  test::TempDir dir;
  const auto path = dir / "run.sqlite";
  write_run(path);

  const analysis::RunData one = analysis::load_run(path);
  CHECK(one.ranges.size() == static_cast<std::size_t>(kThreads));
  CHECK(one.kernels.size() == static_cast<std::size_t>(kStreams));
  CHECK(one.counters.size() == 1);
  CHECK(one.kernel_rows == kStreams * kKernelsPerStream);
  for (const auto& [track, rows] : one.ranges) {
    CHECK(static_cast<std::int64_t>(rows.size()) == kRangesPerThread);
    CHECK(std::is_sorted(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; }));
  }

  std::mutex mutex;
  std::int64_t most = 0, total = -1, calls = 0;
  analysis::LoadOptions options;
  options.threads = 4;
  options.progress = [&](std::int64_t done, std::int64_t all) {
    std::lock_guard lock(mutex);
    most = std::max(most, done);
    total = all;
    ++calls;
  };
  const analysis::RunData many = analysis::load_run(path, options);
  CHECK(many.ranges == one.ranges);
  CHECK(many.kernels == one.kernels);
  CHECK(many.counters == one.counters);
  CHECK(many.steps == one.steps);
  CHECK(many.tracks == one.tracks);
  CHECK(many.strings == one.strings);
  CHECK(many.kernel_rows == one.kernel_rows);
  CHECK(calls >= kThreads + kStreams);  // at least once per track
  CHECK(total == kThreads * kRangesPerThread + kStreams * kKernelsPerStream);
  CHECK(most == total);
}

TEST_CASE("a cancelled load stops with an error naming the file", "[analysis]") {
  test::TempDir dir;
  const auto path = dir / "run.sqlite";
  write_run(path);
  std::atomic<bool> cancel{true};
  analysis::LoadOptions options;
  options.threads = 2;
  options.cancel = &cancel;
  REQUIRE_THROWS_AS(analysis::load_run(path, options), analysis::LoadCancelled);
  CHECK(test::error_message<analysis::LoadCancelled>([&] { analysis::load_run(path, options); }).find("run.sqlite") !=
        std::string::npos);
  cancel = false;
  CHECK(analysis::load_run(path, options).ranges.size() == static_cast<std::size_t>(kThreads));
}
