// Stragglers across ranks (profiler/analysis/stragglers.hpp) on a hand-built 3-rank run with known
// answers: rank 2 is late in steps 0-4 because one op (layer3.0.conv2, nested in its block's range)
// takes 5 ms longer, rank 1 is late in step 5 because it waited 4 ms for data. The last rank per step,
// the waits it causes, the cause and the op behind it, the persistent straggler, and the report's
// section and warning are checked. Then end to end: 2 real ranks of wb-train, rank 1 slowed on purpose
// inside one op (--slow-rank 1:layer3.0.conv2:300000), found by the analysis and by `wb report`.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "profiler/analysis/report.hpp"
#include "profiler/analysis/stragglers.hpp"
#include "test_trainer_util.hpp"
#include "support/peers.hpp"

using namespace wb;

namespace {

constexpr std::int64_t kMs = 1'000'000;

struct Builder {
  analysis::RunData run;
  std::uint32_t intern(const std::string& s) {
    for (std::uint32_t i = 0; i < run.strings.size(); ++i)
      if (run.strings[i] == s) return i;
    run.strings.push_back(s);
    return static_cast<std::uint32_t>(run.strings.size() - 1);
  }
};

analysis::RunData three_ranks() {
  Builder b;
  b.intern("");
  const std::uint32_t step = b.intern("step"), conv1 = b.intern("layer1.0.conv1"), block = b.intern("layer3.0"),
                      conv2 = b.intern("layer3.0.conv2"), wait = b.intern("data_wait"), main = b.intern("main");
  using store::Category;
  auto cat = [](Category c) { return static_cast<std::uint8_t>(c); };
  for (int rank = 0; rank < 3; ++rank) {
    const std::uint32_t track = static_cast<std::uint32_t>(rank + 1);
    b.run.tracks.push_back({track, rank, store::TrackKind::thread, main});
    auto& rows = b.run.ranges[track];
    for (int s = 0; s < 6; ++s) {
      // Every rank starts the step at the same time (the previous allreduce ended for all).
      std::int64_t t = s * 100 * kMs;
      const std::int64_t data = (rank == 1 && s == 5) ? 4 * kMs : kMs / 10;
      const std::int64_t slow = (rank == 2 && s < 5) ? 5 * kMs : 0;
      const std::int64_t jitter = rank * kMs / 100;  // ranks differ a little, as real ones do
      const std::int64_t t0 = t;
      rows.push_back({track, step, t0, 0, cat(Category::step), 0, s, 0});
      const std::size_t step_index = rows.size() - 1;
      rows.push_back({track, wait, t, t + data, cat(Category::data), 1, s, 0});
      t += data;
      rows.push_back({track, conv1, t, t + 10 * kMs + jitter, cat(Category::forward), 1, s, 0});
      t += 10 * kMs + jitter;
      rows.push_back({track, block, t, t + 20 * kMs + slow, cat(Category::forward), 1, s, 0});
      rows.push_back({track, conv2, t + kMs, t + 19 * kMs + slow, cat(Category::forward), 2, s, 0});
      t += 20 * kMs + slow;
      rows.push_back({track, conv2, t, t + 15 * kMs, cat(Category::backward), 1, s, 0});
      const std::int64_t bucket1_ready = t + 15 * kMs;
      t += 15 * kMs;
      rows.push_back({track, conv1, t, t + 10 * kMs, cat(Category::backward), 1, s, 0});
      t += 10 * kMs;
      const std::int64_t bucket0_ready = t;
      rows[step_index].end_ns = t + 10 * kMs;
      b.run.steps.push_back({rank, s, t0, t + 10 * kMs, data, 0, 2.0, 0.1, 8});
      b.run.allreduces.push_back({rank, s, 1, 1, 1, 1024, bucket1_ready, bucket1_ready, bucket1_ready + kMs});
      b.run.allreduces.push_back({rank, s, 0, 0, 0, 1024, bucket0_ready, bucket0_ready, bucket0_ready + kMs});
    }
  }
  return b.run;
}

}  // namespace

TEST_CASE("stragglers: the last rank per step, the waits it causes and why it was late", "[analysis]") {
  const analysis::RunData run = three_ranks();
  const analysis::StragglerAnalysis a = analysis::analyze_stragglers(run);
  REQUIRE(a.ranks == std::vector<int>{0, 1, 2});
  REQUIRE(a.steps.size() == 6);
  for (int s = 0; s < 5; ++s) {
    CAPTURE(s);
    const auto& st = a.steps[static_cast<std::size_t>(s)];
    CHECK(st.last_rank == 2);
    // 5 ms of op time plus its 0.02 ms jitter, against the others' median (0.005 ms); rank 0 waits most.
    CHECK(st.lag_ns == 5 * kMs + 2 * kMs / 100 - kMs / 200);
    CHECK(st.wait_ns[0] == 5 * kMs + 2 * kMs / 100);
    CHECK(st.wait_ns[1] == 5 * kMs + kMs / 100);
    CHECK(st.wait_ns[2] == 0);
    CHECK(st.cause == analysis::LagCause::slower_ops);
    REQUIRE_FALSE(st.top_ops.empty());
    CHECK(st.top_ops[0].op == "layer3.0.conv2");  // the leaf, not its block
    CHECK(st.top_ops[0].extra_ns == 5 * kMs);
  }
  const auto& s5 = a.steps[5];
  CHECK(s5.last_rank == 1);
  CHECK(s5.cause == analysis::LagCause::data_wait);
  CHECK(s5.data_extra_ns == 4 * kMs - kMs / 10);

  REQUIRE(a.persistent.size() == 1);
  const auto& p = a.persistent[0];
  CHECK(p.rank == 2);
  CHECK(p.steps_last == 5);
  CHECK(p.fraction == Approx(5.0 / 6.0));
  CHECK(p.cause == analysis::LagCause::slower_ops);
  REQUIRE_FALSE(p.top_ops.empty());
  CHECK(p.top_ops[0].op == "layer3.0.conv2");
  CHECK(p.top_ops[0].extra_ns == 25 * kMs);
  CHECK(p.mean_wait_caused_ns == Approx(5 * kMs + 1.5 * kMs / 100));
  CHECK(a.max_wait_ns == 5 * kMs + 2 * kMs / 100);
}

