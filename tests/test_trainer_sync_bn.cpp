// wb-train --sync-bn with 2 ranks (--nproc 2, OpenMPI on this host), checked as a whole:
//   (a) --sync-bn global with --allreduce-split 85,160 equals one process on the two ranks' batches
//       concatenated (the model and SGD built here, batch norm over the whole batch, the same starting
//       state): the loss, every gradient, the running statistics after the step and the parameters after
//       it, each within fp32 noise; the two ranks' batches each with their own statistics (what the run
//       would be without synchronisation) are far off, so the bounds can tell;
//   (b) every exchange is recorded: one "<bn>.sync_stats" and one "<bn>.sync_grads" comm range per
//       batch norm, step and rank, inside the batch norm's own range;
//   (c) torch_step.py replays the step (rank groups concatenated) and `wb compare` passes every tensor;
//       without every rank's dump it refuses with one line;
//   (d) --sync-bn local on one host warns that it equals global and gives bit-identical parameters; the
//       replay groups the ranks by the run file's hosts;
//   (e) a bad --sync-bn, or --sync-bn with pipeline stages, is one line naming the flag, exit 2;
//   (f) [cuda] (a) on the GPU: 2 ranks with --device cuda (sharing one GPU when there is only one) equal
//       one process on the concatenated batch, within the bounds of (a), the sums going over NCCL.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "support/numeric.hpp"
#include "support/python.hpp"
#include "test_trainer_reference.hpp"
#include "test_trainer_util.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/optim/sgd.hpp"
#include "support/peers.hpp"

namespace {

using wb::test::floats;
using wb::test::labels_of;
using wb::test::one_process;
using wb::test::Result;
using wb::test::StepResult;
using wb::test::worst;
using wb::test::run_train;
using wb::test::TempDir;
using wb::test::with;
namespace fs = std::filesystem;

constexpr int kBatch = 4;

std::vector<std::string> common_args() {
  return {"--data", "synthetic", "--synthetic-samples", "256", "--batch-size", std::to_string(kBatch),
          "--image-size", "32", "--seed", "3", "--lr", "0.05", "--nproc", "2", "--steps", "1"};
}

struct Runs {
  TempDir dir{"syncbn"};
  Result global, local;
  Runs() {
    global = run_train(with(common_args(), {"--sync-bn", "global", "--allreduce-split", "85,160", "--dump-step", "0",
                                            "--dump-ranks", "all", "--run", (dir / "global.sqlite").string(), "--save",
                                            (dir / "global.safetensors").string()}));
    local = run_train(with(common_args(), {"--sync-bn", "local", "--no-profile", "--run",
                                           (dir / "local.sqlite").string(), "--save",
                                           (dir / "local.safetensors").string()}));
  }
};

Runs& runs() {
  static Runs r;
  return r;
}


}  // namespace

