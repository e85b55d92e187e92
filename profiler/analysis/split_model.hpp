// The allreduce split-point model behind the tuner and `wb suggest-split`.
//
// Inputs: per-parameter gradient-ready times (averaged over steps, relative to the start of backward),
// gradient bytes, and the cost of one allreduce per message size.
//
// Two cost models. A run with the communicator's calibration (wb-train --calibrate-comm, on by default)
// is predicted from it: the allreduce time per size measured alone after a barrier, how much longer it
// takes while compute runs, and how much compute slows while a collective runs. The prediction is then a
// simulation across ranks: each rank's backward is its measured work (the slowdown its own collectives
// caused taken out), slowed again wherever the candidate's collectives run on that rank: from the moment
// the rank joins one until the last rank joins, as much as its communication thread waiting (polling)
// for a later rank slows compute (calibrated apart: a peer that joins one convolution late), then as much
// as the collective of that size does; a collective starts when the last rank joins it and the previous
// one has ended. Without the calibration, the older alpha-beta fit to the run's own allreduce spans is used,
// and said to be unreliable: those spans include the wait for the slowest rank. A split is MindSpore's all_reduce_fusion_config
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

  // The calibrated model (calibrated = true when the run has the communicator's calibration).
  bool calibrated = false;
  std::vector<std::pair<double, double>> latency;         // (bytes, ns) of one allreduce alone, ascending bytes
  std::vector<std::pair<double, double>> latency_during;  // (bytes, ns) from a bucket's ready mark to its
                                                          // collective's end while backward runs
  std::vector<std::pair<double, double>> slowdown;        // (bytes, s): compute takes (1 + s) times longer
                                                          // while a collective of that size runs
  double wait_slowdown = 0.0;  // s while the rank's communication thread waits in a collective for a later
                               // rank (from its join to the collective's start), when wait_calibrated;
  bool wait_calibrated = false;  // else (calibrations without compute_while_waiting) the collective's own s
  std::vector<double> run_point_bytes;  // sizes whose latency or latency_during point is the run's own
                                        // collectives (median from the last rank's join to the end)
  struct RankTiming {
    int rank = 0;
    double offset_ns = 0.0;          // its backward start after the earliest rank's, mean over steps
    std::vector<double> ready_work;  // per parameter (forward order): backward work done when it is ready, ns
    double compute_work = 0.0;       // backward work in all, ns
  };
  std::vector<RankTiming> ranks;
  std::vector<double> ready_work_ns;  // the ranks' mean ready_work: what the DP and MG-WFBP plan with
  double measured_tail_ns = 0.0;  // mean over steps: latest end of backward or communication on any rank,
                                  // after the earliest backward start
  double current_tail_ns = 0.0;   // the same, simulated for the run's own split: a candidate's predicted
                                  // step is the measured step plus its simulated tail less this one
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
  double compute_end_ns = 0.0;      // end of backward compute (the latest rank's, when simulated)
  double step_ns = 0.0;             // measured step - measured exposed + predicted exposed
};

// The split as allreduce::SplitPoints; throws AnalysisError (SplitPoints' message) unless it is strictly
// ascending within [1, params-1].
allreduce::SplitPoints validate_split(std::span<const int> split, std::size_t params);
// The calibrated simulation when model.calibrated, else the alpha-beta stream model.
Prediction predict(const SplitModel& model, std::span<const int> split);
// The alpha-beta stream model alone (one communication stream, no slowdown, ranks alike).
Prediction predict_alpha_beta(const SplitModel& model, std::span<const int> split);
// One allreduce of `bytes` alone: the calibration interpolated (linear between sizes, the last
// segment's slope past the largest), else alpha + beta * bytes.
double allreduce_ns(const SplitModel& model, double bytes);
// A bucket of `bytes` while backward runs, from its ready mark to its end (the calibration; past its
// largest size, allreduce_ns scaled as at that size); alpha + beta * bytes without a calibration.
double allreduce_during_ns(const SplitModel& model, double bytes);
// How much a collective of `bytes` slows compute on its rank: s in (1 + s); 0 without a calibration.
double compute_slowdown(const SplitModel& model, double bytes);

// Optimal contiguous buckets by dynamic programming over the backward order k = 1..P:
// F(j) = min over i <= j of max(F(i-1), R(i..j)) + cost(bytes(i..j)), R = latest ready time in the
// bucket, cost = allreduce_during_ns. F(P) is the earliest possible end of communication, so it also minimises exposed time.
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
// suggest_splits' candidates and DDP-style caps of 1 to 100 MB, by predicted step, each split once.
std::vector<Suggestion> ranked_candidates(const SplitModel& model);
// The model's pick: the first of ranked_candidates, or one within 0.1% of it with fewer buckets.
Suggestion best_split(const SplitModel& model);

// The split as --allreduce-split takes it: "85,160", or "none" for the single bucket.
std::string format_split(std::span<const int> split);

}  // namespace wb::analysis
