// Imported GPU traces as the TensorBoard plugin and HTA read them: device rows linked through their
// runtime call to the op around it, forward ops kept forward, layer ranges only on a ResNet-50, and the
// plugin's Overview (tb_overview.hpp) checked against hand-computed figures and against an independent
// oracle (tests/oracles/tb_overview.py, written from the plugin's published rules, importing nothing of
// ours) on fixtures with the cases that matter; each of three planted rule errors makes the oracle fail.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "ingest/torch_trace.hpp"
#include "profiler/analysis/kernel_stats.hpp"
#include "profiler/analysis/run_data.hpp"
#include "profiler/analysis/tb_overview.hpp"
#include "store/db.hpp"
#include "store/reader.hpp"
#include "support/files.hpp"
#include "support/process.hpp"
#include "support/python.hpp"
#include "support/peers.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using Catch::Contains;
using wb::test::shell_quote;

namespace {

const fs::path kWb = fs::path(WB_BINARY_DIR) / "bin" / "wb";
const fs::path kFixtures = fs::path(WB_SOURCE_DIR) / "tests" / "fixtures" / "torch-traces";
const fs::path kOracle = fs::path(WB_SOURCE_DIR) / "tests" / "oracles" / "tb_overview.py";
const fs::path kHtaOracle = fs::path(WB_SOURCE_DIR) / "tests" / "oracles" / "hta.py";
constexpr std::int64_t kUs = 1000;

analysis::RunData import_one(const fs::path& trace, const fs::path& out) {
  ingest::import_torch_traces({trace}, out);
  return analysis::load_run(out);
}

std::int64_t cls(const analysis::OverviewStep& s, analysis::StepClass c) { return s.class_ns[static_cast<std::size_t>(c)]; }

// `wb report RUN --json` for the traces imported together, checked by the oracle; its exit code and output.
wb::test::ProcessResult check_with_oracle(const wb::test::TempDir& dir, const std::vector<fs::path>& traces,
                                           const std::string& plant = "", const fs::path& oracle = kOracle) {
  const std::string run = dir.file("run-" + std::to_string(traces.size()) + traces.front().stem().string() + ".sqlite");
  std::string files;
  for (const auto& t : traces) {
    files += ' ';
    files += shell_quote(t.string());
  }
  auto r = wb::test::run_command(kWb.string() + " import torch-trace" + files + " --out " + run + " --overwrite --quiet");
  REQUIRE(r.exit_code == 0);
  const std::string json = run + ".json";
  r = wb::test::run_command(kWb.string() + " report " + run + " --json > " + json);
  REQUIRE(r.exit_code == 0);
  return wb::test::run_python(shell_quote(oracle.string()) + (plant.empty() ? "" : " --plant " + plant) + " --check " +
                              json + files);
}

}  // namespace

