// wb-train with 2 ranks (--nproc 2, OpenMPI on this host), checked as a whole:
//   (a) --check-sync: parameters bit-identical on both ranks after each of 20 steps, and a run whose
//       ranks use different learning rates is stopped after step 0;
//   (b) the averaged gradient of step 0 equals the mean of the gradients each rank's shard gives in a
//       single process (--shard R/2), rel-L2 <= 1e-6;
//   (c) other split points, or one bucket, leave the parameters after 10 steps bit-identical;
//   (d) with several buckets the first allreduce starts before backward ends (overlap > 0);
//   the merged run file: 2 ranks, both ranks' steps, allreduce rows with ready <= start <= end;
//   (e) [cuda] the same over NCCL on the GPU: 10 steps with --check-sync, 2 ranks on one GPU when there
//       is only one (--ranks-per-gpu 2), and buckets that start before backward ends.

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "test_trainer_util.hpp"
#include "trainer/backend/backend.hpp"
#include "support/peers.hpp"

namespace {

using wb::test::with;
using wb::test::Result;
using wb::test::run_train;
using wb::test::TempDir;
namespace fs = std::filesystem;

std::vector<std::string> common_args() {
  return {"--data", "synthetic", "--synthetic-samples", "256", "--batch-size", "4", "--image-size", "32",
          "--seed", "3", "--lr", "0.05"};
}

// Every run of this file, made once. The 2-rank jobs use one compute thread per rank (2 cores / 2
// ranks); the single-process shard runs ask for the same so their kernels sum in the same order.
struct Runs {
  TempDir dir;
  Result sync;                  // 20 steps, --check-sync, split 85,160, profiled
  Result split_85, split_40, one_bucket;  // 10 steps each, saved
  Result shard_0, shard_1;      // single process, shard R of 2, step 0 dumped
  Runs() {
    sync = run_train(with(common_args(), {"--nproc", "2", "--steps", "20", "--check-sync", "--allreduce-split",
                                          "85,160", "--run", (dir / "sync.sqlite").string()}));
    auto ten = [&](const std::string& name, const std::vector<std::string>& buckets, bool dump) {
      auto args = with(common_args(), {"--nproc", "2", "--steps", "10", "--no-profile", "--run",
                                       (dir / (name + ".sqlite")).string(), "--save",
                                       (dir / (name + ".safetensors")).string()});
      args = with(args, buckets);
      if (dump) args = with(args, {"--dump-step", "0"});
      return run_train(args);
    };
    split_85 = ten("split_85", {"--allreduce-split", "85,160"}, true);
    split_40 = ten("split_40", {"--allreduce-split", "40,100,160"}, false);
    one_bucket = ten("one_bucket", {"--allreduce-split", "none"}, false);
    auto shard = [&](const std::string& which) {
      return run_train(with(common_args(), {"--shard", which + "/2", "--threads", "1", "--steps", "1", "--no-profile",
                                            "--dump-step", "0", "--run",
                                            (dir / ("shard_" + which + ".sqlite")).string()}));
    };
    shard_0 = shard("0");
    shard_1 = shard("1");
  }
};

Runs& runs() {
  static Runs r;
  return r;
}

std::vector<float> floats(const std::vector<std::byte>& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

}  // namespace

TEST_CASE("2 ranks: --check-sync passes 20 steps and the merged run file holds both ranks", "[trainer][mpi]") {
  Runs& r = runs();
  CAPTURE(r.sync.out, r.sync.err);
  REQUIRE(r.sync.exit_code == 0);
  CHECK(r.sync.err.find("parameters differ") == std::string::npos);
  CHECK(r.sync.out.find("allreduce buckets (3)") != std::string::npos);

  wb::store::Reader run(r.dir / "sync.sqlite");
  CHECK(run.complete());
  CHECK(run.world_size() == 2);
  CHECK(run.config().at("check_sync") == true);
  auto ranks = run.ranks();
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[0].rank == 0);
  CHECK(ranks[1].rank == 1);
  CHECK(ranks[0].pid != ranks[1].pid);
  for (int rank : {0, 1}) {
    auto steps = run.steps(rank);
    CAPTURE(rank);
    REQUIRE(steps.size() == 20);
    for (int s = 0; s < 20; ++s) {
      CHECK(steps[static_cast<std::size_t>(s)].step == s);
      CHECK(steps[static_cast<std::size_t>(s)].images == 4);
      CHECK(std::isfinite(steps[static_cast<std::size_t>(s)].loss));
    }
  }
  // Every bucket of every step on both ranks, each span in order: ready <= start <= end.
  auto spans = run.allreduces();
  CHECK(spans.size() == 2u * 20u * 3u);
  int bad = 0;
  for (const auto& s : spans) bad += !(s.ready_ns <= s.start_ns && s.start_ns <= s.end_ns);
  CHECK(bad == 0);
  std::map<int, std::int64_t> bytes_by_bucket;
  for (const auto& s : spans) bytes_by_bucket[s.bucket] = s.bytes;
  REQUIRE(bytes_by_bucket.size() == 3);
  CHECK(bytes_by_bucket[2] == 10 * 4);  // fc.bias of 10 classes alone in the last bucket