TEST_CASE("2 ranks --sync-bn global equal 1 process on the concatenated batch", "[trainer][mpi]") {
  Runs& r = runs();
  CAPTURE(r.global.out, r.global.err);
  REQUIRE(r.global.exit_code == 0);
  CHECK(r.global.out.find("SyncBatchNorm (global): batch statistics over groups of 2 rank(s), over mpi") != std::string::npos);
  wb::store::Reader run(r.dir / "global.sqlite");
  const wb::test::Concatenated c = wb::test::concatenated_step(run, kBatch);
  const StepResult& ref = c.ref;
  const float run_loss = c.run_loss;

  // Bounds. Batch norm over a few values per channel (8 per channel in layer4 at 32x32) amplifies fp32
  // rounding on its way back, and oneDNN's own batch norm, which this reference runs, rounds more than
  // the synchronised path (whose statistics and dx coefficients are double): the same reference against
  // PyTorch differs by 1.6e-2 in layer4.2's gradients, where the run agrees with PyTorch to 2e-4 (the
  // torch_step.py case below holds it to that). Plain data parallel against PyTorch differs by 3.5e-2 in
  // the early layers' gradients. So the gradients here are held to fp32 noise of that size.
  std::string g_name, h_name, p_name, s_name;
  const double loss_err = std::fabs(run_loss - ref.loss) / std::fabs(ref.loss);
  const double g = worst(run, "grad", ref.grad, &g_name);
  const double head = worst(run, "grad", ref.grad, &h_name, {"fc.", "layer4.2."});
  const double p = worst(run, "param_after", ref.param_after, &p_name);
  const double s = worst(run, "buffer_after", ref.stats_after, &s_name);
  WARN("2 ranks --sync-bn global vs 1 process on the concatenated batch, worst rel-L2: loss " << loss_err
       << ", grad " << g << " (" << g_name << "), grad of fc and layer4.2 " << head << " (" << h_name
       << "), running stats " << s << " (" << s_name << "), param_after " << p << " (" << p_name << ")");
  CHECK(loss_err < 1e-4);
  CHECK(g < 0.1);
  CHECK(s < 1e-3);
  CHECK(p < 0.1);

  // Without synchronisation each rank normalises with its own batch's statistics: the mean of the two
  // ranks' gradients, and their running statistics, are then far from the concatenated batch's.
  StepResult h0 = one_process(run, c.halves[0], c.half_labels[0], kBatch);
  StepResult h1 = one_process(run, c.halves[1], c.half_labels[1], kBatch);
  std::map<std::string, std::vector<float>> mean_grad;
  for (auto& [name, v] : h0.grad) {
    std::vector<float> m(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) m[i] = 0.5f * (v[i] + h1.grad[name][i]);
    mean_grad[name] = m;
  }
  std::string n1, n2, n3;
  const double g_off = worst(run, "grad", mean_grad, &n1);
  const double head_off = worst(run, "grad", mean_grad, &n3, {"fc.", "layer4.2."});
  const double s_off = worst(run, "buffer_after", h0.stats_after, &n2);
  WARN("the same without synchronisation, worst rel-L2: grad " << g_off << " (" << n1 << "), grad of fc and layer4.2 "
       << head_off << " (" << n3 << "), running stats " << s_off << " (" << n2 << ")");
  CHECK(g_off > 5 * 0.1);
  CHECK(head_off > 10 * 0.1);
  CHECK(s_off > 100 * 1e-3);
}

TEST_CASE("2 ranks --sync-bn: every exchange is a comm range named after its layer", "[trainer][mpi]") {
  Runs& r = runs();
  REQUIRE(r.global.exit_code == 0);
  wb::store::Reader run(r.dir / "global.sqlite");
  CHECK(run.config().at("sync_bn") == "global");
  // Per rank: the sync ranges and the batch-norm module ranges that contain them.
  auto& q = run.db().prepare(
      "SELECT t.rank, s.text, r.category, r.start_ns, r.end_ns, "
      "(SELECT COUNT(*) FROM range o JOIN string os ON o.name_id = os.id WHERE o.track_id = r.track_id AND "
      " os.text = substr(s.text, 1, length(s.text) - 11) AND o.start_ns <= r.start_ns AND o.end_ns >= r.end_ns) "
      "FROM range r JOIN track t ON r.track_id = t.id JOIN string s ON r.name_id = s.id "
      "WHERE s.text LIKE '%.sync_stats' OR s.text LIKE '%.sync_grads'");
  std::map<int, int> stats, grads, contained;
  std::map<std::string, int> per_name;
  while (q.step()) {
    const int rank = static_cast<int>(q.column_int64(0));
    const std::string name = q.column_text(1);
    CHECK(q.column_int64(2) == static_cast<int>(wb::store::Category::comm));
    CHECK(q.column_int64(3) <= q.column_int64(4));
    (name.ends_with(".sync_stats") ? stats : grads)[rank]++;
    contained[rank] += q.column_int64(5) > 0;
    per_name[name]++;
  }
  q.reset();
  // 53 batch norms, one step, two ranks.
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    CHECK(stats[rank] == 53);
    CHECK(grads[rank] == 53);
    CHECK(contained[rank] == 106);
  }
  CHECK(per_name["bn1.sync_stats"] == 2);
  CHECK(per_name["layer4.2.bn3.sync_grads"] == 2);
  CHECK(per_name["layer1.0.downsample.1.sync_stats"] == 2);
}

