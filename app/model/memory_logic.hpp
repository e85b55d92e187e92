// The Memory view's arithmetic, free of ImGui: which step it opens on, the holders it lists (the
// largest, the rest folded into one row so the bars still sum to the peak) and the curve of one step.
#pragma once

#include <cstddef>
#include <vector>

#include "profiler/analysis/memory.hpp"

namespace wb::app_model {

// The ranks with memory steps, ascending.
std::vector<int> memory_ranks(const analysis::MemoryAnalysis& mem);
// Indices into mem.steps of `rank`'s steps, in step order.
std::vector<std::size_t> memory_steps_of(const analysis::MemoryAnalysis& mem, int rank);
// The index into mem.steps of `rank`'s step with the largest peak (the first such step); -1 when none.
int peak_step_index(const analysis::MemoryAnalysis& mem, int rank);
// The first `n` holders of `m` (largest first) and, when more remain, one more named "(K others)" with
// their bytes summed, so the result sums to m.peak_bytes.
std::vector<analysis::MemoryHolder> top_holders(const analysis::StepMemory& m, std::size_t n);

}  // namespace wb::app_model
