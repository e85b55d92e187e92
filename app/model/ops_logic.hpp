// The Ops view's "vs second run" columns, free of ImGui: for each op of the first run, the difference
// of its mean and total time against the op of the same name and category in a second run, and the
// ratio of their time per step (layer names match between our runs and imported PyTorch traces).
#pragma once

#include <vector>

#include "profiler/analysis/op_stats.hpp"

namespace wb::app_model {

struct OpDelta {
  bool present = false;     // the second run has this op
  double mean_ns = 0.0;     // this run's mean minus the second run's
  double total_ns = 0.0;    // this run's total minus the second run's
  double mean_ratio = 0.0;  // mean_ns over the second run's mean (0 when that mean is 0)
  // Time per step here over time per step there (0 when unknown): a layer's cost per training step,
  // whatever the runs' lengths and however many calls a layer makes (torchvision's relu: three).
  double per_step_ratio = 0.0;
};

// One entry per op of `ops`, in its order. steps and second_steps: step rows of each run (every
// rank's), for per_step_ratio; 0 leaves it 0.
std::vector<OpDelta> op_deltas(const std::vector<analysis::OpStat>& ops, const std::vector<analysis::OpStat>& second,
                               double steps = 0.0, double second_steps = 0.0);

}  // namespace wb::app_model
