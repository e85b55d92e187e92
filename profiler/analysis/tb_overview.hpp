// The TensorBoard profiler plugin's Overview, rule for rule (kineto's tb_plugin/torch_tb_profiler/profiler/,
// removed from kineto in 2026; docs/guide/torch-traces.md lists each rule with its source): per step, eight
// exclusive classes that add up to the step, with device-side step bounds; the GPU summary (utilization,
// estimated SM efficiency and achieved occupancy, Tensor Core share); and the plugin's recommendations.
// The same code runs on imported traces and on wb-train's own runs.
//
// Where the plugin's rule gives nonsense on the Kineto traces of the last years, we deviate, and say so
// (docs/guide/torch-traces.md, "Deviations"): NCCL kernels are communication by name (the plugin matches
// an External id those traces never share), any nccl:/gloo: op is a host collective, cuda_driver calls are
// runtime calls, and gpu_user_annotation spans are not CPU work.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// The plugin's ProfileRole, in its priority order: a moment of a step belongs to the first class active
// then; Other is what none covers.
enum class StepClass : int { kernel, memcpy, memset, communication, runtime, dataloader, cpu_exec, other };
inline constexpr int kStepClasses = 8;
// "kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other" (JSON keys)
const char* step_class_key(StepClass c);
// "Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec", "Other"
const char* step_class_label(StepClass c);

using ClassTimes = std::array<std::int64_t, kStepClasses>;

struct OverviewStep {
  int step = 0;
  std::int64_t start_ns = 0;  // after the device-side adjustment
  std::int64_t end_ns = 0;
  std::int64_t host_start_ns = 0;  // the ProfilerStep range as recorded
  std::int64_t host_end_ns = 0;
  ClassTimes class_ns{};           // sums to end_ns - start_ns
};

// The plugin's GPU summary for one device; a metric the trace has no data for is nullopt.
struct GpuSummary {
  int device = 0;
  double utilization = 0.0;                     // kernel busy time / steps' span
  std::optional<double> sm_efficiency;          // sum over time of min(sum of blocks per SM, 1) / span
  std::optional<double> achieved_occupancy;     // duration-weighted mean, 0..1
  std::optional<double> tensor_core_share;      // kernel time on Tensor Cores / linked kernel time
};

struct RankOverview {
  int rank = 0;
  bool steps_from_trace = true;     // false: no steps on record, one step spans the host ops
  std::vector<OverviewStep> steps;  // after the plugin's tail-step removal
  int removed_tail_steps = 0;
  std::array<double, kStepClasses> mean_ns{};
  double mean_step_ns = 0.0;
  std::optional<GpuSummary> gpu;    // none when the rank ran no kernels
  double amp_eligible_ns = 0.0;     // kernel time launched by Tensor-Core-eligible ops (for "amp")
};

struct Recommendation {
  std::string id;    // "dataloader", "communication", "gpu_utilization", "amp"
  std::string text;  // the plugin's advice, with the figure
};

// On several ranks, per step number all ranks share: the rank whose step (device-side bounds) ended last,
// and how much later than the first rank's.
struct LateRank {
  int step = 0;
  int rank = 0;
  std::int64_t lag_ns = 0;
};

struct Overview {
  std::vector<RankOverview> ranks;
  std::vector<Recommendation> recommendations;
  std::vector<LateRank> late;
};

// The plugin's Tensor Core kernel-name patterns (tensor_core.py's TC_Allowlist).
bool uses_tensor_cores(std::string_view kernel_name);
// Ops whose kernels could use Tensor Cores (TC_OP_Allowlist).
bool tensor_core_eligible_op(std::string_view op_name);

Overview tb_overview(const RunData& run);

}  // namespace wb::analysis
