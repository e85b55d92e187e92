// wb-train --pipeline-stages S --micro-batches M, checked as a whole:
//   (a) bad combinations (M < S, a batch M does not divide, ranks not a multiple of S, an unknown or
//       misplaced split layer, an unknown schedule) are one line naming the flag and exit code 2;
//   (b) one step of 2 stages x 4 micro-batches on 2 ranks (gpipe and 1f1b) equals one single-process
//       step over the same mini-batch with the same micro-batches (--micro-batches 4): loss, every
//       gradient, parameter, momentum and running statistic after the step, within 1e-6 rel-L2;
//   (c) the dump holds full tensors under the usual keys, the same key set as a single process's,
//       activations included (each over the whole mini-batch, its micro-batches' joined in order, equal
//       to the single process's within 1e-6 rel-L2), and compare/reference/torch_step.py (PyTorch
//       running the micro-batches one at a time) reproduces it: `wb compare` passes on every row, the
//       174 activations included, and fails on a planted fault in a gradient and in an activation;
//   (d) the run file records every micro-batch's forward and backward, every send and receive with
//       the activation's bytes, per step each stage's busy and idle time; `wb report` prints the
//       bubble per stage against the ideal (S-1)/(M+S-1), and `wb export chrome` the messages as flows;
//   (e) SIGKILL of stage 1's rank ends the job within 60 s with a message naming it (mpirun's);
//   (f) the stages' message points (what PipelineStep posts, in order, as one group each) run to the
//       end under NCCL's rules for every S <= 5, M <= 9 and both schedules, where posting each send on
//       its own deadlocks 1F1B;
//   (g) [cuda] the same 2-stage step on the GPU (NCCL send/recv) equals the single-process GPU step.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store/reader.hpp"
#include "store/tensor_file.hpp"
#include "test_trainer_util.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/pipeline_plan.hpp"
#include "trainer/pipeline_step.hpp"
#include "support/peers.hpp"

extern char** environ;