  // The communicator's calibration before step 0, on both ranks: allreduce alone from 4 KiB, x4 each
  // size to 1 MiB and x2 above, up to the job's gradient bytes; the convolution alone; and buckets of
  // 4 KiB .. 16 MiB and of the whole gradient marked ready between convolutions, with the convolutions
  // meanwhile.
  CHECK(r.sync.out.find("wb-train: communicator calibrated in ") != std::string::npos);
  std::int64_t grad_bytes = 0;
  for (const auto& p : run.params()) grad_bytes += p.numel * 4;
  const auto cal = run.comm_calibrations();
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    std::vector<std::int64_t> sizes;
    std::map<std::string, int> kinds;
    for (const auto& c : cal) {
      if (c.rank != rank) continue;
      ++kinds[c.kind];
      CHECK(c.median_ns > 0);
      CHECK(c.min_ns <= c.median_ns);
      CHECK(c.reps >= 3);
      if (c.kind == "allreduce") sizes.push_back(c.bytes);
    }
    REQUIRE(sizes.size() >= 2);
    CHECK(sizes.front() == 4096);
    CHECK(sizes.back() == grad_bytes);
    for (std::size_t i = 1; i + 1 < sizes.size(); ++i) CHECK(sizes[i] == (sizes[i - 1] < (1 << 20) ? 4 : 2) * sizes[i - 1]);
    CHECK(kinds["compute"] == 1);
    std::vector<std::int64_t> during;
    for (const auto& c : cal)
      if (c.rank == rank && c.kind == "allreduce_during_compute") during.push_back(c.bytes);
    const std::vector<std::int64_t> want_during = {4096, 65536, 1 << 20, 16 << 20, grad_bytes};
    CHECK(during == want_during);
    CHECK(kinds["compute_during_allreduce"] == 5);
    CHECK(kinds["compute_while_waiting"] == 1);
  }
}

TEST_CASE("2 ranks: buckets start allreducing before backward ends", "[trainer][mpi]") {
  Runs& r = runs();
  REQUIRE(r.sync.exit_code == 0);
  wb::store::Reader run(r.dir / "sync.sqlite");
  // Per rank and step: the end of the last backward range, and the first bucket's start.
  std::map<std::pair<int, int>, std::int64_t> backward_end, first_start;
  auto& q = run.db().prepare(
      "SELECT t.rank, r.step, MAX(r.end_ns) FROM range r JOIN track t ON r.track_id = t.id "
      "WHERE r.category = 1 AND r.step >= 0 GROUP BY t.rank, r.step");
  while (q.step()) {
    backward_end[{static_cast<int>(q.column_int64(0)), static_cast<int>(q.column_int64(1))}] = q.column_int64(2);
  }
  q.reset();
  for (const auto& s : run.allreduces()) {
    auto key = std::make_pair(s.rank, s.step);
    auto it = first_start.find(key);
    if (it == first_start.end() || s.start_ns < it->second) first_start[key] = s.start_ns;
  }
  REQUIRE(backward_end.size() == 40);
  REQUIRE(first_start.size() == 40);
  int overlapped = 0;
  std::int64_t min_overlap = INT64_MAX;
  for (const auto& [key, end] : backward_end) {
    const std::int64_t overlap = end - first_start.at(key);
    overlapped += overlap > 0;
    min_overlap = std::min(min_overlap, overlap);
  }
  CAPTURE(min_overlap);
  CHECK(overlapped == 40);
  CHECK(min_overlap > 0);
}