TEST_CASE("2 ranks --sync-bn global: torch_step.py replays the step and wb compare passes", "[trainer][mpi]") {
  Runs& r = runs();
  REQUIRE(r.global.exit_code == 0);
  // The worst rel-L2 per kind of rank 0's dump against the replay; the classifier's gradients (before
  // any batch norm's amplification of rounding, see above) to 2e-3. The last block's gradients come
  // after layer4.2.bn3's backward over 8 values per channel: on AVX2 kernels its conv3 weight gradient
  // is 1.5e-2 from PyTorch's (AVX-512: under 2e-3), within wb compare's own bound, which passes above.
  const wb::test::Replay rep = wb::test::replay_and_compare(r.dir / "global.sqlite", r.dir / "global-torch.safetensors",
                                                            {"fc."});
  CHECK(rep.output.find("--sync-bn global: replaying the rank groups [[0, 1]]") != std::string::npos);
  WARN("2 ranks --sync-bn global vs torch_step.py, worst rel-L2 per kind:" << rep.describe()
       << "; grad of fc " << rep.focus << " (" << rep.focus_name << ")");
  CHECK(rep.focus < 2e-3);
  // The loss follows that batch norm too: 1.3e-5 relative on AVX2 kernels, 5e-6 on AVX-512; wb compare's
  // bound is 1e-4 absolute (about 4e-5 relative at this loss).
  CHECK(rep.by_kind.at("loss") < 3e-5);
  CHECK(rep.by_kind.at("buffer_after") < 1e-4);
}

TEST_CASE("torch_step.py: a --sync-bn run without every rank's dump is one line, exit 2", "[trainer][mpi]") {
  Runs& r = runs();
  REQUIRE(r.global.exit_code == 0);
  const fs::path partial = r.dir / "partial.sqlite";
  fs::copy_file(r.dir / "global.sqlite", partial, fs::copy_options::overwrite_existing);
  {
    wb::store::Db db(partial, wb::store::OpenMode::read_write);
    db.exec("DELETE FROM tensor WHERE rank = 1");
  }
  const fs::path script = fs::path(WB_SOURCE_DIR) / "compare" / "reference" / "torch_step.py";
  const auto replay = wb::test::run_python(wb::test::shell_quote(script.string()) + " " +
                                           wb::test::shell_quote(partial.string()) + " --out " +
                                           wb::test::shell_quote((r.dir / "partial-torch.safetensors").string()));
  CAPTURE(replay.output);
  CHECK(replay.exit_code == 2);
  CHECK(wb::test::count_lines(replay.err) == 1);
  CHECK(replay.err.find("--sync-bn global") != std::string::npos);
  CHECK(replay.err.find("--dump-ranks all") != std::string::npos);
}

namespace {
// The replay's rank groups for --sync-bn local, from the run file's hosts.
std::string local_groups(const fs::path& run) {
  const fs::path ref = fs::path(WB_SOURCE_DIR) / "compare" / "reference";
  const auto p = wb::test::run_python("-c " + wb::test::shell_quote("import sys; sys.path.insert(0, sys.argv[1]); "
                                                                    "import wbformat, syncbn_replay; "
                                                                    "print(syncbn_replay.groups_of(wbformat.RunFile("
                                                                    "sys.argv[2]), 'local', [0, 1]))") +
                                      " " + wb::test::shell_quote(ref.string()) + " " +
                                      wb::test::shell_quote(run.string()));
  CAPTURE(p.output);
  REQUIRE(p.exit_code == 0);
  return p.out;
}
}  // namespace

