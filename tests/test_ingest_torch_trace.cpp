// wb import torch-trace: Kineto-format traces (written from the documented format by
// tests/fixtures/make_kineto_trace.py, which also writes what they hold) and a real trace of Debian's
// PyTorch 1.13 (the legacy exporter, made here by compare/reference/torch_profile.py) read into run
// files: events per category, kernels linked to their ops, steps, ranks, and every layer's time, kernels
// and kernel time as the trace laid them out; bad input is one line and exit 2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "ingest/layer_map.hpp"
#include "ingest/torch_trace.hpp"
#include "profiler/analysis/layer_diff.hpp"
#include "profiler/analysis/memory.hpp"
#include "profiler/analysis/run_data.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/files.hpp"
#include "support/process.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"
#include "support/peers.hpp"

namespace fs = std::filesystem;
using namespace wb;
using Catch::Contains;
using wb::test::shell_quote;

namespace {

const fs::path kWb = fs::path(WB_BINARY_DIR) / "bin" / "wb";
const fs::path kFixture = fs::path(WB_SOURCE_DIR) / "tests" / "fixtures" / "make_kineto_trace.py";
const fs::path kTorchProfile = fs::path(WB_SOURCE_DIR) / "compare" / "reference" / "torch_profile.py";

void make_kineto(const fs::path& dir, const std::string& flags) {
  auto r = wb::test::run_python(shell_quote(kFixture.string()) + " " + shell_quote(dir.string()) + " " + flags);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

nlohmann::json truth_of(const fs::path& file) { return nlohmann::json::parse(wb::test::read_text(file)); }

// Every (layer, direction) the generator laid out against what wb diff's per-layer times read back:
// time per step, kernels and kernel time per step.
void check_layers(const analysis::RunData& run, int rank, const nlohmann::json& truth) {
  analysis::LayerOptions o;
  o.rank = rank;
  o.skip_steps = 0;
  analysis::RunLayers got = analysis::layer_times(run, o);
  std::map<std::string, analysis::LayerTime> by_key;
  for (const auto& l : got.layers) by_key[l.name + "/" + std::string(store::category_name(l.direction))] = l;
  const auto& layers = truth["layers"];
  REQUIRE(layers.size() == 254);  // 161 - 1 (the relus share a name) ... every layer forward and backward, loss, optimizer
  const double steps = truth["steps"].get<double>();
  for (const auto& [key, v] : layers.items()) {
    CAPTURE(key);
    REQUIRE(by_key.count(key) == 1);
    const auto& l = by_key[key];
    double ns = 0, kernels = 0, kernel_ns = 0;
    for (int s = 0; s < static_cast<int>(steps); ++s) {
      ns += v["ns"][static_cast<std::size_t>(s)].get<double>();
      kernels += v["kernels"][static_cast<std::size_t>(s)].get<double>();
      kernel_ns += v["kernel_ns"][static_cast<std::size_t>(s)].get<double>();
    }
    // the generator rounds each timestamp and duration to 1 ns on its own: a few ns per range
    CHECK_THAT(l.ns, Catch::WithinAbs(ns / steps, 4.0 * l.calls + 1.0));
    CHECK(l.kernels == kernels / steps);
    CHECK_THAT(l.kernel_ns, Catch::WithinAbs(kernel_ns / steps, 1.0));
  }
}

}  // namespace

TEST_CASE("Kineto traces of two ranks: categories, linked kernels, steps, ranks and every layer", "[ingest]") {
  wb::test::TempDir dir;
  make_kineto(dir.path(), "--ranks 2 --steps 2");
  const fs::path out = dir / "run.sqlite";
  // given in the wrong order: the ranks come from distributedInfo
  auto result = ingest::import_torch_traces({dir / "rank-1.pt.trace.json", dir / "rank-0.pt.trace.json"}, out);
  REQUIRE(result.traces.size() == 2);
  REQUIRE(result.world_size == 2);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& t = result.traces[static_cast<std::size_t>(rank)];
    CHECK(t.rank == rank);
    CHECK(t.file.filename() == "rank-" + std::to_string(rank) + ".pt.trace.json");
    CHECK(t.format == ingest::TraceFormat::kineto);
    CHECK(t.device == "cuda:0");
    CHECK(t.steps == 2);
    auto truth = truth_of(dir / ("rank-" + std::to_string(rank) + ".truth.json"));
    for (int c = 0; c < ingest::kEventCats; ++c) {
      std::string cat(ingest::event_cat_name(static_cast<ingest::EventCat>(c)));
      if (cat == "other" || cat.front() == '(') continue;
      CAPTURE(cat);
      CHECK(t.events_by_cat[c] == truth["events_by_cat"].value(cat, 0));
    }
    CHECK(t.kernels == truth["events_by_cat"]["kernel"].get<int>());
    CHECK(t.memcpys == 2);
    CHECK(t.memsets == 2);
    // every device row links to the op enclosing its runtime call, the optimizer's foreach kernels too
    // (launched without an External id)
    CHECK(truth["linked_by_external_id"].get<int>() + 6 == t.kernels + t.memcpys + t.memsets);
    CHECK(t.linked_to_op == t.kernels + t.memcpys + t.memsets);
    CHECK(t.linked_to_runtime == 0);
    CHECK(t.resnet50);
    CHECK(t.layers_mapped);
    CHECK(t.layers.forward_order == 316);
    CHECK(t.layers.forward_unmatched == 0);
    CHECK(t.layers.backward_sequence == 316);
    CHECK(t.layers.backward_unmatched == 0);
  }

