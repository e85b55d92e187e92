// CUPTI activity conversion (hand-built records, no GPU needed) and, on a machine with a GPU ([cuda]:
// skipped without one, see tests/support/main.cpp), a traced memset linked to the host range that issued
// it. CUDA builds only. CUPTI is loaded when a tracer starts, never linked: without it a process starts
// and a tracer is one clear error.
#include <catch2/catch.hpp>

#ifdef WB_PROFILER_CUPTI

#include <cuda_runtime_api.h>
#include <cupti.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "profiler/record/cuda/cupti_tracer.hpp"
#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using profiler::cuda::ActivityConverter;

namespace {

#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
#else
using KernelRecord = CUpti_ActivityKernel9;
using MemcpyRecord = CUpti_ActivityMemcpy5;
#endif

struct Names {
  std::map<std::string, std::uint32_t> ids;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> streams;
  ActivityConverter converter{[this](std::string_view s) { return ids.emplace(std::string(s), static_cast<std::uint32_t>(ids.size() + 1)).first->second; },
                              [this](std::uint32_t d, std::uint32_t s) {
                                return streams.emplace(std::make_pair(d, s), static_cast<std::uint32_t>(100 + streams.size())).first->second;
                              }};
};

CUpti_ActivityExternalCorrelation external(std::uint32_t correlation, std::uint64_t id) {
  CUpti_ActivityExternalCorrelation e{};
  e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  e.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
  e.externalId = id;
  e.correlationId = correlation;
  return e;
}

}  // namespace

TEST_CASE("CUPTI records become kernel rows linked to their launching range", "[profiler][cupti]") {
  Names n;
  KernelRecord k{};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = 1000;
  k.end = 1500;
  k.deviceId = 0;
  k.streamId = 7;
  k.correlationId = 42;
  k.gridX = 128;
  k.gridY = 2;
  k.gridZ = 1;
  k.blockX = 256;
  k.blockY = 1;
  k.blockZ = 1;
  k.name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";
  n.converter.add(&k);
  // The kernel arrived before its correlation record: it waits.
  CHECK(n.converter.waiting() == 1);
  CHECK(n.converter.take_rows(false).empty());

  auto e = external(42, 9);
  n.converter.add(&e);
  auto rows = n.converter.take_rows(false);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].corr_id == 9);
  CHECK(rows[0].start_ns == 1000);
  CHECK(rows[0].end_ns == 1500);
  CHECK(rows[0].kind == static_cast<std::uint8_t>(store::KernelKind::kernel));
  CHECK(rows[0].grid[0] == 128);
  CHECK(rows[0].grid[1] == 2);
  CHECK(rows[0].block[0] == 256);
  CHECK(rows[0].name == n.ids.at("ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
  CHECK(rows[0].track == n.streams.at({0, 7}));

  // Correlation first, then the copy: ready at once.
  auto e2 = external(43, 10);
  n.converter.add(&e2);
  MemcpyRecord m{};
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  m.bytes = 4096;
  m.start = 2000;
  m.end = 2100;
  m.streamId = 8;
  m.correlationId = 43;
  n.converter.add(&m);
  rows = n.converter.take_rows(false);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].corr_id == 10);
  CHECK(rows[0].bytes == 4096);
  CHECK(rows[0].kind == static_cast<std::uint8_t>(store::KernelKind::memcpy));
  CHECK(rows[0].name == n.ids.at("memcpy HtoD"));
  CHECK(rows[0].track == n.streams.at({0, 8}));

  // A memset launched outside every range never gets a correlation; the final take keeps it (corr 0).
  CUpti_ActivityMemset4 s{};
  s.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  s.bytes = 64;
  s.start = 3000;
  s.end = 3010;
  s.correlationId = 44;
  n.converter.add(&s);
  CHECK(n.converter.take_rows(false).empty());
  rows = n.converter.take_rows(true);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].corr_id == 0);
  CHECK(rows[0].kind == static_cast<std::uint8_t>(store::KernelKind::memset));
  CHECK(n.converter.waiting() == 0);

  // Launches far behind the newest correlation are released rather than held forever.
  KernelRecord old = k;
  old.correlationId = 1;
  n.converter.add(&old);
  auto late = external(500'000, 77);
  n.converter.add(&late);
  rows = n.converter.take_rows(false);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].corr_id == 0);
}

TEST_CASE("a kernel row carries the span of the runtime call that launched it", "[profiler][cupti]") {
  Names n;
  CUpti_ActivityAPI call{};
  call.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  call.start = 900;
  call.end = 950;
  call.correlationId = 42;
  n.converter.add(&call);
  auto e = external(42, 9);
  n.converter.add(&e);
  KernelRecord k{};
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = 1000;
  k.end = 1500;
  k.streamId = 7;
  k.correlationId = 42;
  k.name = "gemm";
  n.converter.add(&k);
  // a kernel whose call record never came: unknown
  KernelRecord k2 = k;
  k2.correlationId = 43;
  auto e2 = external(43, 10);
  n.converter.add(&e2);
  n.converter.add(&k2);
  const auto rows = n.converter.take_rows(true);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].launch_ns == 900);
  CHECK(rows[0].launch_end_ns == 950);
  CHECK(rows[1].launch_ns == -1);
  CHECK(rows[1].launch_end_ns == -1);
}

