// Holistic Trace Analysis (HTA)'s per-rank analyses, on any run with device rows (imported GPU traces and
// wb-train's CUDA runs alike): the temporal breakdown (idle, compute, non-compute), the kernel breakdown by
// type and overlap, the communication/computation overlap ratio, the idle-time breakdown (host wait,
// kernel wait, other), kernel launch statistics and each stream's queue length. Each rule names the HTA
// function it reproduces (hta/analyzers/, hta/common/types.py); docs/guide/pytorch-traces.md lists them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// hta/utils/utils.py get_kernel_type, by name (the patterns of hta/common/types.py); memcpy and memset rows
// are memory by their kind.
enum class HtaKernelType { computation, communication, memory, other };
HtaKernelType hta_kernel_type(std::string_view name, store::KernelKind kind);

// A stream's queue length (trace_counters.get_queue_length_time_series and get_queue_length_summary): it
// grows at the start of each runtime call that launches work on the stream and shrinks when that work
// starts; summarised, as HTA does (pandas describe()), over the values after each change.
struct HtaQueue {
  std::string track;       // the stream track's name, "cuda:0 stream 7"
  int stream = 0;          // its stream number
  std::int64_t count = 0;  // changes
  double mean = 0.0;
  std::optional<double> std;  // sample standard deviation, none under 2 changes
  std::int64_t min = 0, max = 0;
  double p25 = 0.0, p50 = 0.0, p75 = 0.0;  // linearly interpolated percentiles
};

struct HtaRank {
  int rank = 0;
  // Trace._filter_irrelevant_gpu_kernels: with two steps or more, HTA drops the last one (its kernels may
  // not all be in the trace): only device rows launched before it started count. -1: nothing dropped.
  std::int64_t trim_ns = -1;
  std::int64_t device_rows = 0, device_rows_before_trim = 0;
  // get_temporal_breakdown: over the span from the first device row's start to the last one's end
  std::int64_t span_ns = 0, idle_ns = 0, compute_ns = 0, non_compute_ns = 0;
  // _get_gpu_kernel_type_time: time during which exactly this set of types runs ("computation",
  // "communication", "memory", "computation+communication", ...)
  std::map<std::string, std::int64_t> kernel_breakdown_ns;
  // get_comm_comp_overlap
  std::int64_t comm_ns = 0, overlapped_ns = 0;
  std::optional<double> overlap_ratio;  // overlapped / comm; none without communication
  // get_idle_time_breakdown, summed over streams
  std::int64_t host_wait_ns = 0, kernel_wait_ns = 0, other_wait_ns = 0;
  // cuda_kernel_launch_stats: device rows with their runtime call on record; the launch delay runs from
  // the call's end to the row's start (0 when it started before the call returned)
  std::int64_t launched = 0;
  std::optional<double> launch_delay_mean_ns;
  std::optional<std::int64_t> launch_delay_max_ns;
  std::int64_t runtime_outliers = 0, launch_delay_outliers = 0;
  std::vector<HtaQueue> queues;
};

struct HtaOptions {
  std::int64_t consecutive_kernel_delay_ns = 30'000;  // a gap under this between kernels is kernel wait
  std::int64_t runtime_cutoff_ns = 50'000;        // a runtime call longer than this is an outlier
  std::int64_t launch_delay_cutoff_ns = 100'000;  // a launch delay longer than this is an outlier
};

// One entry per rank that has device rows.
std::vector<HtaRank> hta_analyses(const RunData& run, const HtaOptions& options = {});

}  // namespace wb::analysis