  store::Reader reader(out);
  auto meta = reader.meta();
  CHECK(meta["framework"] == "pytorch");
  CHECK(meta["device"] == "cuda:0");
  CHECK(meta["device_name"] == "NVIDIA A100-SXM4-80GB");
  CHECK(meta["world_size"] == "2");
  CHECK(meta["complete"] == "1");
  auto ranks = reader.ranks();
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[1].device == "cuda:0 (NVIDIA A100-SXM4-80GB)");
  auto steps = reader.steps(1);
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].step == 3);  // ProfilerStep#3
  CHECK(steps[1].step == 4);
  auto match = nlohmann::json::parse(meta["layer_match"]);
  CHECK(match["forward"]["layer2.0.conv2"] == "order");
  CHECK(match["backward"]["layer2.0.conv2"] == "sequence");

  analysis::RunData run = analysis::load_run(reader);
  check_layers(run, 0, truth_of(dir / "rank-0.truth.json"));
  check_layers(run, 1, truth_of(dir / "rank-1.truth.json"));
  // the GPU timeline: the compute stream and NCCL's
  std::set<std::string> streams;
  for (const auto& t : run.tracks)
    if (t.kind == store::TrackKind::stream && t.rank == 0) streams.insert(run.name(t.name));
  CHECK(streams == std::set<std::string>{"cuda:0 stream 7", "cuda:0 stream 20"});
}

TEST_CASE("Kineto trace without sequence numbers: backward by reverse order gives the same layers", "[ingest]") {
  wb::test::TempDir dir;
  make_kineto(dir.path(), "--steps 2 --no-sequence");
  auto result = ingest::import_torch_traces({dir / "rank-0.pt.trace.json"}, dir / "run.sqlite");
  const auto& t = result.traces.at(0);
  CHECK(t.layers.backward_sequence == 0);
  CHECK(t.layers.backward_order == 316);
  CHECK(t.layers.backward_unmatched == 0);
  analysis::RunData run = analysis::load_run(dir / "run.sqlite");
  check_layers(run, 0, truth_of(dir / "rank-0.truth.json"));
  store::Reader reader(dir / "run.sqlite");
  auto match = nlohmann::json::parse(reader.meta()["layer_match"]);
  CHECK(match["backward"]["layer4.2.conv3"] == "order");
}

