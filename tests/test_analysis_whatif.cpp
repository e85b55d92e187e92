// wb whatif's replay on hand-built steps whose answers are worked out by hand below:
//   - replayed with no change, every step keeps its recorded times;
//   - an op made slower on the rank that joins a collective last delays both ranks (the collective
//     starts when the last rank joins), the same change on the rank that waits anyway changes nothing;
//   - a slower input pipeline makes the steps wait for their batches (one worker, one batch queued);
//   - a bucket's collective made longer delays both ranks' wait for it;
//   - patterns: terms, classes, a change that matches nothing, bad values.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "profiler/analysis/whatif.hpp"

using namespace wb;
using Catch::Matchers::Contains;

namespace {

// Strings: 1 main, 2 step, 3 forward, 4 m1, 5 m0, 6 allreduce_wait, 7 optimizer, 8 data-worker-0, 9 batch,
// 10 m1.conv (inside m1).
struct Builder {
  analysis::RunData run;
  explicit Builder(int ranks) {
    run.strings = {"", "main", "step", "forward", "m1", "m0", "allreduce_wait", "optimizer", "data-worker-0", "batch", "m1.conv"};
    for (int r = 0; r < ranks; ++r)
      run.tracks.push_back(store::TrackRow{static_cast<std::uint32_t>(r + 1), r, store::TrackKind::thread, 1});
  }
  void range(int rank, std::uint32_t name, store::Category c, std::int64_t a, std::int64_t b, int step, int depth) {
    const auto track = static_cast<std::uint32_t>(rank + 1);
    run.ranges[track].push_back(
        store::RangeRow{track, name, a, b, static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(depth), step, 0});
  }
  // One rank's step from `t`: forward 0..1000, m1 backward (with m1.conv in its first half) and m0
  // backward, the wait for the allreduces, the optimizer; times relative to `t`.
  void step(int rank, int s, std::int64_t t, std::int64_t m1_end, std::int64_t m0_end, std::int64_t wait_end,
            std::int64_t end) {
    range(rank, 2, store::Category::step, t, t + end, s, 0);
    range(rank, 3, store::Category::forward, t, t + 1000, s, 1);
    range(rank, 4, store::Category::backward, t + 1000, t + m1_end, s, 1);
    range(rank, 10, store::Category::backward, t + 1000, t + (1000 + m1_end) / 2, s, 2);
    range(rank, 5, store::Category::backward, t + m1_end, t + m0_end, s, 1);
    range(rank, 6, store::Category::comm, t + m0_end, t + wait_end, s, 1);
    range(rank, 7, store::Category::optimizer, t + wait_end, t + end, s, 1);
    run.steps.push_back(store::StepRow{rank, s, t, t + end, 0, 0, 1.0, 0.1, 8});
  }
  void bucket(int rank, int s, int b, std::int64_t ready, std::int64_t start, std::int64_t end) {
    run.allreduces.push_back(store::AllreduceRow{rank, s, b, 1 - b, 1 - b, 400, ready, start, end});
  }
  void sort() {
    for (auto& [t, rows] : run.ranges)
      std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
        return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.depth < b.depth;
      });
  }
};

// Two ranks, three steps 10000 apart. Rank 1's m1 is slow (1000..4000): bucket 0 (m1's gradient)
// starts when rank 1 joins at 4000, bucket 1 (m0's) when rank 1 joins at 5000; both end at 5800 and
// the waits at 6000. Rank 0 is idle in its wait from 3000.
Builder two_ranks() {
  Builder b(2);
  for (int s = 0; s < 3; ++s) {
    const std::int64_t t = 10'000 * s;
    b.step(0, s, t, 2000, 3000, 6000, 7000);
    b.step(1, s, t, 4000, 5000, 6000, 7000);
    b.bucket(0, s, 0, t + 2000, t + 2000, t + 4300);
    b.bucket(1, s, 0, t + 4000, t + 4000, t + 4300);
    b.bucket(0, s, 1, t + 3000, t + 4300, t + 5800);
    b.bucket(1, s, 1, t + 5000, t + 5000, t + 5800);
  }
  b.sort();
  return b;
}

analysis::WhatIf add(const analysis::RunData& run, std::vector<std::string> changes) {
  std::vector<analysis::WhatIfChange> c;
  for (const auto& text : changes) c.push_back(analysis::parse_add_change(text));
  return analysis::what_if(run, c, 0);
}

std::vector<std::int64_t> step_ends(const analysis::RunData& run, int rank) {
  std::vector<std::int64_t> out;
  for (const auto& s : run.steps)
    if (s.rank == rank) out.push_back(s.end_ns);
  return out;
}

}  // namespace

