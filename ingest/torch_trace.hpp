// `wb import torch-trace`: a torch.profiler trace (Kineto's or the legacy exporter's) into a run file of
// the same schema as wb-train's, so that wb report, wb export chrome, wb diff and every view of wb-view
// read it as they read our own runs.
//
// What goes where:
//  - cpu_op / user_annotation / python_function / cuda_runtime events (and the legacy exporter's
//    uncategorised ones) become `range` rows on one thread track per (pid, tid), nested by time;
//  - ProfilerStep#N ranges become `step` rows (step N) and every range in them gets step N;
//  - python_function events (with_stack) go on a track of their own per thread, "<thread> (python)";
//  - kernel / gpu_memcpy / gpu_memset events become `kernel` rows on one stream track per (device,
//    stream), with Kineto's blocks per SM and est. achieved occupancy, linked to their runtime call by
//    "correlation" and through it to the innermost op enclosing the call (the op holds the corr_id);
//    "External id" (either case) only where the trace has no runtime calls;
//  - on a ResNet-50 (or with LayerMapping::resnet50), layer ranges named like wb-train's modules
//    ("layer2.0.conv2", forward and backward, "loss", "optimizer") are added around PyTorch's ops, see
//    layer_map.hpp, so a layer's time compares with ours by name; meta.layer_match says how each layer
//    was found;
//  - "[memory]" instants (profile_memory=True) of the run's device become `memory` rows, named after
//    the layer (else the op) they happened in; torch.cuda.max_memory_allocated, when the trace carries
//    it (a "wb_memory" metadata event, torch_step.py --profile), becomes meta.max_memory_allocated.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ingest/trace_json.hpp"

namespace wb::ingest {

// How layer ranges were found (layer_map.hpp).
struct LayerMatchCounts {
  std::int64_t forward_module = 0;     // forward layer ranges named by record_function / module annotations
  std::int64_t forward_order = 0;      // ... by execution order and op type
  std::int64_t forward_unmatched = 0;  // typed forward units no layer of ResNet-50 took
  std::int64_t backward_sequence = 0;  // backward nodes attributed through sequence numbers
  std::int64_t backward_order = 0;     // ... by reverse execution order and op type
  std::int64_t backward_follow = 0;    // untyped nodes (AccumulateGrad, views) given the layer before them
  std::int64_t backward_loss = 0;      // nodes of the loss (before a step's first layer node)
  std::int64_t backward_unmatched = 0;
};

struct TraceImport {
  std::filesystem::path file;
  TraceFormat format = TraceFormat::legacy;
  int rank = 0;
  std::string device;                     // "cpu", "cuda:0"
  std::int64_t events_by_cat[kEventCats] = {};
  std::int64_t ranges = 0;                // range rows written (PyTorch's ops and annotations)
  std::int64_t layer_ranges = 0;          // layer ranges added (layer_map.hpp)
  std::int64_t kernels = 0, memcpys = 0, memsets = 0;
  std::int64_t linked_to_op = 0;       // device rows linked to their launching op
  std::int64_t linked_to_runtime = 0;  // ... to their runtime call only (no op encloses it)
  bool resnet50 = false;               // the trace looks like a ResNet-50 (looks_like_resnet50)
  bool layers_mapped = false;          // layer ranges were added (layer_map.hpp)
  std::int64_t steps = 0;
  std::int64_t memory_events = 0;         // memory rows written (the run's device only)
  std::map<std::string, std::int64_t> other_categories;  // ParsedTrace::other_categories
  LayerMatchCounts layers;
};

struct ImportResult {
  std::filesystem::path out;
  int world_size = 1;
  std::vector<TraceImport> traces;  // one per input trace, in rank order
};

// Whether to add wb-train's ResNet-50 layer ranges (layer_map.hpp): when the trace is a ResNet-50
// (module names, or 53 forward convolutions a step), always, or never.
enum class LayerMapping { automatic, resnet50, none };

struct ImportOptions {
  bool overwrite = false;
  LayerMapping layers = LayerMapping::automatic;
  std::function<void(std::string_view)> progress;  // one line per phase, for long imports
};

// Imports one trace per rank (rank from distributedInfo, else the order given) into `out`. Throws
// TraceError for bad traces, store::StoreError for an output that exists (unless overwrite) or cannot
// be written.
ImportResult import_torch_traces(const std::vector<std::filesystem::path>& traces, const std::filesystem::path& out,
                                 const ImportOptions& options = {});

// Tunes glibc's allocator for an import, for the rest of the process: blocks up to 16 MiB come from the
// heap and freed memory stays there for the next phase, instead of mapping and unmapping each vector
// (each fresh page is a page fault: a quarter of an import's time before this). Call it once, before
// importing, from a program that does little else.
void tune_allocator_for_import();

}  // namespace wb::ingest