TEST_CASE("a legacy trace of Debian's PyTorch 1.13: layers by module name forward, by order backward", "[ingest]") {
  wb::test::TempDir dir;
  const fs::path trace = dir / "torch.json";
  auto made = wb::test::run_python(shell_quote(kTorchProfile.string()) + " --out-trace " + shell_quote(trace.string()) +
                                   " --steps 1 --warmup 1 --batch-size 2 --image-size 32 --threads 1");
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  // The same trace without the module ranges, as a plain torch.profiler run without hooks writes it.
  const fs::path bare = dir / "bare.json";
  auto stripped = wb::test::run_python(
      "-c " + shell_quote("import json,re,sys; d=json.load(open(sys.argv[1])); "
                          "json.dump([e for e in d if not re.fullmatch(r'[a-z][a-z0-9_]*(\\.[a-z0-9_]+)*', e['name'])], "
                          "open(sys.argv[2], 'w'))") +
      " " + shell_quote(trace.string()) + " " + shell_quote(bare.string()));
  REQUIRE(stripped.exit_code == 0);

  auto named = ingest::import_torch_traces({trace}, dir / "named.sqlite").traces.at(0);
  CHECK(named.format == ingest::TraceFormat::legacy);
  CHECK(named.device == "cpu");
  CHECK(named.steps == 1);
  CHECK(named.events_by_cat[static_cast<int>(ingest::EventCat::none)] == named.ranges);
  CHECK(named.kernels == 0);
  // ResNet-50: 53 convs, 53 BNs, 49 relu calls, 2 pools, 1 fc; each backward node found its layer by type
  CHECK(named.layers.backward_order == 158);
  CHECK(named.layers.backward_unmatched == 0);
  CHECK(named.layers.forward_unmatched == 0);
  auto bare_import = ingest::import_torch_traces({bare}, dir / "bare.sqlite").traces.at(0);
  CHECK(bare_import.layers.forward_module == 0);
  CHECK(bare_import.layers.forward_order == 158);
  CHECK(bare_import.layers.backward_order == 158);

  // Each layer's backward range holds the autograd node of its type, and no other layer's.
  analysis::RunData run = analysis::load_run(dir / "named.sqlite");
  const auto& rows = run.ranges_of(run.main_track(0));
  std::map<std::string, std::multiset<std::string>> nodes_in;
  std::vector<const store::RangeRow*> open;
  for (const auto& r : rows) {
    while (!open.empty() && open.back()->end_ns <= r.start_ns) open.pop_back();
    const std::string& name = run.name(r.name);
    const std::string prefix = "autograd::engine::evaluate_function: ";
    if (name.rfind(prefix, 0) == 0 && !open.empty() && open.back()->category == static_cast<std::uint8_t>(store::Category::backward))
      nodes_in[run.name(open.back()->name)].insert(name.substr(prefix.size()));
    if (r.category == static_cast<std::uint8_t>(store::Category::backward) && analysis::is_layer_name(name) &&
        analysis::op_type_of_layer(name) != analysis::OpType::block)
      open.push_back(&r);
  }
  CHECK(nodes_in["layer2.0.conv2"].count("ConvolutionBackward0") == 1);
  CHECK(nodes_in["layer2.0.bn2"].count("NativeBatchNormBackward0") == 1);
  CHECK(nodes_in["layer2.0.downsample.0"].count("ConvolutionBackward0") == 1);
  CHECK(nodes_in["fc"].count("AddmmBackward0") == 1);
  CHECK(nodes_in["avgpool"].count("MeanBackward1") == 1);
  CHECK(nodes_in["maxpool"].count("MaxPool2DWithIndicesBackward0") == 1);
  CHECK(nodes_in["layer3.1.relu"].count("ReluBackward0") == 3);  // the block's relu runs three times
  CHECK(nodes_in["layer3.1.relu"].count("AddBackward0") == 1);   // the residual add, as in wb-train
  for (const auto& [layer, nodes] : nodes_in) {
    CAPTURE(layer);
    auto type = analysis::op_type_of_layer(layer);
    for (const auto& n : nodes) {
      CAPTURE(n);
      if (n.find("Convolution") != std::string::npos) CHECK(type == analysis::OpType::conv);
      if (n.find("BatchNorm") != std::string::npos) CHECK(type == analysis::OpType::bn);
    }
  }

  // Forward by order lands on the same layers as the module names: every order-found range lies inside
  // the module range of the same name.
  analysis::RunData bare_run = analysis::load_run(dir / "bare.sqlite");
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> module_ranges;
  for (const auto& r : rows)
    if (r.category == 0 && analysis::is_layer_name(run.name(r.name))) module_ranges[run.name(r.name)].push_back({r.start_ns, r.end_ns});
  int checked = 0;
  for (const auto& r : bare_run.ranges_of(bare_run.main_track(0))) {
    const std::string& name = bare_run.name(r.name);
    if (r.category != 0 || !analysis::is_layer_name(name) || analysis::op_type_of_layer(name) == analysis::OpType::block) continue;
    CAPTURE(name, r.start_ns);
    const auto& spans = module_ranges[name];
    CHECK(std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return s.first <= r.start_ns && r.end_ns <= s.second; }));
    ++checked;
  }
  CHECK(checked == 158);

  // Memory: torch_profile.py added a [memory] event per op from the legacy profiler's per-op memory,
  // counted from what the step held before its first op: ResNet-50's 23,528,522 parameters (10
  // classes), their gradients from the warm-up step and momentum, the buffers and the batch of 2.
  CHECK(named.memory_events > 100);
  REQUIRE(run.memory.size() == static_cast<std::size_t>(named.memory_events));
  const std::int64_t weights = 3 * 4 * std::int64_t{23528522};
  const std::int64_t held = run.memory.front().live_bytes - run.memory.front().bytes;
  CHECK(held >= weights + 4 * 2 * 3 * 32 * 32);
  CHECK(held <= weights + (std::int64_t{1} << 20));  // buffers: 2 x 26,560 floats of statistics, 53 counters
  const analysis::MemoryAnalysis mem = analysis::analyze_memory(run);
  REQUIRE(mem.steps.size() == 1);
  const analysis::StepMemory& m = mem.steps.front();
  std::int64_t max_live = 0;
  for (const auto& e : run.memory) max_live = std::max(max_live, e.live_bytes);
  CHECK(m.peak_bytes == max_live);
  CHECK(m.peak_bytes > held);
  std::set<std::string> holders;
  std::int64_t sum = 0;
  for (const auto& h : m.holders) {
    holders.insert(h.name);
    sum += h.bytes;
  }
  CHECK(sum == m.peak_bytes);
  CHECK(holders.count("(before the recording)") == 1);
  CHECK(holders.count("layer4.0.conv2") == 1);  // its weight's gradient (9 MiB) is allocated in its backward
}