TEST_CASE("whatif: replayed with no change, every step keeps its recorded times", "[analysis]") {
  const Builder b = two_ranks();
  const analysis::WhatIf w = add(b.run, {});
  CHECK(w.steps_used == 3);
  CHECK(w.measured_step_ns == 7000.0);
  CHECK(w.replay_step_ns == 7000.0);
  CHECK(w.predicted_step_ns == 7000.0);
  for (int r = 0; r < 2; ++r) CHECK(step_ends(w.replayed, r) == step_ends(b.run, r));
  // Every replayed range where it was recorded.
  for (const auto& [track, rows] : w.replayed.ranges) CHECK(rows == b.run.ranges.at(track));
  CHECK(w.replayed.allreduces.size() == b.run.allreduces.size());
}

TEST_CASE("whatif: a slower op on the last rank to join delays both ranks; on the waiting rank it does not", "[analysis]") {
  const Builder b = two_ranks();
  // Rank 1's m1 +500: it joins bucket 0 at 4500, bucket 0 ends 4800, bucket 1 joins at 5500 (rank 1's m0
  // ends there) and ends 6300: both ranks' waits end 500 later, every step is 500 longer on both ranks, and
  // the steps start 500 later each time.
  analysis::WhatIf w = add(b.run, {"rank:1&m1:+0.5"});
  CHECK(w.matched == std::vector<std::int64_t>{3});
  CHECK(w.predicted_step_ns == 7500.0);
  CHECK(step_ends(w.replayed, 0) == std::vector<std::int64_t>{7500, 18000, 28500});
  CHECK(step_ends(w.replayed, 1) == step_ends(w.replayed, 0));
  // Its critical path holds the slower m1 of rank 1.
  REQUIRE(!w.after.steps.empty());
  bool on_path = false;
  for (const auto& seg : w.after.steps.front().segments)
    if (seg.rank == 1 && seg.name == "m1" && seg.end_ns - seg.start_ns == 3500) on_path = true;
  CHECK(on_path);

  // Rank 0's m1 +500: rank 0 still joins both collectives before rank 1 (bucket 0 at 2500, bucket 1 when
  // bucket 0 ends at 4300): nothing changes.
  w = add(b.run, {"rank:0&m1:+0.5"});
  CHECK(w.predicted_step_ns == 7000.0);
  CHECK(step_ends(w.replayed, 0) == step_ends(b.run, 0));

  // A range inside an op (m1.conv within m1) lengthens the op; on every rank that is rank 1's 500.
  w = add(b.run, {"m1.conv&class:backward:+0.5"});
  CHECK(w.matched == std::vector<std::int64_t>{6});
  CHECK(w.predicted_step_ns == 7500.0);
}

TEST_CASE("whatif: a longer collective delays the wait for it on both ranks", "[analysis]") {
  const Builder b = two_ranks();
  // Bucket 1 runs 5000..5800 after rank 1 joins; +1000 makes it end at 6800, both waits end 200 after it
  // (7000, as recorded 200 after 5800) and the steps after the optimizer at 8000.
  analysis::WhatIf w = add(b.run, {"bucket:1:+1"});
  CHECK(w.matched == std::vector<std::int64_t>{6});
  CHECK(w.predicted_step_ns == 8000.0);
  // Bucket 0 +1000 ends at 5300 on both ranks, so bucket 1 joins there on both (rank 0's communication
  // thread is busy until then, rank 1 was ready at 5000) and ends at 6100: steps of 7300.
  w = add(b.run, {"bucket:0:+1"});
  CHECK(w.predicted_step_ns == 7300.0);
  CHECK(add(b.run, {"class:communication:+1"}).predicted_step_ns == 8300.0);
}

TEST_CASE("whatif: a slower input pipeline makes the steps wait for their batches", "[analysis]") {
  // One rank, one worker, one batch queued. Steps of 1000 from 0, 1000, ...; each batch took 100 and was
  // ready 400 before its step. With each batch 2100 long, batch 0 is ready at 1600 (it started at -500):
  // step 0 waits until then and ends at 2600; batch 1 starts when batch 0 is done (1600) and is ready at
  // 3700, so step 1 (from 2600) ends at 4700; from then on every step is 2100.
  Builder b(1);
  b.run.tracks.push_back(store::TrackRow{2, 0, store::TrackKind::thread, 8});
  b.run.config = {{"prefetch", 1}};
  for (int s = 0; s < 6; ++s) {
    const std::int64_t t = 1000 * s;
    b.range(0, 2, store::Category::step, t, t + 1000, s, 0);
    b.range(0, 3, store::Category::forward, t, t + 1000, s, 1);
    b.run.steps.push_back(store::StepRow{0, s, t, t + 1000, 0, 0, 1.0, 0.1, 8});
    b.run.ranges[2].push_back(store::RangeRow{2, 9, t - 500, t - 400, static_cast<std::uint8_t>(store::Category::data), 0, s, 0});
  }
  b.sort();
  analysis::WhatIf w = add(b.run, {"data:+2"});
  CHECK(w.batches_replayed);
  CHECK(w.matched == std::vector<std::int64_t>{6});
  CHECK(w.measured_step_ns == 1000.0);
  CHECK(w.replay_step_ns == 1000.0);
  CHECK(step_ends(w.replayed, 0) == std::vector<std::int64_t>{2600, 4700, 6800, 8900, 11000, 13100});
  // Counted from step 1: 2100 each.
  std::vector<analysis::WhatIfChange> c{analysis::parse_add_change("data:+2")};
  CHECK(analysis::what_if(b.run, c, 1).predicted_step_ns == 2100.0);
  // Batches of 600: the first is ready at 100 and step 0 starts 100 late; every batch after it is ready in
  // time, so from step 1 on nothing changes.
  c = {analysis::parse_add_change("data:+0.5")};
  w = analysis::what_if(b.run, c, 1);
  CHECK(step_ends(w.replayed, 0).front() == 1100);
  CHECK(w.predicted_step_ns == 1000.0);
  // --scale: batches 11x longer are 1100 each: the steps wait 100 each from step 1 on.
  c = {analysis::parse_scale_change("data:11")};
  CHECK(analysis::what_if(b.run, c, 2).predicted_step_ns == 1100.0);
}

