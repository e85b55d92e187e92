// The critical path across ranks on hand-built steps whose path is known: a slow rank's backward sets
// the last collective's start (the collective starts when the last rank joins), and a collective held up
// by the previous one on its communication thread puts that previous one on the path instead of the
// gradient that was ready earlier.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "profiler/analysis/critical_path.hpp"

using namespace wb;

namespace {

// Strings: 1 main, 2 step, 3 forward, 4 m1, 5 m0, 6 allreduce_wait, 7 optimizer.
struct Builder {
  analysis::RunData run;
  Builder() {
    run.strings = {"", "main", "step", "forward", "m1", "m0", "allreduce_wait", "optimizer"};
    for (int r = 0; r < 2; ++r)
      run.tracks.push_back(store::TrackRow{static_cast<std::uint32_t>(r + 1), r, store::TrackKind::thread, 1});
  }
  void range(int rank, std::uint32_t name, store::Category c, std::int64_t a, std::int64_t b, int step) {
    const auto track = static_cast<std::uint32_t>(rank + 1);
    run.ranges[track].push_back(store::RangeRow{track, name, a, b, static_cast<std::uint8_t>(c),
                                                static_cast<std::uint8_t>(c == store::Category::step ? 0 : 1), step, 0});
  }
  // One rank's step: forward, m1 and m0 backward, the wait, the optimizer (times relative to `t`).
  void step(int rank, int s, std::int64_t t, std::int64_t m1_end, std::int64_t m0_end, std::int64_t wait_end,
            std::int64_t end) {
    range(rank, 2, store::Category::step, t, t + end, s);
    range(rank, 3, store::Category::forward, t, t + 1000, s);
    range(rank, 4, store::Category::backward, t + 1000, t + m1_end, s);
    range(rank, 5, store::Category::backward, t + m1_end, t + m0_end, s);
    range(rank, 6, store::Category::comm, t + m0_end, t + wait_end, s);
    range(rank, 7, store::Category::optimizer, t + wait_end, t + end, s);
    run.steps.push_back(store::StepRow{rank, s, t, t + end, 0, 0, 1.0, 0.1, 8});
  }
  void bucket(int rank, int s, int b, std::int64_t ready, std::int64_t start, std::int64_t end) {
    run.allreduces.push_back(store::AllreduceRow{rank, s, b, 1 - b, 1 - b, 400, ready, start, end});
  }
};

struct Seg {
  int rank;
  std::string name;
  std::int64_t start, end;
};

void check_path(const analysis::StepPath& p, const std::vector<Seg>& want) {
  std::string got;
  for (const auto& s : p.segments)
    got += std::to_string(s.rank) + " " + s.name + " " + std::to_string(s.start_ns) + ".." + std::to_string(s.end_ns) + "\n";
  std::string expected;
  for (const auto& s : want)
    expected += std::to_string(s.rank) + " " + s.name + " " + std::to_string(s.start) + ".." + std::to_string(s.end) + "\n";
  CHECK(got == expected);
}

}  // namespace