TEST_CASE("a GPU trace's memory: the device's [memory] events and max_memory_allocated, compared by wb diff", "[ingest]") {
  wb::test::TempDir dir;
  const fs::path trace = dir / "gpu.json";
  // One step: a conv on the host launching a kernel; memory on the GPU (Device Type 1) and on the host
  // (0, not this run's device); torch.cuda.max_memory_allocated as torch_profile.py adds it.
  wb::test::write_text(trace, R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 1000, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::zeros", "pid": 1, "tid": 1, "ts": 1002, "dur": 4, "args": {"External id": 2}},
    {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1003,
     "args": {"Total Allocated": 2000, "Bytes": 2000, "Addr": 3, "Device Type": 1, "Device Id": 0}},
    {"ph": "X", "cat": "user_annotation", "name": "conv1", "pid": 1, "tid": 1, "ts": 1010, "dur": 30},
    {"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 1011, "dur": 20, "args": {"External id": 3}},
    {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1012,
     "args": {"Total Reserved": 4194304, "Total Allocated": 3000, "Bytes": 1000, "Addr": 1, "Device Type": 1, "Device Id": 0}},
    {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1013,
     "args": {"Total Allocated": 500, "Bytes": 500, "Addr": 2, "Device Type": 0, "Device Id": -1}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 1050, "dur": 10, "args": {"External id": 4}},
    {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1055,
     "args": {"Total Allocated": 2600, "Bytes": -400, "Addr": 1, "Device Type": 1, "Device Id": 0}},
    {"ph": "X", "cat": "kernel", "name": "conv_kernel", "pid": 0, "tid": 7, "ts": 1020, "dur": 5,
     "args": {"device": 0, "stream": 7, "correlation": 9, "External id": 3}},
    {"name": "wb_memory", "ph": "M", "pid": 0, "tid": 0, "args": {"max_memory_allocated": 123456789}}
  ]})");
  // a one-layer trace is no ResNet-50: its layer ranges are asked for
  ingest::ImportOptions options;
  options.layers = ingest::LayerMapping::resnet50;
  auto t = ingest::import_torch_traces({trace}, dir / "gpu.sqlite", options).traces.at(0);
  CHECK_FALSE(t.resnet50);
  CHECK(t.layers_mapped);
  CHECK(t.device == "cuda:0");
  CHECK(t.memory_events == 3);
  analysis::RunData run = analysis::load_run(dir / "gpu.sqlite");
  REQUIRE(run.memory.size() == 3);
  CHECK(run.name(run.memory[0].name) == "aten::zeros");  // no layer around it: the op
  CHECK(run.memory[1].bytes == 1000);
  CHECK(run.memory[1].live_bytes == 3000);
  CHECK(run.memory[1].step == 4);
  CHECK(run.name(run.memory[1].name) == "conv1");  // the layer it happened in
  CHECK(run.name(run.memory[2].name) == "loss");   // the ops after the last layer are the loss's (layer_map.hpp)
  CHECK(run.memory[2].bytes == -400);
  CHECK(run.meta.at("max_memory_allocated") == "123456789");
  const auto mem = analysis::analyze_memory(run);
  REQUIRE(mem.steps.size() == 1);
  CHECK(mem.steps[0].peak_bytes == 3000);
  CHECK(mem.steps[0].peak_op == "conv1");
  // wb diff prefers the allocator's own high-water mark when the trace has it.
  analysis::LayerOptions o;
  o.skip_steps = 0;
  const analysis::RunLayers layers = analysis::layer_times(run, o);
  CHECK(layers.peak_memory == 123456789);
  CHECK(layers.peak_memory_source == "max_memory_allocated");
}