TEST_CASE("device rows link through their runtime call to the op around it, not by an External id shared by chance",
          "[ingest]") {
  wb::test::TempDir dir;
  // As Kineto writes it since 2022: the kernel's External id repeats its correlation, and an unrelated op
  // happens to have that number as its own External id. The op with Fwd thread id 0 is a forward op.
  const fs::path trace = dir / "gpu.json";
  wb::test::write_text(trace, R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 1000, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 1010, "dur": 40,
     "args": {"External id": 5, "Fwd thread id": 0, "Sequence number": 3}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::cudnn_convolution", "pid": 1, "tid": 1, "ts": 1012, "dur": 30,
     "args": {"External id": 6, "Fwd thread id": 0, "Sequence number": 4}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1015, "dur": 5,
     "args": {"External id": 900, "correlation": 900}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1060, "dur": 10, "args": {"External id": 900}},
    {"ph": "X", "cat": "kernel", "name": "sm80_xmma_fprop_implicit_gemm", "pid": 0, "tid": 7, "ts": 1030, "dur": 50,
     "args": {"device": 0, "stream": 7, "correlation": 900, "External id": 900, "blocks per SM": 0.5,
              "est. achieved occupancy %": 40}},
    {"ph": "X", "cat": "kernel", "name": "early_kernel", "pid": 0, "tid": 7, "ts": 990, "dur": 5,
     "args": {"device": 0, "stream": 7, "correlation": 17, "external id": 17}}
  ]})");
  const auto t = ingest::import_torch_traces({trace}, dir / "gpu.sqlite").traces.at(0);
  CHECK(t.linked_to_op == 1);
  CHECK(t.linked_to_runtime == 0);
  CHECK_FALSE(t.resnet50);
  CHECK_FALSE(t.layers_mapped);
  const analysis::RunData run = analysis::load_run(dir / "gpu.sqlite");
  const auto ops = analysis::op_device_stats(run);
  auto find = [&](const std::string& name) {
    for (const auto& s : ops)
      if (s.name == name) return s;
    FAIL("no op " << name);
    return analysis::OpDeviceStat{};
  };
  CHECK(find("aten::cudnn_convolution").device_self_ns == 50 * kUs);  // the innermost op around the launch
  CHECK(find("aten::conv2d").device_self_ns == 0);
  CHECK(find("aten::conv2d").device_total_ns == 50 * kUs);
  CHECK(find("aten::add").device_total_ns == 0);  // its External id is the kernel's by chance only
  CHECK(find("cudaLaunchKernel").device_total_ns == 0);
  CHECK(find("aten::conv2d").host_self_ns == 10 * kUs);
  for (const auto& [track, rows] : run.ranges)
    for (const auto& r : rows)
      if (run.name(r.name) == "aten::conv2d") CHECK(r.category == static_cast<std::uint8_t>(store::Category::forward));
  bool found = false;
  for (const auto& [track, rows] : run.kernels)
    for (const auto& k : rows)
      if (run.name(k.name) == "sm80_xmma_fprop_implicit_gemm") {
        found = true;
        CHECK(k.blocks_per_sm == Approx(0.5));
        CHECK(k.occupancy == Approx(0.4));
      }
  CHECK(found);
}

TEST_CASE("without runtime calls a device row links by its External id, spelled either way", "[ingest]") {
  wb::test::TempDir dir;
  const fs::path trace = dir / "old.json";
  wb::test::write_text(trace, R"({"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 20, "args": {"External id": 3}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20, "dur": 30,
     "args": {"device": 0, "stream": 7, "correlation": 41, "external id": 3}}
  ]})");
  const auto t = ingest::import_torch_traces({trace}, dir / "old.sqlite").traces.at(0);
  CHECK(t.linked_to_op == 1);
}

