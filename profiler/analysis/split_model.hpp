// The allreduce split-point model behind the tuner and `wb suggest-split`.
//
// Inputs: per-parameter gradient-ready times (averaged over steps, relative to the start of backward),
// gradient bytes, and an alpha-beta cost per allreduce. A split is MindSpore's all_reduce_fusion_config
// (allreduce::SplitPoints, allreduce/split_points.hpp): ascending indices s1 < s2 < ... < sk into the
// forward-ordered parameter list, making buckets [0,s1), [s1,s2), ..., [sk,P); backward produces the
// last bucket first. The functions here take the points as a plain list and check them with SplitPoints. The model runs buckets on one
// communication stream: each starts at max(its ready time, the previous bucket's end) and lasts
// alpha + beta * bytes. Exposed communication is what runs past the end of backward compute.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "allreduce/split_points.hpp"
#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct SplitModel {
  std::vector<std::string> names;  // forward order
  std::vector<double> ready_ns;    // gradient ready, ns after backward start
  std::vector<double> bytes;        // 0 for a parameter in no bucket
  int unbucketed = 0;               // parameters outside the data-parallel allreduce (--shard-fc's slices)
  double alpha_ns = 0.0;
  double beta_ns_per_byte = 0.0;
  double compute_end_ns = 0.0;      // end of backward compute, ns after backward start
  double measured_step_ns = 0.0;    // mean step time of the run (0 for hand-built models)
  double measured_exposed_ns = 0.0; // mean DDP-exposed communication of the run
  std::vector<int> current_split;   // the run's own split
  int steps_used = 0;
  std::size_t size() const { return ready_ns.size(); }
};

struct BucketPlan {
  int first = 0;  // forward indices [first, last]
  int last = 0;
  double bytes = 0.0;
  double ready_ns = 0.0;
  double start_ns = 0.0;
  double end_ns = 0.0;
};

struct Prediction {
  std::vector<int> split;
  std::vector<BucketPlan> buckets;  // in execution order (last bucket first)
  double comm_end_ns = 0.0;
  double exposed_ns = 0.0;          // max(0, comm_end - compute_end)
  double step_ns = 0.0;             // measured step - measured exposed + predicted exposed
};

// The split as allreduce::SplitPoints; throws AnalysisError (SplitPoints' message) unless it is strictly
// ascending within [1, params-1].
allreduce::SplitPoints validate_split(std::span<const int> split, std::size_t params);
Prediction predict(const SplitModel& model, std::span<const int> split);

// Optimal contiguous buckets by dynamic programming over the backward order k = 1..P:
// F(j) = min over i <= j of max(F(i-1), R(i..j)) + alpha + beta * bytes(i..j), R = latest ready time in
// the bucket. F(P) is the earliest possible end of communication, so it also minimises exposed time.
std::vector<int> optimal_split(const SplitModel& model);
// MG-WFBP's greedy merge (Shi et al., _generate_groups_mgwfbp).
std::vector<int> mgwfbp_split(const SplitModel& model);
// PyTorch DDP's size-capped buckets in reverse order: the first 1 MiB, then 25 MiB each.
std::vector<int> ddp_split(const SplitModel& model, double cap_bytes = 25.0 * 1024 * 1024,
                           double first_cap_bytes = 1024.0 * 1024);
// MindSpore's ResNet-50 model-zoo split [85, 160]; empty when the model has too few parameters.
std::vector<int> mindspore_split(const SplitModel& model);

// Builds the model from a recorded run: ready times from backward ranges named after a parameter's
// module ("layer1.0.conv1" for "layer1.0.conv1.weight") and from each bucket's ready time (its lowest
// index is the last gradient to arrive), interpolated by cumulative bytes in between; alpha and beta
// fitted to the allreduce spans. A parameter recorded in no bucket (bucket -1: a --shard-fc slice, reduced
// by its shard groups) keeps its place in the list with no bytes. Throws AnalysisError when the run has no params or no allreduce rows.
SplitModel build_split_model(const RunData& run);

struct Suggestion {
  std::string strategy;  // "current", "optimal (DP)", "MG-WFBP", "DDP 25 MB", "MindSpore [85,160]", "single bucket"
  Prediction prediction;
};
std::vector<Suggestion> suggest_splits(const SplitModel& model);

// The split as --allreduce-split takes it: "85,160", or "none" for the single bucket.
std::string format_split(std::span<const int> split);

}  // namespace wb::analysis
