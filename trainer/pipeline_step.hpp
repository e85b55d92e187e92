// Pipeline parallelism: each rank runs one stage (a run of ResNet-50's units) of one data-parallel
// replica; a step's mini-batch is cut into M micro-batches that flow through the stages.
//
//   forward(m)   stage 0 reads micro-batch m's images; later stages wait for the previous stage's
//                activations; all but the last send their output on; the last computes the loss.
//   backward(m)  the last stage starts from its loss; the others wait for the next stage's gradient
//                of their output; all but the first send the gradient of their input back.
//
// Schedules (--pipeline-schedule): gpipe runs F0..F(M-1) then B0..B(M-1); 1f1b (PipeDream-flush)
// runs S-1-s warm-up forwards on stage s, then alternates one forward and one backward, then drains.
// Each micro-batch in flight has its own activations (ResNet50 activation slots): M on every stage
// for gpipe, S-s on stage s for 1f1b.
//
// Semantics, as PyTorch running the micro-batches one at a time through the whole model:
//   - BatchNorm normalises each micro-batch with its own statistics and updates the running
//     statistics once per micro-batch, in micro-batch order (num_batches_tracked grows by M a step);
//   - the step's loss is the sum of the micro-batch losses (--pipeline-loss sum, the seed's
//     PipelineCell), or their mean (mean); each micro-batch loss is the usual mean over its images,
//     so the gradients are the sum (or mean) of the micro-batch gradients;
//   - a stage's gradients are accumulated over the micro-batches, then averaged over its D
//     replicas (allreduce over the stage's group, with the run's buckets and split points cut to the
//     stage's parameters, started as the last micro-batch's backward finishes each bucket);
//   - each stage's optimizer updates its own parameters only.
//
// What it records per step (store: pipeline_span, pipeline_step): every micro-batch's forward and
// backward on its stage, every send and receive (bytes, posted, waited from, done), and the stage's
// busy time and idle time by cause (waiting for activations, for gradients, for the allreduce).
//
// Step dumps: every stage of replica 0 sends its parameters, gradients, momentum and BN state to
// rank 0 around the dumped step, and the outputs of every module it ran in the step's forwards, each
// over the whole mini-batch (its micro-batches' outputs concatenated in order), so rank 0's dump holds
// full tensors under the usual keys, activations included, as a single process's does.
//
// Devices: on the CPU the messages are MPI's, on a GPU NCCL's (pipeline_comm.hpp); message buffers
// are backend tensors, and every receive is posted where the schedule needs it, together with the sends
// computed just before (with MPI every receive is also posted at the step's start).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/backend/backend.hpp"
#include "trainer/config.hpp"
#include "trainer/model/observer.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/pipeline_comm.hpp"
#include "trainer/pipeline_plan.hpp"
#include "trainer/pipeline_schedule.hpp"
#include "trainer/step_schedule.hpp"

namespace wb::profiler {
class Recorder;
}
namespace wb::store {
class Writer;
}

namespace wb::trainer {

// What a PipelineStep records into, and its clock.
struct PipelineRecording {
  store::Writer* writer = nullptr;        // null: nothing recorded
  profiler::Recorder* recorder = nullptr;  // allreduce spans of the stage's buckets (may be null)
  std::int64_t clock_offset_ns = 0;        // added to local times: rank 0's clock
};

class PipelineStep final : public StepSchedule, public model::ModelObserver {
 public:
  // `world`: the job's communicator. `inner`: the observer of module ranges (StepObserver); this
  // object becomes the model's observer and forwards begin/end to it.
  PipelineStep(const TrainConfig& cfg, const PipelinePlan& plan, int rank, parallel::Communicator& world,
               model::ResNet50& model, model::ModelObserver* inner, PipelineRecording recording);
  ~PipelineStep() override;

  float forward_backward(Batch& batch, std::int64_t step, std::int64_t& comm_ns) override;
  void before_dump(std::int64_t step) override;
  void after_dump(std::int64_t step, dump::StepDump* dump) override;
  bool dumps_activations() const override { return true; }
  std::span<const backend::ParamSegment> own_segments(const model::ResNet50& model) const override;

  void on_module_begin(int module_id, model::Phase phase) override;
  void on_module_end(int module_id, model::Phase phase) override;
  void on_grads_ready(int first_param, int last_param_exclusive) override;
  bool wants_outputs() const override;
  void on_output(std::string_view dump_name, const backend::Tensor& output) override;

  const StageSeat& seat() const { return seat_; }
  // Stage s's units, parameters [first, end) and running-statistics floats, for any stage.
  std::pair<int, int> stage_params(int stage) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  StageSeat seat_;
};

// Output shape of unit `unit` (what the next stage receives) for a micro-batch of `n` images of
// side `image_size`.
std::vector<std::int64_t> unit_output_shape(int unit, std::int64_t n, std::int64_t image_size);

}  // namespace wb::trainer