TEST_CASE("the TensorBoard Overview of the fixtures, figures worked out by hand", "[ingest]") {
  using analysis::StepClass;
  wb::test::TempDir dir;
  SECTION("overlap: DataLoader takes what kernels, copies and runtime calls leave") {
    const auto o = analysis::tb_overview(import_one(kFixtures / "overlap.json", dir / "overlap.sqlite"));
    REQUIRE(o.ranks.size() == 1);
    const auto& r = o.ranks[0];
    REQUIRE(r.steps.size() == 2);
    const auto& s = r.steps[0];
    CHECK(s.step == 1);
    CHECK(s.end_ns - s.start_ns == 100 * kUs);
    CHECK(cls(s, StepClass::kernel) == 43 * kUs);
    CHECK(cls(s, StepClass::runtime) == 8 * kUs);
    CHECK(cls(s, StepClass::dataloader) == 9 * kUs);
    CHECK(cls(s, StepClass::cpu_exec) == 10 * kUs);
    CHECK(cls(s, StepClass::other) == 30 * kUs);
    CHECK(cls(r.steps[1], StepClass::memcpy) == 6 * kUs);
    REQUIRE(r.gpu);
    CHECK(r.gpu->utilization == Approx(0.365));
    CHECK(*r.gpu->sm_efficiency == Approx(0.32));
    CHECK(*r.gpu->achieved_occupancy == Approx(2725.0 / 73.0 / 100.0));
    CHECK(*r.gpu->tensor_core_share == 0.0);
    std::vector<std::string> ids;
    for (const auto& rec : o.recommendations) ids.push_back(rec.id);
    CHECK(ids == std::vector<std::string>{"dataloader", "gpu_utilization", "amp"});
  }
  SECTION("outlive: a kernel that outlives its step moves the step's end; the short last step is left out") {
    const auto o = analysis::tb_overview(import_one(kFixtures / "outlive.json", dir / "outlive.sqlite"));
    const auto& r = o.ranks.at(0);
    REQUIRE(r.steps.size() == 2);
    CHECK(r.removed_tail_steps == 1);
    CHECK(r.steps[0].end_ns - r.steps[0].start_ns == 140 * kUs);
    CHECK(r.steps[1].start_ns == r.steps[0].end_ns);
    CHECK(cls(r.steps[0], StepClass::kernel) == 110 * kUs);
    REQUIRE(r.gpu);
    CHECK(*r.gpu->sm_efficiency == Approx(0.4775));  // blocks per SM summing to 1.4 count as 1
    CHECK(*r.gpu->tensor_core_share == Approx(110.0 / 185.0));
    CHECK(o.recommendations.empty());
  }
  SECTION("memory: a device's peak allocation over 90% of its memory; the CPU's is left out") {
    const auto o = analysis::tb_overview(import_one(kFixtures / "memory_full.json", dir / "memory.sqlite"));
    std::vector<std::string> ids;
    for (const auto& rec : o.recommendations) ids.push_back(rec.id);
    REQUIRE(ids == std::vector<std::string>{"memory"});
    CHECK_THAT(o.recommendations[0].text, Contains("95.0% of 79.3 GB"));
  }
  SECTION("NCCL kernels are communication; no ProfilerStep makes one step of the ops") {
    const auto o = analysis::tb_overview(import_one(kFixtures / "nccl_two_streams.json", dir / "nccl.sqlite"));
    CHECK(cls(o.ranks.at(0).steps.at(0), StepClass::communication) == 20 * kUs);
    const auto n = analysis::tb_overview(import_one(kFixtures / "no_steps.json", dir / "no_steps.sqlite"));
    REQUIRE(n.ranks.at(0).steps.size() == 1);
    CHECK_FALSE(n.ranks[0].steps_from_trace);
  }
}

TEST_CASE("wb report --json agrees with the independent oracle; each planted rule error fails it", "[ingest]") {
  wb::test::TempDir dir;
  const std::vector<std::vector<fs::path>> cases = {
      {kFixtures / "overlap.json"},
      {kFixtures / "outlive.json"},
      {kFixtures / "memory_full.json"},
      {kFixtures / "nccl_two_streams.json"},
      {kFixtures / "no_steps.json"},
      {kFixtures / "hta_streams.json"},
      {kFixtures / "two_ranks" / "rank1.json", kFixtures / "two_ranks" / "rank0.json"}};
  for (const auto& traces : cases) {
    CAPTURE(traces.front().string());
    const auto r = check_with_oracle(dir, traces);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Contains("0 disagreement(s): OK"));
  }
  for (const std::string plant : {"dataloader_first", "host_step_end", "sm_eff_no_min"}) {
    CAPTURE(plant);
    int failed = 0;
    for (const auto& traces : cases) failed += check_with_oracle(dir, traces, plant).exit_code == 1;
    CHECK(failed >= 1);
  }
}