TEST_CASE("2 ranks: the averaged step-0 gradient is the mean of the two shards' gradients", "[trainer][mpi]") {
  Runs& r = runs();
  CAPTURE(r.split_85.err, r.shard_0.err, r.shard_1.err);
  REQUIRE(r.split_85.exit_code == 0);
  REQUIRE(r.shard_0.exit_code == 0);
  REQUIRE(r.shard_1.exit_code == 0);
  wb::store::Reader dist_run(r.dir / "split_85.sqlite");
  wb::store::Reader shard_0(r.dir / "shard_0.sqlite");
  wb::store::Reader shard_1(r.dir / "shard_1.sqlite");

  // The shards really are different data: their inputs differ, and rank 0's input is shard 0's.
  auto in_dist = dist_run.tensor("run", "input", "input", 0, 0);
  auto in_0 = shard_0.tensor("run", "input", "input", 0, 0);
  auto in_1 = shard_1.tensor("run", "input", "input", 0, 0);
  CHECK(in_dist.data == in_0.data);
  CHECK(in_0.data != in_1.data);

  double diff2 = 0.0, ref2 = 0.0, shard_gap2 = 0.0;
  int grads = 0;
  // MPI sums two floats (commutative, exact order-free) and halves the sum (exact): with one compute
  // thread on both sides the averaged gradient is expected to be (g0 + g1) / 2 in float, bit for bit.
  std::int64_t not_bitwise = 0;
  for (const auto& info : dist_run.tensors("run")) {
    if (info.kind != "grad" || info.rank != 0 || info.step != 0) continue;
    ++grads;
    auto avg = floats(dist_run.tensor("run", "grad", info.name, 0, 0).data);
    auto g0 = floats(shard_0.tensor("run", "grad", info.name, 0, 0).data);
    auto g1 = floats(shard_1.tensor("run", "grad", info.name, 0, 0).data);
    REQUIRE(g0.size() == avg.size());
    REQUIRE(g1.size() == avg.size());
    for (std::size_t i = 0; i < avg.size(); ++i) {
      const double mean = 0.5 * (static_cast<double>(g0[i]) + static_cast<double>(g1[i]));
      const float float_mean = (g0[i] + g1[i]) / 2.0f;
      not_bitwise += std::memcmp(&float_mean, &avg[i], sizeof(float)) != 0;
      diff2 += (avg[i] - mean) * (avg[i] - mean);
      ref2 += mean * mean;
      shard_gap2 += (static_cast<double>(g0[i]) - mean) * (static_cast<double>(g0[i]) - mean);
    }
  }
  CHECK(grads == 161);
  const double rel_l2 = std::sqrt(diff2 / ref2);
  const double shard_rel = std::sqrt(shard_gap2 / ref2);
  CAPTURE(rel_l2, shard_rel, not_bitwise);
  CHECK(rel_l2 <= 1e-6);
  CHECK(not_bitwise == 0);
  // The check has teeth: one shard's gradient alone is far from the mean.
  CHECK(shard_rel > 1e-2);
}

TEST_CASE("2 ranks: split points do not change the parameters after 10 steps", "[trainer][mpi]") {
  Runs& r = runs();
  CAPTURE(r.split_85.err, r.split_40.err, r.one_bucket.err);
  REQUIRE(r.split_85.exit_code == 0);
  REQUIRE(r.split_40.exit_code == 0);
  REQUIRE(r.one_bucket.exit_code == 0);
  CHECK(r.split_85.out.find("allreduce buckets (3)") != std::string::npos);
  CHECK(r.split_40.out.find("allreduce buckets (4)") != std::string::npos);
  CHECK(r.one_bucket.out.find("allreduce buckets (1)") != std::string::npos);
  auto a = wb::test::read_checkpoint(r.dir / "split_85.safetensors");
  auto b = wb::test::read_checkpoint(r.dir / "split_40.safetensors");
  auto c = wb::test::read_checkpoint(r.dir / "one_bucket.safetensors");
  REQUIRE(a.size() == 161 + 53 * 3 + 161);
  // Momentum alone, then everything: parameters, momentum, and rank 0's BN statistics (which follow
  // from rank 0's data and the parameters, so they match too).
  for (const char* prefix : {"momentum.", ""}) {
    auto ab = wb::test::diff_checkpoints(a, b, prefix);
    auto ac = wb::test::diff_checkpoints(a, c, prefix);
    CAPTURE(prefix, ab.differing, ab.max_abs, ac.differing, ac.max_abs);
    CHECK(ab.differing == 0);
    CHECK(ac.differing == 0);
  }
  // Split points only change the bucket table recorded with the run.
  wb::store::Reader ra(r.dir / "split_85.sqlite");
  wb::store::Reader rc(r.dir / "one_bucket.sqlite");
  CHECK(ra.params().back().bucket == 2);
  CHECK(rc.params().back().bucket == 0);
  CHECK(ra.steps(0).back().loss == rc.steps(0).back().loss);
}