TEST_CASE("2 ranks --sync-bn local on one host: a warning, and the same step as global", "[trainer][mpi]") {
  Runs& r = runs();
  CAPTURE(r.local.out, r.local.err);
  REQUIRE(r.local.exit_code == 0);
  REQUIRE(r.global.exit_code == 0);
  CHECK(r.local.err.find("wb-train: warning: --sync-bn local: all 2 ranks run on this host, so local equals global") !=
        std::string::npos);
  const auto a = wb::test::read_checkpoint(r.dir / "local.safetensors");
  const auto b = wb::test::read_checkpoint(r.dir / "global.safetensors");
  const auto d = wb::test::diff_checkpoints(a, b, "");
  CHECK(d.compared > 300);
  CHECK(d.differing == 0);
  // The replay groups the ranks of one host; a rank on another host is a group of its own.
  CHECK(local_groups(r.dir / "local.sqlite") == "[[0, 1]]\n");
  const fs::path two_hosts = r.dir / "two-hosts.sqlite";
  fs::copy_file(r.dir / "local.sqlite", two_hosts, fs::copy_options::overwrite_existing);
  {
    wb::store::Db db(two_hosts, wb::store::OpenMode::read_write);
    db.exec("UPDATE rank SET host = 'another-host' WHERE rank = 1");
  }
  CHECK(local_groups(two_hosts) == "[[0], [1]]\n");
}

// NCCL needs MPI (its unique id travels over it): a build without MPI has no NCCL, and this case is not built.
#ifdef WB_PARALLEL_MPI
TEST_CASE("2 ranks on CUDA --sync-bn global equal 1 process on the concatenated batch", "[trainer][mpi][cuda]") {
  const int devices = wb::backend::cuda_device_count();
  REQUIRE(devices > 0);  // the test main skips [cuda] cases without a device
  TempDir dir{"syncbn-cuda"};
  auto args = with(common_args(), {"--device", "cuda", "--sync-bn", "global", "--allreduce-split", "85,160",
                                   "--dump-step", "0", "--dump-ranks", "all", "--run", (dir / "cuda.sqlite").string()});
  if (devices == 1) args = with(args, {"--ranks-per-gpu", "2"});
  const Result r = run_train(args);
  CAPTURE(devices, r.out, r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("SyncBatchNorm (global): batch statistics over groups of 2 rank(s), over nccl") != std::string::npos);
  wb::store::Reader run(dir / "cuda.sqlite");
  const wb::test::Concatenated c = wb::test::concatenated_step(run, kBatch);
  std::string g_name, p_name, s_name;
  const double loss_err = std::fabs(c.run_loss - c.ref.loss) / std::fabs(c.ref.loss);
  const double g = worst(run, "grad", c.ref.grad, &g_name);
  const double p = worst(run, "param_after", c.ref.param_after, &p_name);
  const double s = worst(run, "buffer_after", c.ref.stats_after, &s_name);
  WARN("2 ranks on CUDA --sync-bn global vs 1 CPU process on the concatenated batch, worst rel-L2: loss "
       << loss_err << ", grad " << g << " (" << g_name << "), running stats " << s << " (" << s_name
       << "), param_after " << p << " (" << p_name << ")");
  CHECK(loss_err < 1e-4);
  CHECK(g < 0.1);
  CHECK(s < 1e-3);
  CHECK(p < 0.1);
  // Each exchange recorded: one sync_stats and one sync_grads range per batch norm (53) and rank.
  auto& q = run.db().prepare(
      "SELECT COUNT(*) FROM range r JOIN string s ON r.name_id = s.id "
      "WHERE s.text LIKE '%.sync_stats' OR s.text LIKE '%.sync_grads'");
  REQUIRE(q.step());
  CHECK(q.column_int64(0) == 2 * 2 * 53);
  q.reset();
}
#endif  // WB_PARALLEL_MPI

TEST_CASE("--sync-bn: a bad value is one line naming the flag", "[trainer]") {
  auto r = run_train({"--sync-bn", "everywhere", "--steps", "1"});
  wb::test::require_one_line_error(r, {"--sync-bn", "off, local or global", "everywhere"});
  // Pipeline stages would need rank groups per stage: refused, for local as for global.
  for (const char* mode : {"local", "global"}) {
    auto pipe = run_train({"--sync-bn", mode, "--pipeline-stages", "2", "--micro-batches", "2", "--steps", "1"});
    wb::test::require_one_line_error(pipe, {std::string("--sync-bn ") + mode, "--pipeline-stages 2", "not supported"});
  }
}