TEST_CASE("whatif: patterns and their errors", "[analysis]") {
  const Builder b = two_ranks();
  auto c = analysis::parse_scale_change("rank:1&layer3.*&class:backward:1.5");
  CHECK(c.rank == 1);
  CHECK(c.globs == std::vector<std::string>{"layer3.*"});
  CHECK(c.category == store::Category::backward);
  CHECK(c.factor == 1.5);
  c = analysis::parse_add_change("op:m0:-250");
  CHECK(c.add_ns == -250'000);
  CHECK(c.target == analysis::WhatIfChange::Target::ranges);
  CHECK(analysis::parse_add_change("class:communication&rank:0:+3").target == analysis::WhatIfChange::Target::collectives);

  CHECK_THROWS_WITH(analysis::parse_add_change("m1"), Contains("expected PATTERN:+US"));
  CHECK_THROWS_WITH(analysis::parse_add_change("m1:fast"), Contains("expected microseconds"));
  CHECK_THROWS_WITH(analysis::parse_scale_change("m1:-2"), Contains("factor >= 0"));
  CHECK_THROWS_WITH(analysis::parse_add_change("rank:x&m1:+1"), Contains("expected a rank"));
  CHECK_THROWS_WITH(analysis::parse_add_change("class:gpu:+1"), Contains("unknown class 'gpu'"));
  CHECK_THROWS_WITH(analysis::parse_add_change("bucket:1&m1:+1"), Contains("do not combine"));
  CHECK_THROWS_WITH(analysis::parse_add_change("kernel:volta_*:+1"), Contains("kernel patterns are not replayed"));
  CHECK_THROWS_WITH(analysis::parse_add_change("m1&&m0:+1"), Contains("empty term"));
  // A change that matches nothing is named, never a silent no-op.
  CHECK_THROWS_WITH(add(b.run, {"layer9.*:+1"}), Contains("'layer9.*:+1' matches nothing"));
  CHECK_THROWS_WITH(add(b.run, {"rank:5&m1:+1"}), Contains("matches nothing"));
  // No worker batches to replay: a data change says so and what to use instead.
  CHECK_THROWS_WITH(add(b.run, {"data:+1"}), Contains("class:data"));
}

TEST_CASE("whatif: a caveat when a host's ranks ask for more compute threads than it has CPUs", "[analysis]") {
  analysis::RunData run;
  run.ranks = {store::RankRow{0, "a", "cpu", 1, 0, 0, 0}, store::RankRow{1, "a", "cpu", 2, 0, 0, 0}};
  auto set = [&](int rank, const std::string& cpus, const std::string& threads) {
    run.meta["host_cpus.rank" + std::to_string(rank)] = cpus;
    run.meta["threads.rank" + std::to_string(rank)] = threads;
  };
  CHECK(analysis::shared_cpu_caveat(run).empty());  // not recorded: nothing to say
  set(0, "2", "1");
  set(1, "2", "1");
  CHECK(analysis::shared_cpu_caveat(run).empty());  // 2 threads on 2 CPUs
  set(1, "2", "2");
  CHECK_THAT(analysis::shared_cpu_caveat(run), Contains("2 ranks on host a ask for 3 compute threads on its 2 CPUs"));
  CHECK_THAT(analysis::shared_cpu_caveat(run), Contains("over-predicts"));
  run.ranks[1].host = "b";  // the same threads on two hosts of 2 CPUs each
  CHECK(analysis::shared_cpu_caveat(run).empty());
  run.ranks[1].host = "a";
  set(1, "2", "2x");  // unreadable: left out, never guessed
  CHECK(analysis::shared_cpu_caveat(run).empty());
}