TEST_CASE("the critical path goes through the last rank to join a collective and through collectives held up",
          "[analysis]") {
  Builder b;
  // Step 0: rank 1's m1 is slow (1000..4000). Bucket 0 (m1's gradient) starts when rank 1 joins at 4000;
  // bucket 1 (m0's) waits on rank 0 for bucket 0 to end (4300) but starts when rank 1 joins at 5000.
  b.step(0, 0, 0, 2000, 3000, 6000, 7000);
  b.step(1, 0, 0, 4000, 5000, 6000, 7500);
  b.bucket(0, 0, 0, 2000, 2000, 4300);
  b.bucket(1, 0, 0, 4000, 4000, 4300);
  b.bucket(0, 0, 1, 3000, 4300, 5800);
  b.bucket(1, 0, 1, 5000, 5000, 5800);
  // Step 1 (from 100000): ranks alike; bucket 0 is long (2000..4500) and bucket 1, ready at 3000, waits
  // for it on both ranks: bucket 0 is on the path, m0 (run meanwhile) is not.
  const std::int64_t t = 100'000;
  for (int r = 0; r < 2; ++r) {
    b.step(r, 1, t, 2000, 3000, 6000, 7000);
    b.bucket(r, 1, 0, t + 2000, t + 2000, t + 4500);
    b.bucket(r, 1, 1, t + 3000, t + 4500, t + 5500);
  }
  const analysis::CriticalPath cp = analysis::critical_path(b.run);
  REQUIRE(cp.steps.size() == 2);
  check_path(cp.steps[0], {{1, "forward", 0, 1000},
                           {1, "m1", 1000, 4000},
                           {1, "m0", 4000, 5000},
                           {1, "allreduce bucket 1", 5000, 5800},
                           {1, "allreduce_wait", 5800, 6000},
                           {1, "optimizer", 6000, 7500}});
  check_path(cp.steps[1], {{0, "forward", t, t + 1000},
                           {0, "m1", t + 1000, t + 2000},
                           {0, "allreduce bucket 0", t + 2000, t + 4500},
                           {0, "allreduce bucket 1", t + 4500, t + 5500},
                           {0, "allreduce_wait", t + 5500, t + 6000},
                           {0, "optimizer", t + 6000, t + 7000}});
  // Every nanosecond of each step is on the path once.
  CHECK(cp.path_ns == 7500 + 7000);
  // The ops by time on the path: m1 (3000 + 1000) first, then bucket 0 (2500, in step 1) and the
  // optimizer (1500 + 1000), ties by name; m0 was on one step's path only.
  REQUIRE(cp.ops.size() >= 3);
  CHECK(cp.ops[0].name == "m1");
  CHECK(cp.ops[0].total_ns == 4000);
  CHECK(cp.ops[0].steps == 2);
  CHECK(cp.ops[1].name == "allreduce bucket 0");
  CHECK(cp.ops[1].kind == "collective");
  CHECK(cp.ops[1].total_ns == 2500);
  CHECK(cp.ops[2].name == "optimizer");
  CHECK(cp.ops[2].total_ns == 2500);
  for (const auto& op : cp.ops)
    if (op.name == "m0") CHECK(op.steps == 1);

  // A run without allreduce rows has no path.
  analysis::RunData single = b.run;
  single.allreduces.clear();
  CHECK(analysis::critical_path(single).steps.empty());
}

namespace {

store::PipelineSpanRow pspan(int rank, int stage, int micro, const char* kind, int peer, std::int64_t post, std::int64_t start,
                             std::int64_t end) {
  store::PipelineSpanRow r;
  r.rank = rank;
  r.step = 0;
  r.stage = stage;
  r.micro = micro;
  r.kind = kind;
  r.peer = peer;
  r.post_ns = post * 1000;  // the times below are in microseconds
  r.start_ns = start * 1000;
  r.end_ns = end * 1000;
  return r;
}

}  // namespace

