// SyncBatchNorm's collectives in a run (profiler/analysis/sync_bn.hpp) on a hand-built 2-rank run with
// known answers: the step breakdown moves them from compute to exposed communication, the summary gives
// their time per step, its forward and backward parts, the part spent waiting for the slower rank, and
// the layers; `wb report`'s section says so, and a run without them has no section. The sharded
// classifier's (profiler/analysis/fc_shard.hpp) the same, on the same run with its range names.
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>
#include <string>

#include "profiler/analysis/fc_shard.hpp"
#include "profiler/analysis/report.hpp"
#include "profiler/analysis/steps.hpp"
#include "profiler/analysis/sync_bn.hpp"
#include "store/merge.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using store::Category;

namespace {

constexpr std::int64_t kUs = 1'000;
constexpr std::int64_t kMs = 1'000'000;

store::RangeRow rr(std::uint32_t track, std::uint32_t name, std::int64_t s, std::int64_t e, Category c, int depth, int step) {
  return store::RangeRow{track, name, s, e, static_cast<std::uint8_t>(c), static_cast<std::uint8_t>(depth), step, 0};
}

// Two 10 ms steps per rank: forward 0-4 ms with bn1 at 1-3 ms, backward 4-9 ms with bn1 at 5-7 ms, and
// inside bn1 its exchanges: rank 0 1.0 ms in forward and 0.5 ms in backward, rank 1 1.3 ms and 1.0 ms
// (it arrives first and waits for rank 0). With `sync` false, the same run without exchanges. With
// `fc_shard`, the exchanges are the sharded classifier's fc.shard_max and fc.shard_grad.
fs::path write_run(const fs::path& dir, bool sync, bool fc_shard = false) {
  fs::create_directories(dir / "run");
  for (int rank : {0, 1}) {
    store::WriterOptions o;
    o.path = dir / "run" / ("rank-" + std::to_string(rank) + ".sqlite");
    o.rank = rank;
    o.handle_signals = false;
    store::Writer w(o);
    if (fc_shard) {
      w.set_meta("config_json", R"({"sync_bn": "off", "shard_fc": 2})");
      w.set_meta("fc_shard_group_size", "2");
    } else {
      w.set_meta("config_json", sync ? R"({"sync_bn": "global"})" : R"({"sync_bn": "off"})");
      if (sync) w.set_meta("sync_bn_group_size", "2");
    }
    w.set_meta("world_size", "2");
    store::RankRow row;
    row.rank = rank;
    row.host = "h";
    w.set_rank(row);
    const std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
    const std::uint32_t step = w.intern("step"), fwd = w.intern("layer1"), bwd = w.intern("layer1"),
                        bn = w.intern("bn1"), stats = w.intern(fc_shard ? "fc.shard_max" : "bn1.sync_stats"),
                        grads = w.intern(fc_shard ? "fc.shard_grad" : "bn1.sync_grads");
    const std::int64_t stats_ns = rank == 0 ? 1000 * kUs : 1300 * kUs, grads_ns = rank == 0 ? 500 * kUs : 1000 * kUs;
    for (int i = 0; i < 2; ++i) {
      const std::int64_t t = i * 10 * kMs;
      w.add(rr(main, step, t, t + 10 * kMs, Category::step, 0, i));
      w.add(rr(main, fwd, t, t + 4 * kMs, Category::forward, 1, i));
      w.add(rr(main, bn, t + 1 * kMs, t + 3 * kMs, Category::forward, 2, i));
      w.add(rr(main, bwd, t + 4 * kMs, t + 9 * kMs, Category::backward, 1, i));
      w.add(rr(main, bn, t + 5 * kMs, t + 7 * kMs, Category::backward, 2, i));
      if (sync) {
        const std::int64_t end_stats = t + 2500 * kUs, end_grads = t + 6500 * kUs;
        w.add(rr(main, stats, end_stats - stats_ns, end_stats, Category::comm, 3, i));
        w.add(rr(main, grads, end_grads - grads_ns, end_grads, Category::comm, 3, i));
      }
      w.add(store::StepRow{rank, i, t, t + 10 * kMs, 0, 0, 1.0, 0.1, 8});
    }
    w.finish();
  }
  store::merge_run(dir / "run", dir / "run.sqlite");
  return dir / "run.sqlite";
}

}  // namespace

