// The pipeline schedules as tables (pipeline_schedule.hpp): each stage's order of forward and backward
// work, and where it posts its messages.
#include "trainer/pipeline_schedule.hpp"

#include <algorithm>

namespace wb::trainer {

// The order stage `stage` of `stages` runs its forwards and backwards.
std::vector<PipelineWork> schedule_of(const PipelinePlan& plan, int stage) {
  const int M = plan.micro_batches;
  std::vector<PipelineWork> w;
  if (!plan.one_f_one_b) {
    for (int m = 0; m < M; ++m) w.push_back({PipelineOp::forward, m});
    for (int m = 0; m < M; ++m) w.push_back({PipelineOp::backward, m});
    return w;
  }
  const int warm = std::min(plan.stages - stage - 1, M);
  for (int m = 0; m < warm; ++m) w.push_back({PipelineOp::forward, m});
  for (int i = 0; i < M - warm; ++i) {
    w.push_back({PipelineOp::forward, warm + i});
    w.push_back({PipelineOp::backward, i});
  }
  for (int i = M - warm; i < M; ++i) w.push_back({PipelineOp::backward, i});
  return w;
}

std::vector<std::vector<StageMessage>> message_points(const PipelinePlan& plan, int stage) {
  const bool first = stage == 0, last = stage == plan.stages - 1;
  std::vector<std::vector<StageMessage>> points;
  std::vector<StageMessage> pending;  // the sends of the item before
  for (const PipelineWork& w : schedule_of(plan, stage)) {
    std::vector<StageMessage> point = std::move(pending);
    pending.clear();
    const bool fwd = w.op == PipelineOp::forward;
    if (fwd && !first) point.push_back({false, true, w.micro, stage - 1});
    if (!fwd && !last) point.push_back({false, false, w.micro, stage + 1});
    points.push_back(std::move(point));
    if (fwd && !last) pending.push_back({true, true, w.micro, stage + 1});
    if (!fwd && !first) pending.push_back({true, false, w.micro, stage - 1});
  }
  points.push_back(std::move(pending));
  return points;
}

}  // namespace wb::trainer
