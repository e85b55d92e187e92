// Pipeline-parallel runs (wb-train --pipeline-stages S --micro-batches M): where each stage waits.
//
//   bubble ratio   a stage's idle time waiting for activations or gradients over its forward-backward
//                  phase (the allreduce wait left out), per step; GPipe's ideal with S equal stages is
//                  (S-1)/(M+S-1)
//   imbalance      the slowest stage's compute per step over the mean stage's
//   balanced split the --stage-split that minimises the slowest stage, from the measured compute time
//                  of every unit (head, each bottleneck block, fc) summed over forward and backward
//   M for < 10%    the fewest micro-batches whose predicted bubble, mean over stages, is under 10%:
//                  with per-micro-batch stage times t_s a GPipe step lasts (M+S-1) max t_s, so the mean
//                  bubble is 1 - M mean(t) / ((M+S-1) max t); none when imbalance alone exceeds 10%.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "layout/resnet50.hpp"
#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// The plan recorded in meta pipeline_json.
struct PipelinePlanInfo {
  int stages = 1;
  int replicas = 1;
  int micro_batches = 1;
  int micro_batch_size = 0;
  std::string schedule;  // gpipe | 1f1b
  std::string loss;      // sum | mean
  std::vector<int> first_unit;  // stages + 1 entries
  std::vector<std::string> stage_names;  // "head..layer2.3"
};
// nullopt for runs without a pipeline. Throws AnalysisError for a malformed pipeline_json.
std::optional<PipelinePlanInfo> pipeline_plan(const RunData& run);

// The units of ResNet-50 a stage takes a run of: head, layer1.0 .. layer4.2, fc.
inline constexpr int kPipelineUnits = layout::kUnits;
std::string pipeline_unit_name(int unit);
// The unit a module range belongs to (by its torchvision name), -1 for none.
int unit_of_module(const std::string& name);

inline double ideal_bubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

struct StageBubble {
  int rank = 0;
  int stage = 0;
  int step = 0;
  std::int64_t phase_ns = 0;  // the forward-backward phase, the allreduce wait left out
  std::int64_t busy_ns = 0;
  std::int64_t wait_act_ns = 0;
  std::int64_t wait_grad_ns = 0;
  std::int64_t wait_allreduce_ns = 0;
  double bubble = 0.0;  // (wait_act + wait_grad) / phase
};

struct StageSummary {
  int stage = 0;
  double bubble = 0.0;       // mean over the steady steps and the stage's ranks
  double busy_ns = 0.0;      // mean compute per step
  double wait_act_ns = 0.0;  // mean per step
  double wait_grad_ns = 0.0;
  double wait_allreduce_ns = 0.0;
};

struct PipelineAnalysis {
  PipelinePlanInfo plan;
  std::vector<StageBubble> steps;     // every stage of every rank and step
  std::vector<StageSummary> stages;   // steady steps (all but the first when there are several)
  int steady_from_step = 0;
  double ideal = 0.0;                 // (S-1)/(M+S-1)
  double mean_bubble = 0.0;           // over the stages
  double imbalance = 1.0;             // max stage busy / mean stage busy
  std::vector<double> unit_ns;        // measured compute per unit and step (0 when not seen)
  std::vector<int> balanced_first_unit;  // the balanced split (stages + 1 entries); empty without unit times
  double balanced_imbalance = 1.0;       // its predicted max / mean
  std::string balanced_flag;             // "--stage-split layer3.1"
  std::optional<int> micro_for_10pct;           // with the measured stage times
  std::optional<int> micro_for_10pct_balanced;  // with the balanced split
};

// nullopt for runs without a pipeline or without pipeline_step rows.
std::optional<PipelineAnalysis> analyze_pipeline(const RunData& run);

// The split of `unit_ns` into `stages` contiguous runs that minimises the largest run's sum
// (first units, stages + 1 entries, the last being unit_ns.size()).
std::vector<int> balanced_split(const std::vector<double>& unit_ns, int stages);
// Fewest micro-batches (>= stages, <= 4096) whose predicted mean bubble is under `target`, given the
// per-micro-batch time of each stage; nullopt when none is.
std::optional<int> micro_batches_for_bubble(const std::vector<double>& stage_ns, double target);

}  // namespace wb::analysis