TEST_CASE("a pipeline step's critical path goes through each message a stage waited for, to its sender", "[analysis]") {
  // GPipe, 2 stages (rank 0, rank 1), 2 micro-batches; times worked out by hand (us).
  //   rank 0: F0 [0,10] F1 [10,20] | waits for mb 1's gradients [20,46] (posted 44) | B1 [46,56]
  //           | waits for mb 0's gradients [56,58] (posted 54: already on its way) | B0 [58,68]
  //   rank 1: waits for mb 0's activations [0,12] (posted 10) | F0 [12,22] | waits for mb 1's [22,24]
  //           (posted 20) | F1 [24,34] B1 [34,44] -> send | B0 [44,54] -> send
  analysis::RunData run;
  run.pipeline_spans = {
      pspan(0, 0, 0, "forward", -1, 0, 0, 10),          pspan(0, 0, 0, "send_act", 1, 10, 10, 11),
      pspan(0, 0, 1, "forward", -1, 10, 10, 20),        pspan(0, 0, 1, "send_act", 1, 20, 20, 21),
      pspan(0, 0, 1, "recv_grad", 1, 20, 20, 46),       pspan(0, 0, 1, "backward", -1, 46, 46, 56),
      pspan(0, 0, 0, "recv_grad", 1, 20, 56, 58),       pspan(0, 0, 0, "backward", -1, 58, 58, 68),
      pspan(1, 1, 0, "recv_act", 0, 0, 0, 12),          pspan(1, 1, 0, "forward", -1, 12, 12, 22),
      pspan(1, 1, 1, "recv_act", 0, 0, 22, 24),         pspan(1, 1, 1, "forward", -1, 24, 24, 34),
      pspan(1, 1, 1, "backward", -1, 34, 34, 44),       pspan(1, 1, 1, "send_grad", 0, 44, 44, 45),
      pspan(1, 1, 0, "backward", -1, 44, 44, 54),       pspan(1, 1, 0, "send_grad", 0, 54, 54, 55),
  };
  const analysis::CriticalPath cp = analysis::critical_path(run);
  REQUIRE(cp.steps.size() == 1);
  const auto& p = cp.steps.front();
  CHECK(p.start_ns == 0);
  CHECK(p.end_ns == 68'000);
  struct Want {
    int rank;
    const char* name;
    std::int64_t start, end;
  };
  const std::vector<Want> want = {
      {0, "stage 0 forward", 0, 10},           {1, "activations to stage 1", 10, 12}, {1, "stage 1 forward", 12, 22},
      {1, "activations to stage 1", 22, 24},   {1, "stage 1 forward", 24, 34},        {1, "stage 1 backward", 34, 44},
      {0, "gradients to stage 0", 44, 46},     {0, "stage 0 backward", 46, 56},       {0, "gradients to stage 0", 56, 58},
      {0, "stage 0 backward", 58, 68},
  };
  for (const auto& s : p.segments) UNSCOPED_INFO(s.rank << " " << s.name << " " << s.kind << " " << s.start_ns << ".." << s.end_ns << " t" << s.track);
  REQUIRE(p.segments.size() == want.size());
  std::int64_t covered = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(p.segments[i].rank == want[i].rank);
    CHECK(p.segments[i].name == want[i].name);
    CHECK(p.segments[i].start_ns == want[i].start * 1000);
    CHECK(p.segments[i].end_ns == want[i].end * 1000);
    covered += p.segments[i].end_ns - p.segments[i].start_ns;
  }
  CHECK(covered == 68'000);  // the path covers the step
  CHECK(cp.ops.front().name == "stage 0 backward");  // 20 ns, tied with stage 1 forward: by name
  CHECK(cp.ops.front().total_ns == 20'000);

  SECTION("idle time on the path is a bubble") {
    // Rank 0 starts its last backward 5 us after the gradients came: 5 us of bubble on the path.
    for (auto& r : run.pipeline_spans)
      if (r.rank == 0 && r.micro == 0 && r.kind == "backward") r.start_ns = 63'000, r.end_ns = 73'000;
    const auto q = analysis::critical_path(run).steps.front();
    REQUIRE(q.segments.size() == want.size() + 1);
    CHECK(q.segments[want.size() - 1].name == "(bubble)");
    CHECK(q.segments[want.size() - 1].start_ns == 58'000);
    CHECK(q.segments[want.size() - 1].end_ns == 63'000);
  }
}

namespace {

// A 2-rank GPU trace of one step, as `wb import torch-trace` records it. Rank 0: "fwd" launches a gemm
// (400..2000), c10d::allreduce_ launches an NCCL kernel that waits on its stream for the gemm (2000..8000),
// and cudaDeviceSynchronize waits for it; its step ends at 8200. Rank 1: "fwd" runs long on the host and
// launches its gemm at 3000 (3200..5000); its NCCL kernel starts after it, at 5000, and all ranks'
// collectives end at 8000. Rank 1 also ran a collective of the same name that rank 0's trace lost (a
// sampled trace), 600..700: matched by order, it would be rank 0's peer.
struct GpuTrace {
  analysis::RunData run;
  enum Name : std::uint32_t { kMain = 1, kStream, kStep, kFwd, kLaunch, kAllreduce, kSync, kGemm, kNccl };
  GpuTrace() {
    run.strings = {"", "main", "stream 7", "ProfilerStep#0", "fwd", "cudaLaunchKernel", "c10d::allreduce_",
                   "cudaDeviceSynchronize", "gemm", "ncclKernel_AllReduce_RING_LL_Sum_float"};
    for (int r = 0; r < 2; ++r) {
      run.tracks.push_back(store::TrackRow{host(r), r, store::TrackKind::thread, kMain});
      run.tracks.push_back(store::TrackRow{stream(r), r, store::TrackKind::stream, kStream});
    }
  }
  static std::uint32_t host(int rank) { return static_cast<std::uint32_t>(2 * rank + 1); }
  static std::uint32_t stream(int rank) { return static_cast<std::uint32_t>(2 * rank + 2); }
  void range(int rank, std::uint32_t name, std::int64_t a, std::int64_t b, int depth, std::uint64_t corr = 0) {
    const auto c = depth == 0 ? store::Category::step : store::Category::forward;
    run.ranges[host(rank)].push_back(
        store::RangeRow{host(rank), name, a, b, static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(depth), 0, corr});
  }
  void kernel(int rank, std::uint32_t name, std::int64_t a, std::int64_t b, std::uint64_t corr, std::int64_t la, std::int64_t lb) {
    store::KernelRow k;
    k.track = stream(rank);
    k.name = name;
    k.start_ns = a;
    k.end_ns = b;
    k.corr_id = corr;
    k.launch_ns = la;
    k.launch_end_ns = lb;
    run.kernels[stream(rank)].push_back(k);
    ++run.kernel_rows;
  }
  void build(bool rank1_first) {
    run.steps.push_back(store::StepRow{0, 0, 0, 8200, 0, 0, 0.0, 0.0, 0});
    run.steps.push_back(store::StepRow{1, 0, 0, 8150, 0, 0, 0.0, 0.0, 0});
    range(0, kStep, 0, 8200, 0);
    range(0, kFwd, 100, 1000, 1);
    range(0, kLaunch, 200, 300, 2, 1);
    range(0, kAllreduce, 1000, 1200, 1);
    range(0, kLaunch, 1050, 1100, 2, 2);
    range(0, kSync, 1200, 8100, 1);
    kernel(0, kGemm, 400, 2000, 1, 200, 300);
    kernel(0, kNccl, 2000, 8000, 2, 1050, 1100);
    range(1, kStep, 0, 8150, 0);
    range(1, kFwd, 100, 4000, 1);
    range(1, kLaunch, 300, 350, 2, 3);
    range(1, kLaunch, 3000, 3100, 2, 1);
    range(1, kAllreduce, 4000, 4200, 1);
    range(1, kLaunch, 4050, 4100, 2, 2);
    range(1, kSync, 4200, 8050, 1);
    // rank1_first plants a rank 1 that joined first: its collective starts before rank 0's.
    kernel(1, kNccl, 600, 700, 3, 300, 350);
    kernel(1, kGemm, rank1_first ? 1000 : 3200, rank1_first ? 1900 : 5000, 1, 3000, 3100);
    kernel(1, kNccl, rank1_first ? 1900 : 5000, 8000, 2, 4050, 4100);
  }
};

}  // namespace

TEST_CASE("a GPU trace's critical path goes through launches, stream order, a synchronise and the last rank "
          "to join an NCCL collective",
          "[analysis]") {
  GpuTrace g;
  g.build(false);
  const analysis::CriticalPath cp = analysis::critical_path(g.run);  // no allreduce rows: the device path
  REQUIRE(cp.steps.size() == 1);
  const analysis::StepPath& p = cp.steps[0];
  CHECK(p.start_ns == 0);
  CHECK(p.end_ns == 8200);
  struct Want {
    int rank;
    std::string name, kind;
    std::int64_t a, b;
    std::uint32_t track;
  };
  // By hand, back from rank 0's step end: the step range's own time, the synchronise waiting for the NCCL
  // kernel, which ends when rank 1's started plus its run (5000..8000: rank 1 joined last, at 5000); rank
  // 1's NCCL kernel waited on its stream for its gemm, which waited for its launch (the "(launch)" gap),
  // the launching call, fwd's own host time (cut by its other launch), and the step range's first 100 ns.
  const std::vector<Want> want = {
      {1, "ProfilerStep#0", "step", 0, 100, GpuTrace::host(1)},
      {1, "fwd", "forward", 100, 300, GpuTrace::host(1)},
      {1, "cudaLaunchKernel", "runtime", 300, 350, GpuTrace::host(1)},  // the lost collective's launch
      {1, "fwd", "forward", 350, 3000, GpuTrace::host(1)},
      {1, "cudaLaunchKernel", "runtime", 3000, 3100, GpuTrace::host(1)},
      {1, "(launch)", "launch", 3100, 3200, GpuTrace::stream(1)},
      {1, "fwd", "kernel", 3200, 5000, GpuTrace::stream(1)},
      {0, "c10d::allreduce_", "collective", 5000, 8000, GpuTrace::stream(0)},
      {0, "cudaDeviceSynchronize", "sync", 8000, 8100, GpuTrace::host(0)},
      {0, "ProfilerStep#0", "step", 8100, 8200, GpuTrace::host(0)},
  };
  for (const auto& s : p.segments) UNSCOPED_INFO(s.rank << " " << s.name << " " << s.kind << " " << s.start_ns << ".." << s.end_ns << " t" << s.track);
  REQUIRE(p.segments.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i, p.segments[i].name, p.segments[i].kind, p.segments[i].start_ns, p.segments[i].end_ns);
    CHECK(p.segments[i].rank == want[i].rank);
    CHECK(p.segments[i].name == want[i].name);
    CHECK(p.segments[i].kind == want[i].kind);
    CHECK(p.segments[i].start_ns == want[i].a);
    CHECK(p.segments[i].end_ns == want[i].b);
    CHECK(p.segments[i].track == want[i].track);
  }
  CHECK(cp.path_ns == 8200);  // the segments cover the step
  REQUIRE(!cp.ops.empty());
  CHECK(cp.ops[0].name == "c10d::allreduce_");

  // Rank 1 joining first: rank 0's own gemm and launch are on the path instead, and nothing of rank 1.
  GpuTrace early;
  early.build(true);
  const analysis::CriticalPath ce = analysis::critical_path(early.run);
  REQUIRE(ce.steps.size() == 1);
  for (const auto& seg : ce.steps[0].segments) CHECK(seg.rank == 0);
  CHECK(ce.steps[0].segments.front().name == "ProfilerStep#0");
  CHECK(ce.path_ns == 8200);
}

TEST_CASE("a thread that waits for another (PyTorch's backward on the autograd thread) puts that thread's work "
          "on the GPU trace's path",
          "[analysis]") {
  constexpr std::int64_t us = 1000;  // times below in microseconds
  // One rank: the main thread sits in "## backward ##" (500..5000) while the autograd thread runs
  // evaluate A (1000..3000) and evaluate B (3000..4800, launching a kernel at 4000); the step ends at 6000.
  analysis::RunData run;
  run.strings = {"", "main", "pt_autograd_0", "stream 7", "ProfilerStep#3", "## backward ##", "evaluate A", "evaluate B",
                 "cudaLaunchKernel", "gemm"};
  run.tracks = {store::TrackRow{1, 0, store::TrackKind::thread, 1}, store::TrackRow{2, 0, store::TrackKind::thread, 2},
                store::TrackRow{3, 0, store::TrackKind::stream, 3}};
  auto range = [&](std::uint32_t track, std::uint32_t name, store::Category c, std::int64_t a, std::int64_t b, int depth,
                   std::uint64_t corr) {
    run.ranges[track].push_back(store::RangeRow{track, name, a, b, static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(depth), 3, corr});
  };
  range(1, 4, store::Category::step, 0 * us, 6000 * us, 0, 0);
  range(1, 5, store::Category::backward, 500 * us, 5000 * us, 1, 0);
  range(2, 6, store::Category::backward, 1000 * us, 3000 * us, 0, 0);
  range(2, 7, store::Category::backward, 3000 * us, 4800 * us, 0, 0);
  range(2, 8, store::Category::backward, 4000 * us, 4010 * us, 1, 1);
  store::KernelRow k;
  k.track = 3;
  k.name = 9;
  k.start_ns = 4020 * us;
  k.end_ns = 4500 * us;
  k.corr_id = 1;
  k.launch_ns = 4000 * us;
  k.launch_end_ns = 4010 * us;
  run.kernels[3].push_back(k);
  run.kernel_rows = 1;
  run.steps.push_back(store::StepRow{0, 3, 0, 6000 * us, 0, 0, 0.0, 0.0, 0});

  const analysis::CriticalPath cp = analysis::critical_path(run);
  REQUIRE(cp.steps.size() == 1);
  const auto& segs = cp.steps[0].segments;
  for (const auto& s : segs) UNSCOPED_INFO(s.name << " " << s.kind << " " << s.start_ns << ".." << s.end_ns << " t" << s.track);
  const std::vector<std::tuple<std::string, std::string, std::int64_t, std::int64_t, std::uint32_t>> want = {
      {"ProfilerStep#3", "step", 0 * us, 500 * us, 1},        {"(handoff)", "gap", 500 * us, 1000 * us, 2},
      {"evaluate A", "backward", 1000 * us, 3000 * us, 2},    {"evaluate B", "backward", 3000 * us, 4000 * us, 2},
      {"cudaLaunchKernel", "runtime", 4000 * us, 4010 * us, 2}, {"evaluate B", "backward", 4010 * us, 4800 * us, 2},
      {"## backward ##", "wait", 4800 * us, 5000 * us, 1},    {"ProfilerStep#3", "step", 5000 * us, 6000 * us, 1},
  };
  REQUIRE(segs.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(std::tie(segs[i].name, segs[i].kind, segs[i].start_ns, segs[i].end_ns, segs[i].track) == want[i]);
  }

  // Work on the other thread that ends long before the wait does (here 4800 of a wait to 9000) is no join:
  // the waiting range's own time stays on the path.
  run.ranges[1][0].end_ns = 10'000 * us;
  run.ranges[1][1].end_ns = 9000 * us;
  run.steps[0].end_ns = 10'000 * us;
  const analysis::CriticalPath late = analysis::critical_path(run);
  REQUIRE(late.steps.size() == 1);
  for (const auto& s : late.steps[0].segments) CHECK(s.track == 1);
}
