// Split-point editing for the allreduce tuner, free of ImGui. A split is MindSpore's
// all_reduce_fusion_config: ascending indices in [1, P-1] into the forward-ordered parameters. The
// tuner's strip shows parameters in backward order (the last parameter, whose gradient is ready first,
// on the left), one column each, so split s sits between the columns of parameters s and s-1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "store/rows.hpp"

namespace wb::app_model {

// Adds s when 1 <= s <= params-1 and not already present; keeps the split ascending.
// Returns whether the split changed.
bool add_split(std::vector<int>& split, int s, int params);
// Removes the split point at position `which` (an index into split); false when out of range.
bool remove_split(std::vector<int>& split, std::size_t which);
// Moves split point `which` to s, clamped between its neighbours (so no two points meet and the
// order holds); returns the value it took.
int move_split(std::vector<int>& split, std::size_t which, int s, int params);

// Strip geometry: params columns of equal width over [x0, x0 + width], backward order.
double split_x(int s, int params, double x0, double width);
// The split point nearest to x (rounded to the closest column boundary), in [1, params-1].
int split_at_x(double x, int params, double x0, double width);
// The forward index of the parameter drawn in the column under x, or -1 outside the strip.
int param_at_x(double x, int params, double x0, double width);
// The split point (position in split) whose boundary is within tolerance_px of x, nearest first.
std::optional<std::size_t> split_near_x(const std::vector<int>& split, double x, int params, double x0,
                                        double width, double tolerance_px);

// "--allreduce-split 85,160"; an empty split is the single bucket, "--allreduce-split none".
std::string split_flags(const std::vector<int>& split);

// The median of the values other than -1 (a failed trial); -1 when none is left. Of an even count, the
// mean of the middle two.
std::int64_t trial_median(std::vector<std::int64_t> v);

// wb tune-split's measured trials (the split_trial table) per candidate, in the order they first ran.
struct TrialSummary {
  std::string candidate;  // "current", "DDP-style 10 MB buckets", "try 1", ...
  std::string split;      // as --allreduce-split takes it
  std::int64_t predicted_ns = -1;
  std::vector<std::int64_t> rounds;  // the median step of each round's trial; -1 for a failed one
  std::int64_t median_ns = -1;       // over the rounds that ran; -1 when none did
  double vs_current = 0.0;           // median over the current split's median, less 1 (0 when unknown)
};
std::vector<TrialSummary> summarize_trials(const std::vector<store::SplitTrialRow>& trials);

}  // namespace wb::app_model