TEST_CASE("wb import, report, export chrome and diff on imported traces", "[ingest]") {
  wb::test::TempDir dir;
  make_kineto(dir.path(), "--steps 2");
  const std::string run = dir.file("run.sqlite");
  auto r = wb::test::run_command(kWb.string() + " import torch-trace " + dir.file("rank-0.pt.trace.json") + " --out " + run);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("Kineto format, rank 0, cuda:0, 2 steps"));
  CHECK_THAT(r.out, Contains("linked: 1110 of 1110 device rows to their launching op, 0 to a runtime call no op encloses, 0 to nothing"));

  // tensorboard_trace_handler's .pt.trace.json.gz reads the same
  auto gz = wb::test::run_python("-c " + shell_quote("import gzip,shutil,sys; shutil.copyfileobj(open(sys.argv[1],'rb'), gzip.open(sys.argv[2],'wb'))") +
                                 " " + dir.file("rank-0.pt.trace.json") + " " + dir.file("rank-0.pt.trace.json.gz"));
  REQUIRE(gz.exit_code == 0);
  auto from_gz = ingest::import_torch_traces({dir / "rank-0.pt.trace.json.gz"}, dir / "gz.sqlite").traces.at(0);
  CHECK(from_gz.kernels == 1106);
  CHECK(from_gz.ranges == 4374);

  auto report = wb::test::run_command(kWb.string() + " report --top 400 " + run);
  INFO(report.output);
  CHECK(report.exit_code == 0);
  CHECK_THAT(report.out, Contains("layer4.2.conv3"));
  CHECK_THAT(report.out, Contains("kernels 1110"));
  auto chrome = wb::test::run_command(kWb.string() + " export chrome " + run + " " + dir.file("trace.json"));
  CHECK(chrome.exit_code == 0);
  auto exported = nlohmann::json::parse(wb::test::read_text(dir / "trace.json"));
  CHECK(exported.dump().find("sm80_xmma_wgrad_implicit_gemm_f32f32") != std::string::npos);

  // A second import as B, slowed down: the diff sees every layer at ratio 1 against itself
  auto diff = wb::test::run_command(kWb.string() + " diff " + run + " " + run + " --skip 0 --json " + dir.file("d.json") +
                                    " --csv " + dir.file("d.csv"));
  INFO(diff.output);
  REQUIRE(diff.exit_code == 0);
  CHECK_THAT(diff.out, Contains("Top 10 layers by time lost"));
  CHECK_THAT(diff.out, Contains("A kernel"));
  auto j = nlohmann::json::parse(wb::test::read_text(dir / "d.json"));
  int rows = 0;
  for (const auto& l : j["layers"]) {
    if (l["a"].is_null() || l["b"].is_null()) continue;
    CHECK(l["ratio"].get<double>() == 1.0);
    ++rows;
  }
  CHECK(rows == 254 + 32);  // and the 16 blocks, forward and backward
  auto csv = wb::test::read_text(dir / "d.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == rows + 1);
}

