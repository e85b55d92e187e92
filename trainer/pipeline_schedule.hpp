// The schedules of a pipeline stage as tables: the order of its micro-batches' forward and backward work
// (--pipeline-schedule gpipe or 1f1b) and where it posts its messages to the neighbouring stages.
// PipelineStep (pipeline_step.hpp) runs exactly these.
#pragma once

#include <vector>

#include "trainer/pipeline_plan.hpp"

namespace wb::trainer {

enum class PipelineOp { forward, backward };
struct PipelineWork {
  PipelineOp op;
  int micro;
};

// Stage `stage`'s work in order: gpipe runs F0..F(M-1) then B0..B(M-1); 1f1b (PipeDream-flush) runs
// S-1-stage warm-up forwards, then alternates one forward and one backward, then drains.
std::vector<PipelineWork> schedule_of(const PipelinePlan& plan, int stage);

// A message of one stage's step: a send or a receive of micro-batch `micro`'s activations (forward)
// or their gradient (backward), with the neighbouring stage `peer_stage`.
struct StageMessage {
  bool send;
  bool activation;
  int micro;
  int peer_stage;
};
// Where stage `stage` posts its messages: one entry per work item of its schedule, posted as one group
// at the item's start (the sends the item before computed, and the receive the item waits for), and a
// last entry posted after the last item (its sends). PipelineStep runs exactly this. NCCL runs a
// rank's groups in this order and matches each pair of ranks' messages in order: the sends ride with
// the next receive so that neither of two neighbours waits on a send while the other waits on its own
// (1F1B's steady state), which a send posted alone would do.
std::vector<std::vector<StageMessage>> message_points(const PipelinePlan& plan, int stage);

}  // namespace wb::trainer