namespace {

using wb::test::Result;
using wb::test::run_train;
using wb::test::TempDir;
using wb::test::with;
namespace fs = std::filesystem;

// Micro-batches of 8 images: BatchNorm's statistics over 8 x 1 x 1 values in layer4 stay well
// conditioned (with 2 images a micro-batch, fp32 noise alone moves them by whole percents).
std::vector<std::string> common_args() {
  return {"--data", "synthetic", "--synthetic-samples", "256", "--batch-size", "32", "--image-size", "32",
          "--seed", "5", "--lr", "0.02", "--threads", "1"};
}

std::string quote(const std::string& s) { return wb::test::shell_quote(s); }

struct Runs {
  TempDir dir;
  Result gpipe, one_f_one_b, single;
  Runs() {
    auto pipe = [&](const std::string& name, const std::string& schedule) {
      return run_train(with(common_args(), {"--nproc", "2", "--pipeline-stages", "2", "--micro-batches", "4",
                                            "--pipeline-schedule", schedule, "--steps", "1", "--dump-step", "0",
                                            "--run", (dir / (name + ".sqlite")).string()}));
    };
    gpipe = pipe("gpipe", "gpipe");
    one_f_one_b = pipe("1f1b", "1f1b");
    single = run_train(with(common_args(), {"--micro-batches", "4", "--steps", "1", "--dump-step", "0", "--run",
                                            (dir / "single.sqlite").string()}));
  }
};

Runs& runs() {
  static Runs r;
  return r;
}

std::vector<float> floats(const wb::store::TensorRow& t) {
  std::vector<float> v(t.data.size() / sizeof(float));
  std::memcpy(v.data(), t.data.data(), v.size() * sizeof(float));
  return v;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    n += double(b[i]) * double(b[i]);
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

// Every (kind, name) of a run's step-0 dump.
std::set<std::pair<std::string, std::string>> dump_keys(wb::store::Reader& r) {
  std::set<std::pair<std::string, std::string>> keys;
  for (const auto& info : r.tensors("run")) keys.insert({info.kind, info.name});
  return keys;
}

// The largest rel-L2 between two runs' step-0 dumps over the tensors of `kind`; counts them.
double worst_rel_l2(wb::store::Reader& a, wb::store::Reader& b, const std::string& kind, int& count) {
  double worst = 0;
  count = 0;
  for (const auto& info : b.tensors("run")) {
    if (info.kind != kind || info.dtype != "F32") continue;
    const auto ta = a.tensor("run", kind, info.name, 0, 0);
    REQUIRE(ta.shape == info.shape);
    worst = std::max(worst, rel_l2(floats(ta), floats(b.tensor("run", kind, info.name, 0, 0))));
    ++count;
  }
  return worst;
}


using wb::trainer::StageMessage;

// NCCL's rules, played out on the stages of one replica: each rank runs its groups one after the
// other, in the order posted; a message completes once the peer's running group holds its counterpart;
// a group completes once all its messages have; the host posts a stage's groups in order and, after
// posting one that holds a receive, waits for it (the stage needs that data to go on). Each directed
// pair's sends and receives must also come in the same micro-batch order, as NCCL matches them by
// order. `separate_sends`: each point's sends posted as a group of their own before its receive.
// Returns "" when every group of every stage completes, else what went wrong.
std::string play_nccl(const wb::trainer::PipelinePlan& plan, bool separate_sends) {
  const int S = plan.stages;
  std::vector<std::vector<std::vector<StageMessage>>> groups(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    for (const auto& point : wb::trainer::message_points(plan, s)) {
      std::vector<StageMessage> sends, all;
      for (const StageMessage& m : point) (m.send ? sends : all).push_back(m);
      if (!separate_sends) all.insert(all.begin(), sends.begin(), sends.end());
      if (separate_sends && !sends.empty()) groups[static_cast<std::size_t>(s)].push_back(sends);
      if (!all.empty()) groups[static_cast<std::size_t>(s)].push_back(all);
    }
  }
  // Message order per directed pair: the sender's sends and the receiver's receives.
  for (int s = 0; s < S; ++s) {
    for (int p : {s - 1, s + 1}) {
      if (p < 0 || p >= S) continue;
      std::vector<std::pair<bool, int>> sent, received;
      for (const auto& g : groups[static_cast<std::size_t>(s)]) {
        for (const auto& m : g) {
          if (m.send && m.peer_stage == p) sent.push_back({m.activation, m.micro});
        }
      }
      for (const auto& g : groups[static_cast<std::size_t>(p)]) {
        for (const auto& m : g) {
          if (!m.send && m.peer_stage == s) received.push_back({m.activation, m.micro});
        }
      }
      if (sent != received || sent.size() != static_cast<std::size_t>(plan.micro_batches)) {
        return "stage " + std::to_string(s) + " -> " + std::to_string(p) + ": sends and receives differ";
      }
    }
  }
  const auto n = static_cast<std::size_t>(S);
  std::vector<std::size_t> posted(n, 0), running(n, 0);
  std::vector<std::vector<std::vector<bool>>> done(n);
  for (std::size_t s = 0; s < n; ++s) {
    for (const auto& g : groups[s]) done[s].push_back(std::vector<bool>(g.size(), false));
  }
  auto has_recv = [](const std::vector<StageMessage>& g) {
    return std::any_of(g.begin(), g.end(), [](const StageMessage& m) { return !m.send; });
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < n; ++s) {
      while (posted[s] < groups[s].size() && (posted[s] == 0 || !has_recv(groups[s][posted[s] - 1]) || running[s] >= posted[s])) {
        ++posted[s];
        progress = true;
      }
    }
    for (std::size_t s = 0; s < n; ++s) {
      if (running[s] >= posted[s]) continue;
      const auto& g = groups[s][running[s]];
      for (std::size_t i = 0; i < g.size(); ++i) {
        const auto p = static_cast<std::size_t>(g[i].peer_stage);
        if (done[s][running[s]][i] || running[p] >= posted[p]) continue;
        const auto& h = groups[p][running[p]];
        for (std::size_t j = 0; j < h.size(); ++j) {
          if (h[j].send != g[i].send && h[j].activation == g[i].activation && h[j].micro == g[i].micro &&
              h[j].peer_stage == static_cast<int>(s)) {
            done[s][running[s]][i] = done[p][running[p]][j] = true;
            progress = true;
          }
        }
      }
    }
    for (std::size_t s = 0; s < n; ++s) {
      if (running[s] < posted[s] &&
          std::all_of(done[s][running[s]].begin(), done[s][running[s]].end(), [](bool d) { return d; })) {
        ++running[s];
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < n; ++s) {
    if (running[s] < groups[s].size()) {
      return "stage " + std::to_string(s) + " stops at group " + std::to_string(running[s]) + " of " +
             std::to_string(groups[s].size());
    }
  }
  return "";
}

}  // namespace

TEST_CASE("pipeline: the stages' message groups run to the end under NCCL's ordering", "[trainer][pipeline]") {
  int deadlocks_alone = 0, plans = 0;
  for (int S = 2; S <= 5; ++S) {
    for (int M = S; M <= 9; ++M) {
      for (bool one_f_one_b : {false, true}) {
        wb::trainer::PipelinePlan plan;
        plan.stages = S;
        plan.micro_batches = M;
        plan.one_f_one_b = one_f_one_b;
        CAPTURE(S, M, one_f_one_b);
        CHECK(play_nccl(plan, false).empty());
        const std::string alone = play_nccl(plan, true);
        deadlocks_alone += !alone.empty();
        ++plans;
        // GPipe's sends never wait on the stage's own receives; 1F1B's would, without the groups.
        if (one_f_one_b) CHECK(alone.find("stops at group") != std::string::npos);
        if (!one_f_one_b) CHECK(alone.empty());
      }
    }
  }
  CHECK(plans == 2 * (8 + 7 + 6 + 5));
  CHECK(deadlocks_alone == plans / 2);
}

TEST_CASE("pipeline: bad combinations are one line naming the flag, exit code 2", "[trainer][pipeline]") {
  TempDir dir;
  auto bad = [&](const std::vector<std::string>& flags) {
    return run_train(with(with(common_args(), {"--steps", "1", "--run", (dir / "bad.sqlite").string()}), flags));
  };
  wb::test::require_one_line_error(bad({"--pipeline-stages", "2", "--micro-batches", "1"}),
                                   {"--micro-batches 1", "fewer micro-batches than the 2 pipeline stages"});
  wb::test::require_one_line_error(bad({"--micro-batches", "5"}), {"--batch-size 32", "not divisible by --micro-batches 5"});
  wb::test::require_one_line_error(bad({"--pipeline-stages", "2", "--micro-batches", "4", "--nproc", "3"}),
                                   {"--pipeline-stages 2", "--nproc 3", "not a multiple"});
  wb::test::require_one_line_error(bad({"--pipeline-stages", "2", "--micro-batches", "4", "--stage-split", "layer9"}),
                                   {"--stage-split layer9", "unknown split layer 'layer9'"});
  wb::test::require_one_line_error(
      bad({"--pipeline-stages", "3", "--micro-batches", "4", "--stage-split", "layer3,layer2"}),
      {"--stage-split layer3,layer2", "'layer2' does not come after"});
  wb::test::require_one_line_error(bad({"--pipeline-stages", "3", "--micro-batches", "4", "--stage-split", "layer3"}),
                                   {"--stage-split layer3", "1 split point for 3 stages; expected 2"});
  wb::test::require_one_line_error(bad({"--pipeline-stages", "2", "--micro-batches", "2", "--pipeline-schedule", "zb"}),
                                   {"--pipeline-schedule", "expected gpipe or 1f1b, got 'zb'"});
  wb::test::require_one_line_error(bad({"--stage-split", "layer3"}), {"--stage-split layer3", "one pipeline stage"});
  wb::test::require_one_line_error(bad({"--pipeline-stages", "0"}), {"--pipeline-stages 0", "expected 1..18"});
}

TEST_CASE("pipeline: 2 stages x 4 micro-batches equal one process running the 4 micro-batches",
          "[trainer][pipeline][mpi]") {
  Runs& r = runs();
  for (const Result* res : {&r.gpipe, &r.one_f_one_b, &r.single}) {
    CAPTURE(res->out, res->err);
    REQUIRE(res->exit_code == 0);
  }
  CHECK(r.gpipe.out.find("wb-train: pipeline 2 stages x 1 replica, 4 micro-batches of 8, gpipe, loss sum: "
                         "head..layer2.3 | layer3.0..fc") != std::string::npos);
  wb::store::Reader single(r.dir / "single.sqlite");
  for (const char* name : {"gpipe", "1f1b"}) {
    CAPTURE(name);
    wb::store::Reader pipe(r.dir / (std::string(name) + ".sqlite"));
    CHECK(pipe.world_size() == 2);
    // The dump holds the whole step under the usual keys: the batch, and all 161 parameters'
    // gradients, although rank 0 computed only stage 0's.
    const auto input = pipe.tensor("run", "input", "input", 0, 0);
    CHECK(input.shape == std::vector<std::int64_t>{32, 3, 32, 32});
    CHECK(floats(input) == floats(single.tensor("run", "input", "input", 0, 0)));
    const float loss_pipe = floats(pipe.tensor("run", "loss", "loss", 0, 0))[0];
    const float loss_single = floats(single.tensor("run", "loss", "loss", 0, 0))[0];
    CAPTURE(loss_pipe, loss_single);
    CHECK(std::abs(loss_pipe - loss_single) <= 1e-6 * std::abs(loss_single));
    // The same keys as the single process's dump, activations included, and the same numbers: each
    // activation over the whole mini-batch, although the stages computed them 8 images at a time.
    CHECK(dump_keys(pipe) == dump_keys(single));
    for (const char* kind : {"act", "grad", "param_after", "momentum", "buffer_after"}) {
      int count = 0;
      const double worst = worst_rel_l2(pipe, single, kind, count);
      CAPTURE(kind, worst, count);
      const std::string k = kind;
      CHECK(count == (k == "act" ? 174 : k == "buffer_after" ? 106 : 161));  // 53 BatchNorms' mean and var
      CHECK(worst <= 1e-6);
    }
    // Stage 1's outputs too: layer4's last block and the logits, over all 32 images.
    CHECK(pipe.tensor("run", "act", "layer4.2", 0, 0).shape == std::vector<std::int64_t>{32, 2048, 1, 1});
    CHECK(pipe.tensor("run", "act", "fc", 0, 0).shape == std::vector<std::int64_t>{32, 10});
    // num_batches_tracked grew by 4 (once per micro-batch) in every BatchNorm, stage 1's included.
    const auto nbt = pipe.tensor("run", "buffer_after", "layer4.2.bn3.num_batches_tracked", 0, 0);
    std::int64_t n = 0;
    std::memcpy(&n, nbt.data.data(), sizeof n);
    CHECK(n == 4);
  }
}

TEST_CASE("pipeline: torch_step.py reproduces the 2-stage step and wb compare passes", "[trainer][pipeline][mpi][torch]") {
  Runs& r = runs();
  REQUIRE(r.gpipe.exit_code == 0);
  const fs::path run = r.dir / "gpipe.sqlite";
  const std::string script = (fs::path(WB_SOURCE_DIR) / "compare" / "reference" / "torch_step.py").string();
  auto torch_step = [&](const fs::path& out, const std::string& extra) {
    return wb::test::run_command(quote(WB_PYTHON) + " " + quote(script) + " " + quote(run.string()) + " --out " +
                                 quote(out.string()) + " --threads 2" + extra);
  };
  const Result ref = torch_step(r.dir / "torch.safetensors", "");
  CAPTURE(ref.out, ref.err);
  REQUIRE(ref.exit_code == 0);
  CHECK(ref.err.find("4 micro-batches run one at a time, loss = sum") != std::string::npos);
  const Result cmp = wb::test::run_command(quote(WB_CLI) + " compare " + quote(run.string()) + " " +
                                           quote((r.dir / "torch.safetensors").string()) + " --all");
  CAPTURE(cmp.out, cmp.err);
  CHECK(cmp.exit_code == 0);
  CHECK(cmp.out.find("0 fail, 0 only in B, 0 only in A") != std::string::npos);
  // Every activation is compared, and passes (--all lists every row).
  std::size_t act_rows = 0;
  for (std::size_t at = cmp.out.find("PASS    act."); at != std::string::npos; at = cmp.out.find("PASS    act.", at + 1)) {
    ++act_rows;
  }
  CHECK(act_rows == 174);

  // The comparison can fail: the same reference with layer4.2.conv3's gradient doubled does.
  std::map<std::string, std::string> metadata;
  auto tensors = wb::store::read_safetensors(r.dir / "torch.safetensors", &metadata);
  bool planted = false;
  for (auto& t : tensors) {
    if (t.name != "grad.layer4.2.conv3.weight") continue;
    auto* v = reinterpret_cast<float*>(t.data.data());
    for (std::int64_t i = 0; i < t.numel(); ++i) v[i] *= 2.0f;
    planted = true;
  }
  REQUIRE(planted);
  wb::store::write_safetensors(r.dir / "fault.safetensors", tensors, metadata);

  // The summed loss of 4 micro-batches is judged against 4 x the one-loss bound (1e-4): a reference
  // loss 3e-4 away passes, 5e-4 away fails, whatever the gradients. That is the fixed bound, so these
  // references carry no wb.noise (with it, the bound is the larger of that and 5x the loss's noise).
  wb::store::Reader dumped(run);
  const float run_loss = floats(dumped.tensor("run", "loss", "loss", 0, 0))[0];
  auto fixed_metadata = metadata;
  fixed_metadata.erase("wb.noise");
  auto with_loss = [&](float offset, const std::string& name) {
    auto ts = wb::store::read_safetensors(r.dir / "torch.safetensors");
    for (auto& t : ts) {
      if (t.name != "loss") continue;
      const float v = run_loss + offset;
      std::memcpy(t.data.data(), &v, sizeof v);
    }
    wb::store::write_safetensors(r.dir / name, ts, fixed_metadata);
    return wb::test::run_command(quote(WB_CLI) + " compare " + quote(run.string()) + " " + quote((r.dir / name).string()));
  };
  const Result near = with_loss(3e-4f, "near.safetensors");
  CAPTURE(near.out);
  CHECK(near.exit_code == 0);
  const Result far = with_loss(5e-4f, "far.safetensors");
  CAPTURE(far.out);
  CHECK(far.exit_code == 1);
  CHECK(far.out.find("First divergence: loss") != std::string::npos);
  const Result cmp_fault = wb::test::run_command(quote(WB_CLI) + " compare " + quote(run.string()) + " " +
                                                 quote((r.dir / "fault.safetensors").string()));
  CAPTURE(cmp_fault.out);
  CHECK(cmp_fault.exit_code == 1);
  CHECK(cmp_fault.out.find("grad.layer4.2.conv3.weight") != std::string::npos);

  // And an activation of stage 1 off by 1% in its last micro-batch's images fails, named.
  auto acts = wb::store::read_safetensors(r.dir / "torch.safetensors");
  planted = false;
  for (auto& t : acts) {
    if (t.name != "act.layer3.0.conv1") continue;
    auto* v = reinterpret_cast<float*>(t.data.data());
    for (std::int64_t i = t.numel() * 3 / 4; i < t.numel(); ++i) v[i] *= 1.01f;
    planted = true;
  }
  REQUIRE(planted);
  wb::store::write_safetensors(r.dir / "act_fault.safetensors", acts, metadata);
  const Result cmp_act = wb::test::run_command(quote(WB_CLI) + " compare " + quote(run.string()) + " " +
                                               quote((r.dir / "act_fault.safetensors").string()));
  CAPTURE(cmp_act.out);
  CHECK(cmp_act.exit_code == 1);
  CHECK(cmp_act.out.find("First divergence: act.layer3.0.conv1") != std::string::npos);
}

TEST_CASE("pipeline: micro-batches, messages and bubbles are recorded and reported", "[trainer][pipeline][mpi]") {
  Runs& r = runs();
  REQUIRE(r.gpipe.exit_code == 0);
  wb::store::Reader run(r.dir / "gpipe.sqlite");
  const auto spans = run.pipeline_spans();
  // Stage 0 sends layer2's output: 8 images x 512 channels x 4 x 4 floats.
  const std::int64_t act_bytes = 8LL * 512 * 4 * 4 * 4;
  std::map<std::tuple<int, int, std::string>, int> count;  // (rank, step, kind) -> spans
  std::map<std::pair<int, int>, std::int64_t> sent_post;   // (step, micro) -> send_act posted
  std::map<std::pair<int, int>, std::int64_t> recv_end;    // (step, micro) -> recv_act done
  for (const auto& s : spans) {
    CAPTURE(s.rank, s.step, s.micro, s.kind);
    ++count[{s.rank, s.step, s.kind}];
    CHECK(s.stage == s.rank);
    CHECK(s.micro >= 0);
    CHECK(s.micro < 4);
    CHECK(s.post_ns <= s.start_ns);
    CHECK(s.start_ns <= s.end_ns);
    if (s.kind == "forward" || s.kind == "backward") {
      CHECK(s.peer == -1);
      CHECK(s.bytes == 0);
    } else {
      CHECK(s.peer == 1 - s.rank);
      CHECK(s.bytes == act_bytes);
    }
    if (s.kind == "send_act") sent_post[{s.step, s.micro}] = s.post_ns;
    if (s.kind == "recv_act") recv_end[{s.step, s.micro}] = s.end_ns;
  }
  for (int step = 0; step < 1; ++step) {
    CAPTURE(step);
    for (const char* k : {"forward", "backward"}) {
      CHECK(count[{0, step, k}] == 4);
      CHECK(count[{1, step, k}] == 4);
    }
    CHECK(count[{0, step, "send_act"}] == 4);
    CHECK(count[{0, step, "recv_grad"}] == 4);
    CHECK(count[{1, step, "recv_act"}] == 4);
    CHECK(count[{1, step, "send_grad"}] == 4);
    CHECK(count[{0, step, "recv_act"}] == 0);
    CHECK(count[{1, step, "send_act"}] == 0);
    // An activation arrives after it was sent (rank 0's clock; the offset is good to well under 1 ms).
    for (int m = 0; m < 4; ++m) CHECK(recv_end[{step, m}] + 1'000'000 >= sent_post[{step, m}]);
  }
  const auto steps = run.pipeline_steps();
  REQUIRE(steps.size() == 2);
  for (const auto& s : steps) {
    CAPTURE(s.rank, s.step, s.busy_ns, s.wait_act_ns, s.wait_grad_ns, s.end_ns - s.start_ns);
    CHECK(s.stage == s.rank);
    CHECK(s.replica == 0);
    CHECK(s.busy_ns > 0);
    CHECK(s.busy_ns + s.wait_act_ns + s.wait_grad_ns + s.wait_allreduce_ns <= s.end_ns - s.start_ns);
    if (s.stage == 0) CHECK(s.wait_act_ns == 0);  // it reads the images itself
    if (s.stage == 1) CHECK(s.wait_grad_ns == 0);  // it starts backward from its own loss
    CHECK(s.wait_allreduce_ns == 0);               // one replica per stage: nothing to reduce
  }
  const Result report = wb::test::run_command(quote(WB_CLI) + " report " + quote((r.dir / "gpipe.sqlite").string()));
  CAPTURE(report.out, report.err);
  REQUIRE(report.exit_code == 0);
  CHECK(report.out.find("Pipeline: 2 stages x 1 replica(s), 4 micro-batches of 8, gpipe, loss sum") != std::string::npos);
  CHECK(report.out.find("head..layer2.3") != std::string::npos);
  CHECK(report.out.find("ideal (S-1)/(M+S-1) = 20.0%") != std::string::npos);
  CHECK(report.out.find("balanced split: --stage-split ") != std::string::npos);
  CHECK(report.out.find("ideal equal stages need --micro-batches 10") != std::string::npos);
  // wb export chrome: the 32 spans on the pipeline lanes, and one flow arrow per message (4 activations
  // forward, 4 gradients back).
  const Result chrome = wb::test::run_command(quote(WB_CLI) + " export chrome " + quote((r.dir / "gpipe.sqlite").string()) +
                                              " " + quote((r.dir / "trace.json").string()));
  CAPTURE(chrome.out, chrome.err);
  REQUIRE(chrome.exit_code == 0);
  CHECK(chrome.out.find("8 flows, 0 allreduce spans, 32 pipeline spans") != std::string::npos);
  const std::string trace = wb::test::read_text(r.dir / "trace.json");
  CHECK(trace.find("\"name\":\"activations\",\"cat\":\"p2p\",\"ph\":\"s\"") != std::string::npos);
  CHECK(trace.find("\"name\":\"gradients\",\"cat\":\"p2p\",\"ph\":\"f\"") != std::string::npos);
}

TEST_CASE("pipeline: SIGKILL of stage 1's rank ends the job within 60 s, naming it", "[trainer][pipeline][mpi]") {
  TempDir dir;
  const fs::path out = dir / "kill.stdout";
  const fs::path err = dir / "kill.stderr";
  std::vector<std::string> args = {"--data", "synthetic", "--synthetic-samples", "256", "--batch-size", "8",
                                   "--threads", "1", "--nproc", "2", "--pipeline-stages", "2", "--micro-batches", "2",
                                   "--steps", "100000", "--log-every", "1", "--no-profile", "--run",
                                   (dir / "kill.sqlite").string()};
  const pid_t launcher = wb::test::spawn_train(args, out, err);  // wb-train, which replaces itself with mpirun

  // Both stages are training once rank 0 reports its second step (a step needs both stages).
  using Clock = std::chrono::steady_clock;
  const auto setup_deadline = Clock::now() + std::chrono::seconds(300);
  std::vector<pid_t> ranks;
  while (Clock::now() < setup_deadline) {
    ranks = wb::test::children_named(launcher, "wb-train");
    if (ranks.size() == 2 && wb::test::read_text(out).find("[2/100000]") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CAPTURE(wb::test::read_text(out), wb::test::read_text(err));
  REQUIRE(ranks.size() == 2);
  pid_t victim = 0, survivor = 0;
  for (pid_t p : ranks) (wb::test::rank_of(p) == 1 ? victim : survivor) = p;
  REQUIRE(victim != 0);
  REQUIRE(survivor != 0);

  REQUIRE(kill(victim, SIGKILL) == 0);
  const auto killed_at = Clock::now();
  int status = 0;
  bool launcher_done = false;
  while (Clock::now() - killed_at < std::chrono::seconds(60)) {
    if (!launcher_done && waitpid(launcher, &status, WNOHANG) == launcher) launcher_done = true;
    if (launcher_done && !wb::test::alive(survivor)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  const bool survivor_gone = !wb::test::alive(survivor);
  if (!launcher_done) {  // leave nothing behind before failing
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
  }
  if (!survivor_gone) kill(survivor, SIGKILL);
  const std::string all_output = wb::test::read_text(out) + wb::test::read_text(err);
  CAPTURE(seconds, all_output);
  REQUIRE(launcher_done);
  CHECK(survivor_gone);
  CHECK(seconds < 60.0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  CHECK(code != 0);
  CHECK(all_output.find("rank 1") != std::string::npos);
}

// NCCL needs MPI (its unique id travels over it): a build without MPI has no NCCL, and this case is not built.
#ifdef WB_PARALLEL_MPI
TEST_CASE("pipeline: 2 stages on the GPU (NCCL send/recv) equal one GPU process running the 4 micro-batches",
          "[trainer][pipeline][mpi][cuda]") {
  const int devices = wb::backend::cuda_device_count();
  REQUIRE(devices > 0);  // the test main skips [cuda] cases without a device
  TempDir dir;
  auto gpu = [&](const std::string& name, const std::vector<std::string>& flags) {
    const Result r = run_train(with(with(common_args(), {"--device", "cuda", "--precision", "fp32", "--micro-batches", "4",
                                                         "--steps", "1", "--dump-step", "0", "--run",
                                                         (dir / (name + ".sqlite")).string()}),
                                    flags));
    CAPTURE(name, r.out, r.err);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  std::vector<std::string> two = {"--nproc", "2", "--pipeline-stages", "2"};
  if (devices == 1) two = with(two, {"--ranks-per-gpu", "2"});
  gpu("single", {});
  for (const char* schedule : {"gpipe", "1f1b"}) {
    CAPTURE(schedule);
    const Result r = gpu(schedule, with(two, {"--pipeline-schedule", schedule}));
    CHECK(r.out.find("wb-train: pipeline 2 stages x 1 replica, 4 micro-batches of 8, " + std::string(schedule)) !=
          std::string::npos);
    const fs::path run = dir / (std::string(schedule) + ".sqlite");
    // cuDNN picks each convolution's algorithm by timing it, so two processes may sum in different
    // orders: every tensor passes wb compare's fp32 tolerances (the ones PyTorch against this
    // workbench passes), activations and gradients included, and the loss agrees to fp32 noise.
    const Result cmp = wb::test::run_command(quote(WB_CLI) + " compare " + quote(run.string()) + " " +
                                             quote((dir / "single.sqlite").string()));
    CAPTURE(cmp.out);
    CHECK(cmp.exit_code == 0);
    CHECK(cmp.out.find("0 fail, 0 only in B, 0 only in A") != std::string::npos);
    wb::store::Reader pipe(run);
    wb::store::Reader single(dir / "single.sqlite");
    CHECK(pipe.world_size() == 2);
    CHECK(dump_keys(pipe) == dump_keys(single));
    const float loss_pipe = floats(pipe.tensor("run", "loss", "loss", 0, 0))[0];
    const float loss_single = floats(single.tensor("run", "loss", "loss", 0, 0))[0];
    CAPTURE(loss_pipe, loss_single);
    CHECK(std::abs(loss_pipe - loss_single) <= 1e-5 * std::abs(loss_single));
    // Every micro-batch's activations went over NCCL, and its gradient came back.
    int sends = 0;
    for (const auto& sp : pipe.pipeline_spans()) sends += sp.kind == "send_act" || sp.kind == "send_grad";
    CHECK(sends == 8);
  }
}
#endif  // WB_PARALLEL_MPI