TEST_CASE("bad traces: one line naming the file and what was expected, exit 2", "[ingest]") {
  wb::test::TempDir dir;
  make_kineto(dir.path(), "--steps 1");
  const std::string good = wb::test::read_text(dir / "rank-0.pt.trace.json");
  struct Case {
    const char* name;
    std::string text;
    const char* expect;
  };
  const Case cases[] = {
      {"not-json.json", "this is not JSON\n", "not valid JSON at byte 0 (line 1): expected '[' or '{'"},
      {"object.json", R"({"schemaVersion": 1, "events": []})", "JSON, but not a torch.profiler trace: the object has no \"traceEvents\" list"},
      {"numbers.json", "[1, 2, 3]", "JSON, but not a torch.profiler trace: expected a list of event objects"},
      {"no-name.json", R"([{"ts": 1, "dur": 2}])", "its first event has no \"name\" and \"ph\""},
      {"empty.json", "[]", "the trace holds no events"},
      {"truncated.json", good.substr(0, good.size() / 2), "truncated JSON: the file ends at byte"},
      {"trailing.json", good + "]", "expected the end of the file after the trace"},
      {"empty-file.json", "", "empty file"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const fs::path file = dir / c.name;
    wb::test::write_text(file, c.text);
    REQUIRE_THROWS_AS(ingest::import_torch_traces({file}, dir / "x.sqlite"), ingest::TraceError);
    auto r = wb::test::run_command(kWb.string() + " import torch-trace " + file.string() + " --out " + dir.file("x.sqlite"));
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains(file.string() + ": "));
    CHECK_THAT(r.err, Contains(c.expect));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(!fs::exists(dir / "x.sqlite"));
  }
  // a missing file, an existing output, usage errors
  auto missing = wb::test::run_command(kWb.string() + " import torch-trace " + dir.file("nope.json") + " --out " + dir.file("x.sqlite"));
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.err, Contains("nope.json: cannot open"));
  wb::test::write_text(dir / "exists.sqlite", "keep me");
  auto exists = wb::test::run_command(kWb.string() + " import torch-trace " + dir.file("rank-0.pt.trace.json") + " --out " +
                                      dir.file("exists.sqlite"));
  CHECK(exists.exit_code == 2);
  CHECK_THAT(exists.err, Contains("exists.sqlite: exists (pass --overwrite to replace it)"));
  CHECK(wb::test::read_text(dir / "exists.sqlite") == "keep me");
  auto no_out = wb::test::run_command(kWb.string() + " import torch-trace " + dir.file("rank-0.pt.trace.json"));
  CHECK(no_out.exit_code == 2);
  CHECK_THAT(no_out.err, Contains("--out RUN.sqlite is required"));
  auto format = wb::test::run_command(kWb.string() + " import nsys-trace x --out y");
  CHECK(format.exit_code == 2);
  CHECK_THAT(format.err, Contains("unknown format 'nsys-trace' (expected: torch-trace)"));
}

TEST_CASE("a write that fails half way (a file size limit) is one error, exit 2, and leaves no file", "[ingest]") {
  wb::test::TempDir dir;
  make_kineto(dir.path(), "--steps 4");
  const fs::path trace = dir / "rank-0.pt.trace.json";
  const std::string import = kWb.string() + " import torch-trace " + trace.string() + " --out ";
  auto r = wb::test::run_command(import + dir.file("full.sqlite"));
  REQUIRE(r.exit_code == 0);
  const auto full = fs::file_size(dir / "full.sqlite");
  fs::remove(dir / "full.sqlite");
  // A limit of half the file in 1 KiB blocks (a quarter where the shell counts 512-byte ones).
  r = wb::test::run_command("ulimit -f " + std::to_string(full / 2048) + "; " + import + dir.file("x.sqlite") +
                            " --quiet");
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("wb import: " + dir.file("x.sqlite")));
  CHECK_THAT(r.err, Contains("failed"));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  for (const auto& e : fs::directory_iterator(dir.path()))  // no run file, scratch file or kernels' file
    CHECK(e.path().filename().string().find("x.sqlite") == std::string::npos);
}

