// Per-layer time of a run, and the difference between two runs layer by layer (wb diff): ours against
// an imported PyTorch trace (wb import torch-trace), or any two runs.
//
// A layer is a range named like a ResNet module ("layer2.0.conv2", "downsample.0", "fc"; blocks
// "layer2.0") in the forward or backward category, or the loss and optimizer ranges. wb-train records them under those names; an
// imported trace has them added by the importer (ingest/layer_map.hpp), which says in meta.layer_match
// how it found each one. Times are means per step over the steps compared.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// The op types per-type totals are reported by.
enum class OpType : std::uint8_t { conv, bn, relu, pool, fc, loss, optimizer, block, other };
const char* op_type_name(OpType t);
// The type of a layer by its name ("layer1.0.downsample.0" conv, "layer1.0" block, "loss", ...).
OpType op_type_of_layer(const std::string& name);
// True for module paths ("layer2.0.conv2"): lower-case start, identifiers and indices joined by dots.
bool is_layer_name(std::string_view name);

struct LayerTime {
  std::string name;
  store::Category direction = store::Category::forward;  // forward, backward; loss and optimizer as such
  OpType type = OpType::other;
  double ns = 0.0;             // mean time per step
  double calls = 0.0;          // ranges per step
  double kernels = 0.0;        // device activities launched inside it, per step
  double kernel_ns = 0.0;      // their device time per step
  std::int64_t first_ns = 0;   // offset of its first range from its step's start (for ordering)
  std::string method;          // how the layer was found: "name" (wb-train), "module", "order", "sequence"
};

struct StepSplit {
  double step_ns = 0.0;  // means per step
  double compute_ns = 0.0;
  double data_wait_ns = 0.0;
  double comm_exposed_ns = 0.0;
  double other_ns = 0.0;
};

struct RunLayers {
  std::string framework;  // meta.framework, "wb" when absent
  std::string device;
  int rank = 0;
  std::vector<int> steps;  // the steps measured
  bool gpu = false;        // the run has device activity
  std::vector<LayerTime> layers;  // forward (execution order), loss, backward, optimizer
  std::map<OpType, double> type_ns;  // per step, leaf layers only; OpType::other = the step's rest
  StepSplit split;
  // The largest memory peak of the measured steps (memory.hpp), or the allocator's own high-water
  // mark when the run recorded one (meta.max_memory_allocated: torch.cuda.max_memory_allocated over
  // the profiled steps); 0 when the run has neither.
  std::int64_t peak_memory = 0;
  std::string peak_memory_source;  // "memory events", "max_memory_allocated"
  std::string peak_memory_op;      // the op at the peak (memory events only)
};

struct LayerOptions {
  int rank = 0;
  // Steps left out at the start (the first step allocates and tunes); -1: 1 when the run has 3 or
  // more steps, else 0.
  int skip_steps = -1;
};

// Throws AnalysisError when the rank has no steps, or no layer ranges.
RunLayers layer_times(const RunData& run, const LayerOptions& options = {});

struct LayerDiffRow {
  std::string name;
  store::Category direction = store::Category::forward;
  OpType type = OpType::other;
  std::optional<LayerTime> a, b;  // absent where the run has no such layer
  double a_ns() const { return a ? a->ns : 0.0; }
  double b_ns() const { return b ? b->ns : 0.0; }
  double lost_ns() const { return a_ns() - b_ns(); }  // > 0: A is slower
  double ratio() const;                                // A / B, NaN when either is absent or B is 0
};

struct LayerDiff {
  RunLayers a, b;
  std::vector<LayerDiffRow> rows;          // forward, loss, backward, optimizer; each in A's order
  std::vector<std::size_t> top_lost;       // indices of rows: leaf layers by time lost, most first (up to 10)
};

LayerDiff diff_layers(const RunLayers& a, const RunLayers& b, std::size_t top = 10);

nlohmann::json to_json(const LayerDiff& d);
// One row per layer: name, direction, type, A, B, ratio, lost, kernels (CSV with a header line).
std::string to_csv(const LayerDiff& d);
// The text report: step split, per-type totals, the top layers by time lost, then every layer
// (`all_rows` false: leaf layers only).
std::string to_text(const LayerDiff& d, bool all_rows);

}  // namespace wb::analysis
