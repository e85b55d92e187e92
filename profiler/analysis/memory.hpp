// Memory per step from the run file's memory table (every allocation and free, with the rank's live
// bytes after it): per rank and step the peak, the op at the peak, and what is alive at the peak by
// role (activation, gradient, parameter, momentum, workspace, data, other) and by holder (the module
// that allocated it, or a model-level buffer: "parameters", "gradients", "momentum", "batch").
//
// Each rank's events are replayed from its first one, so a step that allocates nothing (the CPU
// backend keeps its tensors from one step to the next) still shows everything held, and who holds it.
// Memory a trace recorded as live before its first event (an imported PyTorch trace starts mid-run)
// has no holder: it is listed as "(before the recording)", so the breakdowns always sum to the peak.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct MemoryHolder {
  std::string name;  // a module ("layer2.0.conv2"), a buffer ("parameters") or another tool's op
  std::int64_t bytes = 0;
  std::array<std::int64_t, store::kMemoryRoles> by_role{};  // of bytes, by role code
};

struct StepMemory {
  int rank = 0;
  int step = 0;
  std::int64_t start_ns = 0, end_ns = 0;  // the step's window
  std::int64_t start_bytes = 0;           // live when the step began
  std::int64_t peak_bytes = 0;            // the most live during the step (start_bytes when it never rose)
  std::int64_t peak_ns = 0;               // when it was first reached (the step's start when it never rose)
  // The op at the peak: the module whose allocation reached it, or, when the step allocated nothing
  // above its start, the last allocation before (peak_op_step says from which step; -1 = model build).
  std::string peak_op;
  int peak_op_step = -1;
  int peak_role = store::kMemoryRoles - 1;  // the role of that allocation
  std::int64_t allocated_bytes = 0, freed_bytes = 0;  // within the step
  std::int64_t allocations = 0, frees = 0;
  std::array<std::int64_t, store::kMemoryRoles> by_role{};  // alive at the peak; sums to peak_bytes
  std::vector<MemoryHolder> holders;                       // alive at the peak, largest first; sums to peak_bytes
};

struct MemoryAnalysis {
  bool recorded = false;          // the run has memory events
  std::vector<StepMemory> steps;  // by rank, then step
  // The step with the largest peak over every rank and step (index into steps; -1 when none).
  int peak_index = -1;
  const StepMemory* peak() const { return peak_index < 0 ? nullptr : &steps[static_cast<std::size_t>(peak_index)]; }
};

MemoryAnalysis analyze_memory(const RunData& run);

// Live bytes on `rank` from the start of `step` to its end: (t_ns, bytes) points, the first the level
// at the step's start, then one per event. Empty when the rank has no such step.
std::vector<std::pair<std::int64_t, std::int64_t>> memory_curve(const RunData& run, int rank, int step);

// "1.50 GiB", "12.3 MiB", "512 KiB", "100 B"
std::string format_bytes(double bytes);

// The report's Memory section: per rank the largest peak with its op, role breakdown and top holders,
// and the peak of every step when they differ. Nothing when the run has no memory events.
void write_memory_section(const RunData& run, std::ostream& out, std::size_t top_holders = 10);

}  // namespace wb::analysis