TEST_CASE("CUPTI records without timestamps are dropped and counted, never written at time 0", "[profiler][cupti]") {
  Names n;
  auto e = external(50, 11);
  n.converter.add(&e);
  // What a forced flush hands over for work still queued: start == end == 0.
  KernelRecord untimed{};
  untimed.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  untimed.correlationId = 50;
  untimed.name = "volta_sgemm_128x64_nn";
  n.converter.add(&untimed);
  MemcpyRecord half{};  // a start without an end is no timestamp either
  half.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  half.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  half.start = 2000;
  half.correlationId = 50;
  n.converter.add(&half);
  CHECK(n.converter.untimed() == 2);
  CHECK(n.converter.waiting() == 0);
  CHECK(n.converter.take_rows(true).empty());

  // A timed record of the same launch still makes its row.
  KernelRecord timed = untimed;
  timed.start = 5000;
  timed.end = 5600;
  n.converter.add(&timed);
  const auto rows = n.converter.take_rows(false);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].corr_id == 11);
  CHECK(rows[0].start_ns == 5000);
  CHECK(n.converter.untimed() == 2);
}

// Whether a library whose path holds `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("CUPTI is not loaded until a tracer starts, and a missing CUPTI is one clear error", "[profiler][cupti]") {
  // This executable links the profiler with its CUPTI tracer: the library is still not mapped.
  CHECK_FALSE(mapped("libcupti"));
  const wb::test::TempDir dir;
  store::WriterOptions wo;
  wo.path = dir / "run.sqlite";
  wo.handle_signals = false;
  store::Writer writer(wo);
  profiler::Recorder rec(writer);
  // The error a tracer gives with WB_CUPTI_LIBRARY set to `library` ("" when it started).
  auto tracer_error = [&](const char* library) {
    ::setenv("WB_CUPTI_LIBRARY", library, 1);
    std::string what;
    try {
      profiler::cuda::CuptiTracer tracer(rec);
    } catch (const profiler::ProfilerError& e) {
      what = e.what();
    }
    ::unsetenv("WB_CUPTI_LIBRARY");
    return what;
  };
  const std::string missing = tracer_error("/no/such/libcupti.so.13");
  CAPTURE(missing);
  CHECK(missing.find("CUPTI could not be loaded") != std::string::npos);
  CHECK(missing.find("/no/such/libcupti.so.13") != std::string::npos);
  CHECK(missing.find("WB_CUPTI_LIBRARY") != std::string::npos);
  // A library that is not CUPTI: the first missing entry point is named.
  const std::string other = tracer_error("libz.so.1");
  CAPTURE(other);
  CHECK(other.find("libz.so.1 has no cuptiGetResultString") != std::string::npos);
  CHECK_FALSE(mapped("libcupti"));
  // The recorder goes on.
  profiler::set_thread_name("main");
  { profiler::Range r(rec.intern("after"), profiler::Category::optimizer); }
  rec.stop();
  writer.finish();
  store::Reader reader(dir / "run.sqlite");
  std::size_t ranges = 0;
  for (const auto& t : reader.tracks())
    if (t.kind == store::TrackKind::thread) ranges += reader.ranges(t.id).size();
  CHECK(ranges == 1);
}

TEST_CASE("on a GPU, a traced memset links to the range that issued it", "[profiler][cuda]") {
  const wb::test::TempDir dir;
  {
    store::WriterOptions wo;
    wo.path = dir / "run.sqlite";
    wo.handle_signals = false;
    store::Writer writer(wo);
    profiler::Recorder rec(writer);
    profiler::NameId op = rec.intern("zero_grad");
    profiler::set_thread_name("main");
    void* ptr = nullptr;
    REQUIRE(cudaMalloc(&ptr, 1 << 20) == cudaSuccess);
    {
      profiler::cuda::CuptiTracer tracer(rec);
      // Paused, a memset of another size is not recorded; resumed, the one below is.
      tracer.pause();
      REQUIRE(cudaMemset(ptr, 0, 1 << 19) == cudaSuccess);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      tracer.resume();
      {
        profiler::Range r(op, profiler::Category::optimizer);
        REQUIRE(cudaMemset(ptr, 0, 1 << 20) == cudaSuccess);
      }
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      tracer.flush();
    }
    cudaFree(ptr);
    rec.stop();
    writer.finish();
  }
  store::Reader reader(dir / "run.sqlite");
  std::uint64_t corr = 0;
  for (const auto& t : reader.tracks())
    if (t.kind == store::TrackKind::thread)
      for (const auto& r : reader.ranges(t.id)) corr = r.corr_id;
  REQUIRE(corr != 0);
  auto kernels = reader.kernels_by_corr(corr);
  REQUIRE(kernels.size() >= 1);
  CHECK(kernels[0].kind == static_cast<std::uint8_t>(store::KernelKind::memset));
  CHECK(kernels[0].bytes == (1 << 20));
  std::int64_t paused_rows = 0;
  auto& q = reader.db().prepare("SELECT COUNT(*) FROM kernel WHERE bytes = ?");
  q.bind(1, std::int64_t{1} << 19);
  if (q.step()) paused_rows = q.column_int64(0);
  CHECK(paused_rows == 0);
}

#endif  // WB_PROFILER_CUPTI