TEST_CASE("HTA's analyses in wb report --json agree with the independent oracle; each planted error fails it",
          "[ingest]") {
  wb::test::TempDir dir;
  const std::vector<std::vector<fs::path>> cases = {
      {kFixtures / "hta_streams.json"},
      {kFixtures / "overlap.json"},
      {kFixtures / "outlive.json"},
      {kFixtures / "nccl_two_streams.json"},
      {kFixtures / "no_steps.json"},
      {kFixtures / "two_ranks" / "rank0.json", kFixtures / "two_ranks" / "rank1.json"}};
  for (const auto& traces : cases) {
    CAPTURE(traces.front().string());
    const auto r = check_with_oracle(dir, traces, "", kHtaOracle);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Contains("0 disagreement(s): OK"));
  }
  for (const std::string plant : {"overlap_over_compute", "idle_first_gap"}) {
    CAPTURE(plant);
    int failed = 0;
    for (const auto& traces : cases) failed += check_with_oracle(dir, traces, plant, kHtaOracle).exit_code == 1;
    CHECK(failed >= 1);
  }
}

TEST_CASE("the oracles' own tests pass", "[ingest]") {
  for (const char* test : {"test_tb_overview_oracle.py", "test_hta_oracle.py"}) {
    const auto r = wb::test::run_python(shell_quote((fs::path(WB_SOURCE_DIR) / "tests" / "oracles" / test).string()));
    INFO(test << "\n" << r.output);
    CHECK(r.exit_code == 0);
  }
}

TEST_CASE("a trace that is no ResNet-50 gets no layer ranges unless asked", "[ingest]") {
  wb::test::TempDir dir;
  auto r = wb::test::run_command(kWb.string() + " import torch-trace " + shell_quote((kFixtures / "overlap.json").string()) +
                                 " --out " + dir.file("a.sqlite"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("layers: none added: not a ResNet-50"));
  r = wb::test::run_command(kWb.string() + " import torch-trace " + shell_quote((kFixtures / "overlap.json").string()) +
                            " --out " + dir.file("b.sqlite") + " --layers resnet5");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("--layers must be auto, resnet50 or none, not 'resnet5'"));
}

TEST_CASE("a stream's launch queue comes from its kernels, not from stored rows; a file that stores it keeps them",
          "[ingest]") {
  wb::test::TempDir dir;
  const fs::path run = dir / "overlap.sqlite";
  ingest::import_torch_traces({kFixtures / "overlap.json"}, run);
  std::uint32_t queue = 0;
  {
    store::Reader reader(run);
    for (const auto& t : reader.tracks())
      if (t.kind == store::TrackKind::queue && reader.string_at(t.name) == "cuda:0 stream 7 launch queue") queue = t.id;
    REQUIRE(queue != 0);
    // Worked out by hand (tests/oracles/test_hta_oracle.py): stream 7's four runtime calls at 6, 45, 104
    // and 132 us launch rows starting at 10, 55, 109 and 140 us; the trace's time base is its first event.
    const std::vector<store::CounterRow> want = {
        {queue, 6 * kUs, 1},   {queue, 10 * kUs, 0},  {queue, 45 * kUs, 1},  {queue, 55 * kUs, 0},
        {queue, 104 * kUs, 1}, {queue, 109 * kUs, 0}, {queue, 132 * kUs, 1}, {queue, 140 * kUs, 0}};
    CHECK(reader.counters(queue) == want);
    // The viewer, wb report and wb export read them through the run's data.
    const auto loaded = analysis::load_run(run);
    REQUIRE(loaded.counters.count(queue) == 1);
    CHECK(loaded.counters.at(queue) == want);
  }
  {
    store::Db db = store::open_run(run, store::OpenMode::read_only);
    CHECK(db.query_int64("SELECT count(*) FROM counter") == 0);
  }
  // A file imported when the samples were stored: those are what it shows.
  {
    store::Db db = store::open_run(run, store::OpenMode::read_write);
    db.exec("INSERT INTO counter(track_id, t_ns, value) VALUES (" + std::to_string(queue) + ", 5, 2), (" +
            std::to_string(queue) + ", 7, 3)");
  }
  store::Reader reader(run);
  CHECK(reader.counters(queue) == std::vector<store::CounterRow>{{queue, 5, 2}, {queue, 7, 3}});
}
