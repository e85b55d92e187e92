// Memory profiling: analysis::analyze_memory on hand-built events with known answers, and on real
// wb-train runs (synthetic 32x32 data, batch 8, one compute thread):
//   - what the run holds by role is checked against an independent count from ResNet-50's layer
//     shapes (parameters, statistics, momentum, the batch; activations and their gradients bounded by
//     the convolutions' output sizes);
//   - the breakdowns by role and by holder sum to the peak, which is the recorded live bytes' maximum;
//   - the CPU backend allocates nothing after the first step, so every later step holds the same;
//   - `wb report` shows the peak and its holders; --no-memory-profile records nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "profiler/analysis/memory.hpp"
#include "store/db.hpp"
#include "memory_test_util.hpp"
#include "test_trainer_util.hpp"
#include "support/peers.hpp"

namespace {

namespace fs = std::filesystem;
using wb::analysis::analyze_memory;
using wb::analysis::MemoryAnalysis;
using wb::analysis::RunData;
using wb::analysis::StepMemory;
using wb::test::MemoryBuilder;
using wb::test::Result;
using wb::test::TempDir;

using wb::test::kActivation;
using wb::test::kData;
using wb::test::kGradient;
using wb::test::kMomentum;
using wb::test::kOther;
using wb::test::kParameter;
using wb::test::kWorkspace;

std::int64_t sum_roles(const StepMemory& m) { return std::accumulate(m.by_role.begin(), m.by_role.end(), std::int64_t{0}); }
std::int64_t sum_holders(const StepMemory& m) {
  std::int64_t s = 0;
  for (const auto& h : m.holders) s += h.bytes;
  return s;
}

}  // namespace

TEST_CASE("the peak of a step, the op at it and what is alive then, from hand-built events", "[memory]") {
  MemoryBuilder b;
  b.event(10, 1000, kParameter, "parameters", -1);
  b.event(11, 1000, kMomentum, "momentum", -1);
  b.step(0, 100, 200);
  b.event(110, 300, kActivation, "conv1");
  b.event(120, 500, kActivation, "layer1.0.conv1");
  b.event(130, 64, kWorkspace, "layer1.0.conv1");
  b.event(140, -64, kWorkspace, "layer1.0.conv1");
  b.event(150, 200, kGradient, "fc");
  b.event(160, -500, kActivation, "layer1.0.conv1");  // freed after the peak
  b.event(170, 100, kGradient, "layer1.0.conv1");
  b.step(1, 300, 400);  // allocates nothing
  const MemoryAnalysis mem = analyze_memory(b.run);
  REQUIRE(mem.recorded);
  REQUIRE(mem.steps.size() == 2);
  const StepMemory& s0 = mem.steps[0];
  CHECK(s0.start_bytes == 2000);
  CHECK(s0.peak_bytes == 2000 + 300 + 500 + 200);
  CHECK(s0.peak_ns == 150);
  CHECK(s0.peak_op == "fc");
  CHECK(s0.peak_op_step == 0);
  CHECK(s0.allocated_bytes == 300 + 500 + 64 + 200 + 100);
  CHECK(s0.freed_bytes == 64 + 500);
  CHECK(s0.by_role[kParameter] == 1000);
  CHECK(s0.by_role[kMomentum] == 1000);
  CHECK(s0.by_role[kActivation] == 800);
  CHECK(s0.by_role[kGradient] == 200);
  CHECK(s0.by_role[kWorkspace] == 0);  // allocated and freed before the peak
  CHECK(sum_roles(s0) == s0.peak_bytes);
  CHECK(sum_holders(s0) == s0.peak_bytes);
  REQUIRE(s0.holders.size() == 5);
  CHECK(s0.holders[0].bytes == 1000);
  CHECK(s0.holders[2].name == "layer1.0.conv1");
  CHECK(s0.holders[2].bytes == 500);

  // Step 1 allocates nothing: its peak is what it started with, and the op at it is from step 0.
  const StepMemory& s1 = mem.steps[1];
  CHECK(s1.start_bytes == 2000 + 300 + 200 + 100);
  CHECK(s1.peak_bytes == s1.start_bytes);
  CHECK(s1.peak_ns == 300);
  CHECK(s1.peak_op == "layer1.0.conv1");
  CHECK(s1.peak_op_step == 0);
  CHECK(s1.allocations == 0);
  CHECK(sum_roles(s1) == s1.peak_bytes);
  CHECK(sum_holders(s1) == s1.peak_bytes);
  CHECK(mem.peak_index == 0);

  // The curve of step 0: its start level, then one point per event, held to the step's end.
  const auto curve = wb::analysis::memory_curve(b.run, 0, 0);
  REQUIRE(curve.size() == 2 + 7);
  CHECK(curve.front() == std::pair<std::int64_t, std::int64_t>{100, 2000});
  CHECK(curve[3].second == 2000 + 300 + 500 + 64);
  CHECK(curve[4].second == 2000 + 300 + 500);
  CHECK(curve.back() == std::pair<std::int64_t, std::int64_t>{200, 2600});
}

