// Per-layer time of the open run against a second run (typically an imported PyTorch trace: wb import
// torch-trace), for the views: the Ops view's layer rows, the Precision view's time next to each
// tensor's verdict, and the Timeline's colouring by time ratio. The arithmetic is wb diff's
// (analysis::layer_times, diff_layers); this adds the lookups the views make.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "profiler/analysis/layer_diff.hpp"

namespace wb::app_model {

struct LayerTiming {
  analysis::LayerDiff diff;
  std::map<std::pair<std::string, store::Category>, std::size_t> index;  // into diff.rows

  const analysis::LayerDiffRow* find(const std::string& layer, store::Category direction) const;
  // The layer time a dumped tensor belongs to, by its key: act.<module> the module's forward (a block's
  // act.<block>.relu.2: its relu range), grad.<module>.<param> its backward, loss the loss; nullptr for
  // the rest (params, buffers, ...).
  const analysis::LayerDiffRow* for_tensor(const std::string& key) const;
};

// Throws analysis::AnalysisError when a run has no steps or no layer ranges (the message names it).
LayerTiming layer_timing(const analysis::RunData& a, const analysis::RunData& b);

// Where a time ratio A/B sits on a green (A at least twice as fast) .. red (A at least twice as slow)
// scale: 0.5 + log2(ratio) / 2, clamped to [0, 1]; 0.5 for equal times and for a missing ratio.
double ratio_heat(double ratio);

}  // namespace wb::app_model