TEST_CASE("stragglers: the report names the persistent straggler, its cause and its op", "[analysis]") {
  const analysis::RunData run = three_ranks();
  std::ostringstream out;
  analysis::write_stragglers(run, out);
  const std::string text = out.str();
  CAPTURE(text);
  CHECK(text.find("persistent straggler: rank 2, last in 5 of 6 steps") != std::string::npos);
  CHECK(text.find("cause: slower ops") != std::string::npos);
  CHECK(text.find("layer3.0.conv2 +5.000 ms per step") != std::string::npos);
  bool warned = false;
  for (const auto& w : analysis::run_warnings(run)) {
    warned = warned || (w.kind == "straggler" && w.message.find("rank 2 holds the allreduce back in 83% of steps") !=
                                                     std::string::npos &&
                        w.message.find("layer3.0.conv2") != std::string::npos);
  }
  CHECK(warned);
}

TEST_CASE("stragglers: a single rank, or a rank under the threshold, is no persistent straggler", "[analysis]") {
  analysis::RunData run = three_ranks();
  analysis::RunData one;
  for (const auto& s : run.steps)
    if (s.rank == 0) one.steps.push_back(s);
  CHECK(analysis::analyze_stragglers(one).steps.empty());
  std::ostringstream out;
  analysis::write_stragglers(one, out);
  CHECK(out.str().empty());

  // A threshold above rank 2's share (last in 5 of 6 steps) names no one.
  const analysis::StragglerAnalysis a = analysis::analyze_stragglers(run, 0.9);
  CHECK(a.persistent.empty());
  CHECK(a.steps.size() == 6);
}

TEST_CASE("stragglers: a rank slowed on purpose in one op is found, with the wait it causes", "[analysis][mpi]") {
  // 300 ms per step in layer3.0.conv2's forward on rank 1: well above what a busy 2-core machine adds
  // to a step of batch 4 at 32x32 by chance.
  wb::test::TempDir dir;
  const auto path = dir / "slow.sqlite";
  constexpr std::int64_t kDelayMs = 300;
  const wb::test::Result r = wb::test::run_train(
      {"--data", "synthetic", "--synthetic-samples", "64", "--batch-size", "4", "--image-size", "32", "--steps", "6",
       "--nproc", "2", "--seed", "3", "--slow-rank", "1:layer3.0.conv2:" + std::to_string(kDelayMs * 1000), "--run",
       path.string()});
  CAPTURE(r.out, r.err);
  REQUIRE(r.exit_code == 0);
  const analysis::RunData run = analysis::load_run(path);
  const analysis::StragglerAnalysis a = analysis::analyze_stragglers(run);
  REQUIRE(a.steps.size() == 6);
  REQUIRE(a.persistent.size() == 1);
  const auto& p = a.persistent[0];
  CHECK(p.rank == 1);
  CHECK(p.steps_last >= 5);
  CHECK(p.cause == analysis::LagCause::slower_ops);
  REQUIRE_FALSE(p.top_ops.empty());
  CHECK(p.top_ops[0].op == "layer3.0.conv2");
  CHECK(static_cast<double>(p.top_ops[0].extra_ns) / p.steps_last >= 0.8 * kDelayMs * kMs);
  // Rank 0 waits for rank 1 at the allreduce for about the planted delay.
  CHECK(p.mean_wait_caused_ns >= 0.5 * kDelayMs * kMs);
  CHECK(a.total_wait_ns[0] > 10 * a.total_wait_ns[1]);

  const std::string cmd = wb::test::shell_quote(WB_CLI) + " report " + wb::test::shell_quote(path.string()) + " --no-split";
  const wb::test::Result rep = wb::test::run_command(cmd);
  CAPTURE(rep.out);
  REQUIRE(rep.exit_code == 0);
  CHECK(rep.out.find("persistent straggler: rank 1") != std::string::npos);
  CHECK(rep.out.find("    layer3.0.conv2 +") != std::string::npos);
  CHECK(rep.out.find("[straggler] rank 1 holds the allreduce back") != std::string::npos);
  CHECK(rep.out.find("  profiler cost: ") != std::string::npos);  // measured by the run, per step
}

TEST_CASE("stragglers: --slow-rank with a bad value is one line and exit code 2", "[analysis]") {
  wb::test::TempDir dir;
  const auto base = std::vector<std::string>{"--steps", "1", "--run", (dir / "bad.sqlite").string()};
  wb::test::require_one_line_error(wb::test::run_train(wb::test::with(base, {"--slow-rank", "1:layer9.conv:100"})),
                                   {"--slow-rank", "no module named 'layer9.conv'"});
  wb::test::require_one_line_error(wb::test::run_train(wb::test::with(base, {"--slow-rank", "1:100"})),
                                   {"--slow-rank", "expected R:MODULE:US"});
  wb::test::require_one_line_error(wb::test::run_train(wb::test::with(base, {"--slow-rank", "1:conv1:-5"})),
                                   {"--slow-rank"});
}