TEST_CASE("memory live before the first event (an imported trace) is listed, so the breakdown sums to the peak", "[memory]") {
  MemoryBuilder b;
  b.live = 5000;  // the trace's "Total Allocated" counts what the process held before
  b.step(0, 0, 100);
  b.event(10, 700, kOther, "aten::empty");
  b.event(20, -200, kOther, "aten::empty");
  const MemoryAnalysis mem = analyze_memory(b.run);
  REQUIRE(mem.steps.size() == 1);
  const StepMemory& m = mem.steps[0];
  CHECK(m.peak_bytes == 5700);
  CHECK(sum_roles(m) == 5700);
  CHECK(sum_holders(m) == 5700);
  REQUIRE(m.holders.size() == 2);
  CHECK(m.holders[0].name == "(before the recording)");
  CHECK(m.holders[0].bytes == 5000);
}

namespace {

constexpr int kBatch = 8, kSize = 32, kClasses = 10, kSteps = 3;

// ResNet-50's tensors from its layer shapes, counted here independently of the trainer.
struct Expected {
  std::int64_t params = 0;       // trainable floats
  std::int64_t bn_channels = 0;  // running mean and var: 2 floats each
  std::int64_t conv_out = 0;     // floats of every convolution's output, summed
  std::int64_t max_conv_w = 0;   // floats of the largest convolution's weights
  std::int64_t max_conv_out = 0; // floats of the largest convolution's output
  std::int64_t ds_out = 0;       // floats of the downsample convolutions' outputs, summed
};

Expected resnet50(int batch, int size, int classes) {
  Expected e;
  int s = (size + 2 * 3 - 7) / 2 + 1;  // conv1: 7x7 stride 2 pad 3
  auto conv = [&](int in, int out, int k, int spatial) {
    const std::int64_t w = static_cast<std::int64_t>(in) * out * k * k;
    const std::int64_t y = static_cast<std::int64_t>(batch) * out * spatial * spatial;
    e.params += w;
    e.conv_out += y;
    e.max_conv_w = std::max(e.max_conv_w, w);
    e.max_conv_out = std::max(e.max_conv_out, y);
  };
  auto bn = [&](int c) {
    e.params += 2 * c;
    e.bn_channels += c;
  };
  conv(3, 64, 7, s);
  bn(64);
  s = (s + 2 - 3) / 2 + 1;  // maxpool 3x3 stride 2 pad 1
  int in = 64;
  const int blocks[4] = {3, 4, 6, 3}, widths[4] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    for (int b = 0; b < blocks[l]; ++b) {
      const int w = widths[l], stride = (l > 0 && b == 0) ? 2 : 1;
      const int out_s = (s + 2 - 3) / stride + 1;
      conv(in, w, 1, s);
      bn(w);
      conv(w, w, 3, out_s);
      bn(w);
      conv(w, 4 * w, 1, out_s);
      bn(4 * w);
      if (b == 0) {
        conv(in, 4 * w, 1, out_s);
        e.ds_out += static_cast<std::int64_t>(batch) * 4 * w * out_s * out_s;
        bn(4 * w);
      }
      in = 4 * w;
      s = out_s;
    }
  }
  e.params += static_cast<std::int64_t>(in) * classes + classes;
  return e;
}

// The CPU backend's bookkeeping per allocation: rounding to 64 bytes, 64 bytes of slack, a 64-byte canary.
constexpr std::int64_t kPerAllocation = 64 + 64 + 64;

