// Pipeline parallelism's plan: how many stages, which units of ResNet-50 each runs, how many
// micro-batches, which schedule, and where each rank sits. Checked from the flags alone
// (validate_pipeline_flags, part of validate) and again against the job's world size (plan_pipeline).
//
// Units (model::ResNet50::unit_name): head (conv1, bn1, relu, maxpool), the 16 bottleneck blocks
// layer1.0 .. layer4.2, and fc (avgpool, fc and the loss). --stage-split names the unit each stage
// after the first begins with; a layer name alone is its first block ("layer3" = "layer3.0").
// The default for two stages is the seed's: stage 1 begins at layer3.
//
// Ranks are replica-major: rank = replica * stages + stage.
#pragma once

#include <string>
#include <vector>

#include "trainer/config.hpp"

namespace wb::trainer {

struct PipelinePlan {
  int stages = 1;
  int micro_batches = 1;
  int replicas = 1;              // data-parallel replicas of each stage (world / stages)
  int micro_batch_size = 0;      // batch_size / micro_batches
  std::vector<int> first_unit;   // stages + 1 entries: stage s runs units [first_unit[s], first_unit[s + 1])
  bool one_f_one_b = false;      // --pipeline-schedule 1f1b
  bool loss_mean = false;        // --pipeline-loss mean
  bool active() const { return stages > 1 || micro_batches > 1; }
};

struct StageSeat {
  int stage = 0;
  int replica = 0;
  int prev_rank = -1;  // the rank of the previous stage of this replica; -1 for the first stage
  int next_rank = -1;  // the rank of the next stage; -1 for the last stage
};

// The units where stages 1.. begin, from --stage-split's text (empty: the default split). Throws
// ConfigError naming the flag: an unknown unit, not ascending, or not stages - 1 of them.
std::vector<int> parse_stage_split(const std::string& text, int stages);
// The checks that need only the flags. Throws ConfigError naming the flag.
void validate_pipeline_flags(const TrainConfig& cfg);
// The plan for a job of `world` ranks. Throws ConfigError when world is not a multiple of the stages.
PipelinePlan plan_pipeline(const TrainConfig& cfg, int world);
StageSeat seat_of(const PipelinePlan& plan, int rank);
// "head..layer2 | layer3..fc": the stages' unit ranges, for the start-up line and the run file.
std::string describe_stages(const PipelinePlan& plan);
// The start-up line: "2 stages x 1 replica, 4 micro-batches of 8, gpipe, loss sum: head..layer2.3 | layer3.0..fc".
std::string describe_pipeline(const PipelinePlan& plan);
// meta pipeline_json: stages, replicas, micro_batches, micro_batch_size, schedule, loss, and per stage
// its first and end unit and their names.
std::string pipeline_json(const PipelinePlan& plan);

}  // namespace wb::trainer