TEST_CASE("SyncBatchNorm's exchanges are exposed communication, not compute", "[analysis]") {
  wb::test::TempDir tmp("syncbn-analysis");
  auto run = analysis::load_run(write_run(tmp.path(), true));
  auto steps = analysis::step_breakdown(run);
  REQUIRE(steps.size() == 4);
  for (const auto& b : steps) {
    CAPTURE(b.rank, b.step);
    const std::int64_t sync = b.rank == 0 ? 1500 * kUs : 2300 * kUs;
    CHECK(b.sync_bn_ns == sync);
    CHECK(b.compute_ns == 9 * kMs - sync);
    CHECK(b.comm_exposed_ns == sync);
    CHECK(b.other_ns == kMs);
  }
  // Without the exchanges, the same ranges are all compute.
  wb::test::TempDir tmp2("syncbn-analysis-off");
  auto off = analysis::load_run(write_run(tmp2.path(), false));
  for (const auto& b : analysis::step_breakdown(off)) {
    CHECK(b.sync_bn_ns == 0);
    CHECK(b.compute_ns == 9 * kMs);
    CHECK(b.comm_exposed_ns == 0);
  }
}

TEST_CASE("SyncBatchNorm summary: time per step, its parts, the wait for the slower rank, the layers", "[analysis]") {
  wb::test::TempDir tmp("syncbn-summary");
  auto run = analysis::load_run(write_run(tmp.path(), true));
  const auto s = analysis::sync_bn_summary(run);
  CHECK(s.ranks == 2);
  CHECK(s.steps == 4);
  CHECK(s.collectives_per_step == 2);
  CHECK(s.step_ns == Approx(10.0 * kMs));
  CHECK(s.sync_ns == Approx(1900.0 * kUs));      // (1.5 + 2.3) / 2 ms
  CHECK(s.forward_ns == Approx(1150.0 * kUs));   // (1.0 + 1.3) / 2
  CHECK(s.backward_ns == Approx(750.0 * kUs));   // (0.5 + 1.0) / 2
  CHECK(s.skew_ns == Approx(400.0 * kUs));       // rank 1 waits 0.3 + 0.5 ms per step; over 2 ranks
  REQUIRE(s.layers.size() == 1);
  CHECK(s.layers[0].layer == "bn1");
  CHECK(s.layers[0].forward_ns == 2 * (1000 + 1300) * kUs);
  CHECK(s.layers[0].backward_ns == 2 * (500 + 1000) * kUs);

  std::ostringstream out;
  analysis::write_report(run, out);
  const std::string text = out.str();
  CAPTURE(text);
  CHECK(text.find("SyncBatchNorm (--sync-bn global, groups of 2 rank(s))") != std::string::npos);
  CHECK(text.find("2 collectives, 1.900 ms = 19.0% of the step (10.000 ms), all of it exposed: forward 1.150 ms, "
                  "backward 750.0 us") != std::string::npos);
  CHECK(text.find("waiting for a slower rank 400.0 us, in the collectives themselves 1.500 ms") != std::string::npos);

  wb::test::TempDir tmp2("syncbn-summary-off");
  auto off = analysis::load_run(write_run(tmp2.path(), false));
  CHECK(analysis::sync_bn_summary(off).ranks == 0);
  std::ostringstream out2;
  analysis::write_report(off, out2);
  CHECK(out2.str().find("SyncBatchNorm") == std::string::npos);
}

TEST_CASE("The sharded classifier's exchanges: exposed communication, and wb report's section", "[analysis]") {
  wb::test::TempDir tmp("fcshard-analysis");
  auto run = analysis::load_run(write_run(tmp.path(), true, true));
  for (const auto& b : analysis::step_breakdown(run)) {
    CAPTURE(b.rank, b.step);
    const std::int64_t sync = b.rank == 0 ? 1500 * kUs : 2300 * kUs;
    CHECK(b.fc_shard_ns == sync);
    CHECK(b.sync_bn_ns == 0);
    CHECK(b.compute_ns == 9 * kMs - sync);
    CHECK(b.comm_exposed_ns == sync);
  }
  const auto s = analysis::fc_shard_summary(run);
  CHECK(s.sync_ns == Approx(1900.0 * kUs));
  CHECK(s.forward_ns == Approx(1150.0 * kUs));  // fc.shard_max
  CHECK(s.backward_ns == Approx(750.0 * kUs));  // fc.shard_grad
  CHECK(s.skew_ns == Approx(400.0 * kUs));
  REQUIRE(s.layers.size() == 2);
  CHECK(s.layers[0].layer == "fc.shard_max");
  CHECK(s.layers[1].layer == "fc.shard_grad");
  CHECK(analysis::sync_bn_summary(run).ranks == 0);
  std::ostringstream out;
  analysis::write_report(run, out);
  const std::string text = out.str();
  CAPTURE(text);
  CHECK(text.find("Sharded classifier (--shard-fc 2, groups of 2 rank(s))") != std::string::npos);
  CHECK(text.find("2 collectives, 1.900 ms = 19.0% of the step (10.000 ms), all of it exposed") != std::string::npos);
  CHECK(text.find("by exchange (all ranks and steps): fc.shard_max 4.600 ms, fc.shard_grad 3.000 ms") !=
        std::string::npos);
  CHECK(text.find("SyncBatchNorm") == std::string::npos);
}