class MemoryRuns {
 public:
  static MemoryRuns& get() {
    static MemoryRuns r;
    return r;
  }
  const fs::path& with_memory() { return make("memory", {}); }
  const fs::path& without_memory() { return make("no-memory", {"--no-memory-profile"}); }

 private:
  const fs::path& make(const std::string& name, const std::vector<std::string>& extra) {
    auto it = runs_.find(name);
    if (it != runs_.end()) return it->second;
    std::vector<std::string> args = {"--data", "synthetic", "--synthetic-samples", "64", "--batch-size", std::to_string(kBatch),
                                     "--image-size", std::to_string(kSize), "--num-classes", std::to_string(kClasses),
                                     "--steps", std::to_string(kSteps), "--threads", "1", "--data-workers", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    const fs::path run = dir_ / (name + ".sqlite");
    args.push_back("--run");
    args.push_back(run.string());
    Result r = wb::test::run_train(args);
    INFO("wb-train exited " << r.exit_code << "\n" << r.out << "\n" << r.err);
    REQUIRE(r.exit_code == 0);
    return runs_.emplace(name, run).first->second;
  }
  TempDir dir_;
  std::map<std::string, fs::path> runs_;
};

Result wb_cli(const std::vector<std::string>& args) {
  std::string cmd = wb::test::shell_quote(WB_CLI);
  for (const auto& a : args) {
    cmd += ' ';
    cmd += wb::test::shell_quote(a);
  }
  return wb::test::run_command(cmd);
}

}  // namespace

TEST_CASE("a real run's memory by role matches ResNet-50's tensor sizes counted from its layer shapes", "[memory][run]") {
  const fs::path& path = MemoryRuns::get().with_memory();
  const RunData run = wb::analysis::load_run(path);
  const MemoryAnalysis mem = analyze_memory(run);
  REQUIRE(mem.recorded);
  REQUIRE(mem.steps.size() == static_cast<std::size_t>(kSteps));
  const Expected e = resnet50(kBatch, kSize, kClasses);
  CHECK(e.params == 23528522);  // torchvision's resnet50(num_classes=10)
  const StepMemory& s0 = mem.steps[0];

  // Parameters with the running statistics, momentum, the batch: exact up to each allocation's guards.
  const std::int64_t params = 4 * e.params + 4 * 2 * e.bn_channels;
  CHECK(s0.by_role[kParameter] >= params);
  CHECK(s0.by_role[kParameter] <= params + 2 * kPerAllocation);
  CHECK(s0.by_role[kMomentum] >= 4 * e.params);
  CHECK(s0.by_role[kMomentum] <= 4 * e.params + kPerAllocation);
  const std::int64_t batch = 4 * kBatch * 3 * kSize * kSize + 4 * kBatch;
  CHECK(s0.by_role[kData] >= batch);
  CHECK(s0.by_role[kData] <= batch + 2 * kPerAllocation);
  // The peak comes as backward starts, before it frees anything of note. Every convolution's output is
  // kept then for its batch norm's backward; the outputs of the batch norms that feed a convolution
  // (each block's first two, the stem's) and each block's sum are kept for the next layer's backward:
  // the sizes of every convolution's output but the downsamples' again. The sums' summands (the third
  // and the downsample batch norms' outputs) were freed in forward. The stem's maxpool and the batch
  // norms' saved statistics add less than half as much again.
  const std::int64_t conv_out = 4 * e.conv_out, kept = 2 * conv_out - 4 * e.ds_out;
  CAPTURE(s0.by_role[kGradient] - 4 * e.params, s0.by_role[kWorkspace], s0.by_role[kActivation], conv_out, kept,
          e.max_conv_w, e.max_conv_out);
  CHECK(s0.by_role[kActivation] >= kept - 4 * 2 * e.max_conv_out);  // backward may have freed a layer
  CHECK(s0.by_role[kActivation] <= 3 * kept / 2);
  CHECK(s0.by_role[kGradient] >= 4 * e.params);
  CHECK(s0.by_role[kGradient] <= 4 * e.params + 8 * 4 * e.max_conv_out);
  CHECK(s0.by_role[kGradient] - 4 * e.params < conv_out / 4);
  // Workspace, pooled across layers: the largest convolution's weights converted to the primitives'
  // layouts (a forward copy, a backward-data copy, a blocked weight gradient), the scratchpad (at most
  // two weight copies per thread, and one thread here) and layout conversions of the largest activations.
  // Independent of the depth: under half of one copy of all the weights (one per layer was 2.5 copies).
  CHECK(s0.by_role[kWorkspace] <= 4 * (5 * e.max_conv_w + 4 * e.max_conv_out));
  CHECK(s0.by_role[kWorkspace] < 4 * e.params / 2);
  CHECK(s0.by_role[kOther] == 0);

  // The breakdowns sum to the peak, which is the most the run recorded as live.
  std::int64_t max_live = 0, sum_bytes = 0;
  for (const auto& ev : run.memory) {
    max_live = std::max(max_live, ev.live_bytes);
    sum_bytes += ev.bytes;
  }
  for (const StepMemory& m : mem.steps) {
    CAPTURE(m.step);
    CHECK(sum_roles(m) == m.peak_bytes);
    CHECK(sum_holders(m) == m.peak_bytes);
  }
  CHECK(mem.peak()->peak_bytes == max_live);
  // Backward frees each activation and activation gradient once consumed, and the next step allocates
  // them again: every step after the first allocates and frees the same bytes, and reaches the same
  // peak (step 0's is within 1% of it: its first allocations come in another order), above what is
  // live at the end.
  CHECK(sum_bytes < max_live);
  for (std::size_t i = 1; i < mem.steps.size(); ++i) {
    CAPTURE(i);
    CHECK(mem.steps[i].allocations > 0);
    CHECK(mem.steps[i].allocated_bytes == mem.steps[i].freed_bytes);
    CHECK(mem.steps[i].peak_bytes == mem.steps[1].peak_bytes);
    CHECK(std::abs(mem.steps[i].peak_bytes - s0.peak_bytes) <= s0.peak_bytes / 100);
  }
  // Holders: the model-level buffers and the modules, with the roles they allocate.
  std::map<std::string, wb::analysis::MemoryHolder> holders;
  for (const auto& h : s0.holders) holders[h.name] = h;
  REQUIRE(holders.count("parameters"));
  REQUIRE(holders.count("momentum"));
  REQUIRE(holders.count("gradients"));
  REQUIRE(holders.count("batch"));
  REQUIRE(holders.count("layer1.0.conv1"));
  CHECK(holders["layer1.0.conv1"].by_role[kActivation] >= 4 * kBatch * 64 * 8 * 8);
  REQUIRE(holders.count(s0.peak_op));
  CHECK(holders[s0.peak_op].by_role[kGradient] > 0);  // the peak comes in backward, at a gradient
  REQUIRE(holders.count("fc"));
  CHECK(holders["fc"].by_role[kActivation] >= 4 * kBatch * kClasses);
  CHECK(holders["gradients"].by_role[kGradient] >= 4 * e.params);
}

