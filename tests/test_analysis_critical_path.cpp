// The critical path across ranks on hand-built steps whose path is known: a slow rank's backward sets
// the last collective's start (the collective starts when the last rank joins), and a collective held up
// by the previous one on its communication thread puts that previous one on the path instead of the
// gradient that was ready earlier.
#include <catch2/catch.hpp>

#include <string>
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