TEST_CASE("the scanner: escapes, nested args, numbers to exact nanoseconds", "[ingest]") {
  auto t = ingest::parse_trace(
      R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\"b\u00e9\n", "pid": 1, "tid": 2,)"
      R"( "ts": 1700000000123456.789, "dur": 1.5e1, "args": {"External id": 7, "Input Dims": [[1, 2], []], "x": {"y": [true, null]}}}],)"
      R"( "distributedInfo": {"rank": 1, "world_size": 4}})",
      "inline");
  REQUIRE(t.events.size() == 1);
  CHECK(t.strings[t.events[0].name] == "a\"b\xc3\xa9\n");
  CHECK(t.events[0].ts_ns == 1700000000123456789LL);  // beyond a double's exact range
  CHECK(t.events[0].dur_ns == 15000);
  CHECK(t.events[0].external_id == 7);
  CHECK(t.distributed_info["world_size"] == 4);
}

TEST_CASE("torch_step.py --profile: the run's config profiled, imported with every layer", "[ingest]") {
  wb::test::TempDir dir;
  const fs::path run = dir / "run.sqlite";
  {
    store::WriterOptions o;
    o.path = run;
    o.handle_signals = false;
    store::Writer w(o);
    w.set_meta("config_json", R"({"batch_size": 2, "image_size": 32, "num_classes": 10, "lr": 0.1, "momentum": 0.9,)"
                              R"( "weight_decay": 0.0001, "label_smoothing": 0.1, "loss_convention": "mindspore", "threads": 1})");
    w.finish();
  }
  const fs::path torch_step = fs::path(WB_SOURCE_DIR) / "compare" / "reference" / "torch_step.py";
  const fs::path trace = dir / "t.json";
  auto r = wb::test::run_python(shell_quote(torch_step.string()) + " " + shell_quote(run.string()) + " --profile 1 --out-trace " +
                                shell_quote(trace.string()));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("batch 2, 32x32, 10 classes, device cpu, 1 threads"));
  auto t = ingest::import_torch_traces({trace}, dir / "torch.sqlite").traces.at(0);
  CHECK(t.steps == 1);
  CHECK(t.layers.forward_module > 158);  // every module call, blocks included
  CHECK(t.layers.backward_order == 158);
  CHECK(t.layers.backward_unmatched == 0);
  // the mindspore loss convention's ops (log_softmax, mul, sum, neg, mean) and their autograd nodes are the loss's
  CHECK(t.layers.backward_loss == 5);

  auto usage = wb::test::run_python(shell_quote(torch_step.string()) + " " + shell_quote(run.string()) + " --profile 2");
  CHECK(usage.exit_code == 2);
  CHECK_THAT(usage.output, Contains("--profile N needs N >= 1 and --out-trace TRACE.json"));
}

TEST_CASE("the parsed events' blocks: order across a block's end, and consumed once", "[ingest]") {
  // Events across a block boundary keep their order, by index, for_each and consume; consume empties it.
  ingest::EventList list;
  const std::size_t n = ingest::EventList::kBlock + 1000;
  for (std::size_t i = 0; i < n; ++i) {
    ingest::TraceEvent e;
    e.ts_ns = static_cast<std::int64_t>(i) * 3;
    e.name = static_cast<std::uint32_t>(i % 7);
    list.push_back(e);
  }
  REQUIRE(list.size() == n);
  CHECK(list[ingest::EventList::kBlock].ts_ns == static_cast<std::int64_t>(ingest::EventList::kBlock) * 3);
  std::size_t seen = 0;
  bool in_order = true;
  list.for_each([&](const ingest::TraceEvent& e) { in_order = in_order && e.ts_ns == static_cast<std::int64_t>(seen++) * 3; });
  CHECK(seen == n);
  CHECK(in_order);
  seen = 0;
  list.consume([&](const ingest::TraceEvent& e) { in_order = in_order && e.ts_ns == static_cast<std::int64_t>(seen++) * 3; });
  CHECK(seen == n);
  CHECK(in_order);
  CHECK(list.empty());
}