TEST_CASE("wb report gives the peak memory and its top holders; --no-memory-profile records none", "[memory][run]") {
  const fs::path& path = MemoryRuns::get().with_memory();
  Result r = wb_cli({"report", path.string(), "--no-split"});
  REQUIRE(r.exit_code == 0);
  const RunData run = wb::analysis::load_run(path);
  const MemoryAnalysis mem = analyze_memory(run);
  REQUIRE(mem.peak());
  CHECK_THAT(r.out, Catch::Contains("Memory (backend allocations"));
  CHECK_THAT(r.out, Catch::Contains(wb::analysis::concat("peak ", wb::analysis::format_bytes(static_cast<double>(mem.peak()->peak_bytes)),
                                                         " (", std::to_string(mem.peak()->peak_bytes), " B)")));
  CHECK_THAT(r.out, Catch::Contains("top holders at the peak"));
  CHECK_THAT(r.out, Catch::Contains(mem.peak()->holders.front().name));

  const fs::path& off = MemoryRuns::get().without_memory();
  wb::store::Db db(off, wb::store::OpenMode::read_only);
  CHECK(db.query_int64("SELECT count(*) FROM memory") == 0);
  CHECK(db.query_int64("SELECT count(*) FROM step") == kSteps);
  Result r2 = wb_cli({"report", off.string(), "--no-split"});
  REQUIRE(r2.exit_code == 0);
  CHECK_THAT(r2.out, !Catch::Contains("Memory (backend allocations"));
}
