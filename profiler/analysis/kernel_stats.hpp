// GPU time per host op: every kernel, memcpy and memset CUPTI recorded carries the correlation id of the
// host range that launched it (the innermost one open at launch), so device time is attributed to op
// names ("layer1.0.conv1" forward, the same name in backward) and summed next to the host time of those
// ranges. Also the kernels by name, like Nsight Systems' cuda_gpu_kern_sum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct KernelOpStat {
  std::string op;  // the launching range's name
  store::Category category = store::Category::forward;
  std::int64_t ranges = 0;     // host ranges of this op that launched device work
  std::int64_t host_ns = 0;    // their total host duration
  std::int64_t launches = 0;   // device activities (kernels, copies, memsets) they launched
  std::int64_t device_ns = 0;  // total device time of those activities
};

struct KernelNameStat {
  std::string name;
  store::KernelKind kind = store::KernelKind::kernel;
  std::int64_t count = 0;
  std::int64_t total_ns = 0;
  std::int64_t max_ns = 0;
  std::int64_t bytes = 0;  // copies and memsets
};

struct KernelStats {
  std::vector<KernelOpStat> by_op;        // by device time, descending
  std::vector<KernelNameStat> by_kernel;  // by total time, descending
  std::int64_t activities = 0;            // device activity rows
  std::int64_t linked = 0;                // of which attributed to a host range
  std::int64_t device_ns = 0;             // total device time
  std::int64_t unlinked_ns = 0;           // device time with no launching range on record
};

// Over every stream track of the run (merged runs: every rank; ids are unique per rank after merge).
KernelStats kernel_stats(const RunData& run);

// Host and device time per op name, as TensorBoard's Operator view gives them: device self is the time of
// the device rows an op's ranges launched themselves, device total adds those of the ranges nested in
// them; host self subtracts the nested ranges' time from the host total. Python-function tracks are left
// out. By device self time, then device total, descending.
struct OpDeviceStat {
  std::string name;
  std::int64_t calls = 0;
  std::int64_t device_self_ns = 0;
  std::int64_t device_total_ns = 0;
  std::int64_t host_self_ns = 0;
  std::int64_t host_total_ns = 0;
};
std::vector<OpDeviceStat> op_device_stats(const RunData& run);

}  // namespace wb::analysis
