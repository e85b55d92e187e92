// Data parallel: each rank runs forward, loss and backward on its own batch; each allreduce bucket
// starts as soon as backward has finished its gradients, and the step waits for the last bucket. The
// StepSchedule beside PipelineStep (pipeline_step.hpp).
#pragma once

#include <cstdint>

#include "profiler/record/recorder.hpp"
#include "trainer/batch_source.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/step_schedule.hpp"

namespace wb::trainer {

// Data parallel: forward, loss and backward on this rank's batch; each bucket starts its allreduce
// as soon as backward has finished its gradients; then the wait for the last bucket.
class DataParallelStep final : public StepSchedule {
 public:
  DataParallelStep(model::ResNet50& model, parallel::GradientSync* sync, profiler::Recorder* recorder)
      : model_(model), sync_(sync), wait_name_(recorder ? recorder->intern("allreduce_wait") : 0) {}

  float forward_backward(Batch& batch, std::int64_t step, std::int64_t& comm_ns) override;

 private:
  model::ResNet50& model_;
  parallel::GradientSync* sync_;
  profiler::NameId wait_name_;
};

}  // namespace wb::trainer
