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