// NCCL needs MPI (its unique id travels over it): a build without MPI has no NCCL, and this case is not built.
#ifdef WB_PARALLEL_MPI
TEST_CASE("2 ranks over NCCL: --check-sync passes 10 steps and buckets overlap backward", "[trainer][mpi][cuda]") {
  const int devices = wb::backend::cuda_device_count();
  REQUIRE(devices > 0);  // the test main skips [cuda] cases without a device
  TempDir dir;
  const fs::path path = dir / "nccl.sqlite";
  auto args = with(common_args(), {"--device", "cuda", "--nproc", "2", "--steps", "10", "--check-sync",
                                   "--allreduce-split", "85,160", "--run", path.string()});
  if (devices == 1) args = with(args, {"--ranks-per-gpu", "2"});
  const Result r = run_train(args);
  CAPTURE(devices, r.out, r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("parameters differ") == std::string::npos);
  wb::store::Reader run(path);
  CHECK(run.complete());
  CHECK(run.world_size() == 2);
  auto spans = run.allreduces();
  CHECK(spans.size() == 2u * 10u * 3u);
  // Per rank and step: the first bucket's allreduce starts before the last backward range ends.
  std::map<std::pair<int, int>, std::int64_t> backward_end, first_start;
  auto& q = run.db().prepare(
      "SELECT t.rank, r.step, MAX(r.end_ns) FROM range r JOIN track t ON r.track_id = t.id "
      "WHERE r.category = 1 AND r.step >= 0 GROUP BY t.rank, r.step");
  while (q.step()) {
    backward_end[{static_cast<int>(q.column_int64(0)), static_cast<int>(q.column_int64(1))}] = q.column_int64(2);
  }
  q.reset();
  for (const auto& s : spans) {
    auto key = std::make_pair(s.rank, s.step);
    auto it = first_start.find(key);
    if (it == first_start.end() || s.start_ns < it->second) first_start[key] = s.start_ns;
  }
  REQUIRE(backward_end.size() == 20);
  int overlapped = 0;
  for (const auto& [key, end] : backward_end) overlapped += first_start.count(key) && end > first_start.at(key);
  CAPTURE(overlapped);
  CHECK(overlapped == 20);
}
#endif  // WB_PARALLEL_MPI

TEST_CASE("2 ranks: --check-sync stops the run when the ranks' parameters differ", "[trainer][mpi]") {
  // mpirun's multi-program form gives rank 1 another learning rate, so the parameters part after step 0.
  TempDir dir;
  auto rank_cmd = [&](const std::string& lr) {
    std::string cmd = " -np 1 " + wb::test::shell_quote(WB_TRAIN);
    for (const auto& a : with(common_args(), {"--steps", "3", "--no-profile", "--check-sync", "--run",
                                              (dir / "diverge.sqlite").string(), "--lr", lr})) {
      cmd += ' ';
      cmd += wb::test::shell_quote(a);
    }
    return cmd;
  };
  std::string cmd = "mpirun --oversubscribe --bind-to none";
  if (geteuid() == 0) cmd += " --allow-run-as-root";
  cmd += rank_cmd("0.05");
  cmd += " :";
  cmd += rank_cmd("0.07");
  Result r = wb::test::run_command(cmd);
  CAPTURE(r.exit_code, r.out, r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("rank 0: --check-sync: parameters differ across ranks after step 0") != std::string::npos);
  CHECK(r.err.find("rank 1: --check-sync: parameters differ across ranks after step 0") != std::string::npos);
  CHECK(r.out.find("step 1 [2/3]") == std::string::npos);
}
