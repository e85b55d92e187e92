// GPU time per op: device activity rows (as CUPTI records them) are attributed to the host range whose
// correlation id they carry, summed per op next to the host time, and shown by `wb report`.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>

#include "profiler/analysis/kernel_stats.hpp"
#include "profiler/analysis/report.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;

namespace {

// A run file in a scratch directory.
struct TempRun {
  wb::test::TempDir dir;
  fs::path path = dir / "run.sqlite";
};

// Two steps. Each: conv forward (corr 10s+1) launches two kernels of 300 and 200 us; its backward (corr
// 10s+2) one kernel of 700 us; an h2d range (corr 10s+3) one memcpy of 50 us and 4096 bytes. One kernel
// per step carries an id no range has (a library's internal launch): unlinked, 40 us.
// Without kernels: the same host ranges and steps and nothing on the device (a CPU run).
void write_run(const fs::path& path, bool with_kernels) {
  store::WriterOptions o;
  o.path = path;
  o.handle_signals = false;
  store::Writer w(o);
  auto main = w.add_track(store::TrackKind::thread, "main");
  auto stream = w.add_track(store::TrackKind::stream, "stream 7");
  auto conv = w.intern("layer1.0.conv1"), h2d = w.intern("h2d batch");
  auto k_fwd = w.intern("implicit_convolve_sgemm"), k_fwd2 = w.intern("bn_fw_tr_1C11"),
       k_bwd = w.intern("dgrad_engine"), k_copy = w.intern("memcpy HtoD"), k_lib = w.intern("cublas_internal");
  constexpr std::int64_t us = 1000;
  for (int s = 0; s < 2; ++s) {
    const std::int64_t t = s * 10'000 * us;
    const std::uint64_t c = static_cast<std::uint64_t>(10 * s);
    w.add(store::RangeRow{main, h2d, t, t + 100 * us, 5, 0, s, c + 3});
    w.add(store::RangeRow{main, conv, t + 100 * us, t + 200 * us, 0, 0, s, c + 1});
    w.add(store::RangeRow{main, conv, t + 300 * us, t + 350 * us, 1, 0, s, c + 2});
    w.add(store::StepRow{0, s, t, t + 2000 * us, 0, 0, 2.0, 0.1, 32});
    if (!with_kernels) continue;
    w.add(store::KernelRow{stream, k_copy, t + 110 * us, t + 160 * us, c + 3, 1, {0, 0, 0}, {0, 0, 0}, 4096});
    w.add(store::KernelRow{stream, k_fwd, t + 200 * us, t + 500 * us, c + 1, 0, {8, 1, 1}, {256, 1, 1}, 0});
    w.add(store::KernelRow{stream, k_fwd2, t + 500 * us, t + 700 * us, c + 1, 0, {8, 1, 1}, {256, 1, 1}, 0});
    w.add(store::KernelRow{stream, k_bwd, t + 700 * us, t + 1400 * us, c + 2, 0, {8, 1, 1}, {256, 1, 1}, 0});
    w.add(store::KernelRow{stream, k_lib, t + 1400 * us, t + 1440 * us, 999, 0, {1, 1, 1}, {32, 1, 1}, 0});
  }
  w.finish();
}

}  // namespace

TEST_CASE("kernel time is attributed to the op range that launched it", "[analysis]") {
  TempRun run;
  write_run(run.path, true);
  analysis::RunData data = analysis::load_run(run.path);
  analysis::KernelStats k = analysis::kernel_stats(data);
  constexpr std::int64_t us = 1000;
  CHECK(k.activities == 10);
  CHECK(k.linked == 8);
  CHECK(k.device_ns == 2 * (50 + 300 + 200 + 700 + 40) * us);
  CHECK(k.unlinked_ns == 2 * 40 * us);
  REQUIRE(k.by_op.size() == 3);
  // By device time: backward conv 1400 us, forward conv 1000 us, the copy 100 us.
  CHECK(k.by_op[0].op == "layer1.0.conv1");
  CHECK(k.by_op[0].category == store::Category::backward);
  CHECK(k.by_op[0].device_ns == 1400 * us);
  CHECK(k.by_op[0].launches == 2);
  CHECK(k.by_op[0].ranges == 2);
  CHECK(k.by_op[0].host_ns == 100 * us);
  CHECK(k.by_op[1].category == store::Category::forward);
  CHECK(k.by_op[1].device_ns == 1000 * us);
  CHECK(k.by_op[1].launches == 4);
  CHECK(k.by_op[1].ranges == 2);  // two kernels per range, each range counted once
  CHECK(k.by_op[1].host_ns == 200 * us);
  CHECK(k.by_op[2].op == "h2d batch");
  CHECK(k.by_op[2].device_ns == 100 * us);
  REQUIRE(k.by_kernel.size() == 5);
  CHECK(k.by_kernel[0].name == "dgrad_engine");
  CHECK(k.by_kernel[0].count == 2);
  CHECK(k.by_kernel[0].max_ns == 700 * us);
  const auto copy = std::find_if(k.by_kernel.begin(), k.by_kernel.end(), [](const auto& s) { return s.name == "memcpy HtoD"; });
  REQUIRE(copy != k.by_kernel.end());
  CHECK(copy->kind == store::KernelKind::memcpy);
  CHECK(copy->bytes == 2 * 4096);

  std::ostringstream report;
  analysis::write_report(data, report, {});
  const std::string text = report.str();
  INFO(text);
  CHECK(text.find("GPU time by op") != std::string::npos);
  CHECK(text.find("10 device activities, 8 linked to an op (80.0%)") != std::string::npos);
  CHECK(text.find("Top kernels by total time") != std::string::npos);
  CHECK(text.find("dgrad_engine") != std::string::npos);
}

TEST_CASE("a run without device activity has no GPU section in its report", "[analysis]") {
  TempRun run;
  write_run(run.path, false);
  analysis::RunData data = analysis::load_run(run.path);
  CHECK(analysis::kernel_stats(data).activities == 0);
  std::ostringstream report;
  analysis::write_report(data, report, {});
  CHECK(report.str().find("GPU time by op") == std::string::npos);
}
