// wb import torch-trace TRACE.json... --out RUN.sqlite: a torch.profiler trace as a run file.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli/cli.hpp"
#include "ingest/torch_trace.hpp"

namespace wb::cli {

namespace {

const char* kUsage =
    "usage: wb import torch-trace TRACE.json[.gz] [TRACE.json ...] --out RUN.sqlite [--layers auto|resnet50|none]\n"
    "                               [--overwrite] [--quiet]\n"
    "Reads the Chrome trace torch.profiler writes (export_chrome_trace, or tensorboard_trace_handler's\n"
    "*.pt.trace.json[.gz]) into a run file that wb report, wb export chrome, wb diff and wb-view read like\n"
    "wb-train's own runs. Both formats: Kineto's (an object with traceEvents, categories, deviceProperties,\n"
    "distributedInfo; PyTorch 2.x) and the legacy exporter's (a bare list of events; PyTorch without Kineto).\n"
    "Several traces are several ranks (rank from distributedInfo, else the order given).\n"
    "  --out RUN.sqlite   the run file to write\n"
    "  --layers WHAT      add wb-train's ResNet-50 layer ranges: auto (default: when the trace is a ResNet-50,\n"
    "                     by its module names or 53 forward convolutions a step), resnet50 (always), none\n"
    "  --overwrite        replace RUN.sqlite when it exists\n"
    "  --quiet            no progress and summary lines\n"
    "What it records: PyTorch's ops and annotations as ranges; ProfilerStep#N as step N; kernels, memcpys and\n"
    "memsets linked to their runtime call (correlation) and to the innermost op enclosing it; on a ResNet-50,\n"
    "layer ranges named like\n"
    "wb-train's (\"layer2.0.conv2\" forward and backward, \"loss\", \"optimizer\"): from record_function module\n"
    "names (torch_step.py --profile), else by execution order and op type; backward through sequence numbers,\n"
    "else by reverse order. meta.layer_match says which method found each layer.";

void print_step_note(const ingest::TraceImport& t) {
  if (t.steps == 0)
    std::printf("  note: no ProfilerStep#N ranges, so no steps: wb diff compares steps (profile with a schedule and "
                "call prof.step() once per step)\n");
}

void print_summary(const ingest::ImportResult& r) {
  for (const auto& t : r.traces) {
    std::printf("%s: %s format, rank %d, %s, %lld steps\n", t.file.string().c_str(),
                t.format == ingest::TraceFormat::kineto ? "Kineto" : "legacy", t.rank, t.device.c_str(),
                static_cast<long long>(t.steps));
    std::printf("  events by category:");
    for (int c = 0; c < ingest::kEventCats; ++c)
      if (t.events_by_cat[c] > 0)
        std::printf(" %s %lld", std::string(ingest::event_cat_name(static_cast<ingest::EventCat>(c))).c_str(),
                    static_cast<long long>(t.events_by_cat[c]));
    std::printf("\n  rows: %lld ranges, %lld layer ranges added, %lld kernels, %lld memcpys, %lld memsets\n",
                static_cast<long long>(t.ranges), static_cast<long long>(t.layer_ranges), static_cast<long long>(t.kernels),
                static_cast<long long>(t.memcpys), static_cast<long long>(t.memsets));
    long long device = t.kernels + t.memcpys + t.memsets;
    if (device == 0) {
      // No device activity: say what the trace holds instead, and what follows.
      std::string instead;
      for (const auto& [cat, n] : t.other_categories)
        if (cat != "ac2g" && cat != "fwdbwd" && cat != "Trace" && cat != "cpu_instant_event")
          instead += (instead.empty() ? "" : ", ") + std::to_string(n) + " " + cat +
                     (cat == "cuda_profiler_range" ? " (CUPTI range-profiler counters, not kernel activities)" : "");
      const long long runtime = t.events_by_cat[static_cast<int>(ingest::EventCat::cuda_runtime)];
      if (runtime > 0 || !instead.empty())
        std::printf("  no kernels, memcpys or memsets: the trace has %lld runtime calls%s%s, so no GPU time or GPU "
                    "summary (profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])\n",
                    runtime, instead.empty() ? "" : " and ", instead.empty() ? "" : (instead + " events").c_str());
    }
    if (device > 0) {
      const long long none = device - t.linked_to_op - t.linked_to_runtime;
      std::printf("  linked: %lld of %lld device rows to their launching op, %lld to a runtime call no op encloses, %lld "
                  "to nothing%s\n",
                  static_cast<long long>(t.linked_to_op), device, static_cast<long long>(t.linked_to_runtime), none,
                  none > 0 ? " (no runtime call with their correlation id in the trace)" : "");
    }
    if (!t.layers_mapped) {
      std::printf("  layers: none added: %s\n", t.resnet50 ? "--layers none" :
                  "not a ResNet-50 (no layer module names, not 53 forward convolutions a step); ops stay ops "
                  "(--layers resnet50 maps them anyway)");
      print_step_note(t);
      continue;
    }
    const auto& l = t.layers;
    std::printf("  layers: forward %lld by module name, %lld by order (%lld unmatched); backward %lld by sequence number, "
                "%lld by order, %lld following the node before, %lld of the loss (%lld unmatched)\n",
                static_cast<long long>(l.forward_module), static_cast<long long>(l.forward_order),
                static_cast<long long>(l.forward_unmatched), static_cast<long long>(l.backward_sequence),
                static_cast<long long>(l.backward_order), static_cast<long long>(l.backward_follow),
                static_cast<long long>(l.backward_loss),
                static_cast<long long>(l.backward_unmatched));
    print_step_note(t);
  }
  std::printf("wrote %s (%d rank%s)\n", r.out.string().c_str(), static_cast<int>(r.traces.size()),
              r.traces.size() == 1 ? "" : "s");
}

}  // namespace

int cmd_import(int argc, char** argv) {
  Args args(argc, argv, kUsage, {{"--out", true}, {"--layers", true}, {"--overwrite", false}, {"--quiet", false}});
  const auto& pos = args.positionals(2);
  if (pos[0] != "torch-trace") args.fail("unknown format '" + pos[0] + "' (expected: torch-trace)");
  auto out = args.value("--out");
  if (!out || out->empty()) args.fail("--out RUN.sqlite is required");
  std::vector<std::filesystem::path> traces(pos.begin() + 1, pos.end());
  const bool quiet = args.has("--quiet");
  ingest::ImportOptions o;
  o.overwrite = args.has("--overwrite");
  if (auto layers = args.value("--layers")) {
    if (*layers == "auto") o.layers = ingest::LayerMapping::automatic;
    else if (*layers == "resnet50") o.layers = ingest::LayerMapping::resnet50;
    else if (*layers == "none") o.layers = ingest::LayerMapping::none;
    else args.fail("--layers must be auto, resnet50 or none, not '" + *layers + "'");
  }
  if (!quiet) o.progress = [](std::string_view line) { std::fprintf(stderr, "wb import: %.*s\n", static_cast<int>(line.size()), line.data()); };
  ingest::tune_allocator_for_import();
  // A file size limit (ulimit -f) then fails a write, which is reported in one line with the scratch
  // files removed, instead of ending the process half way with them left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  auto result = ingest::import_torch_traces(traces, *out, o);
  if (!quiet) print_summary(result);
  return 0;
}

}  // namespace wb::cli
