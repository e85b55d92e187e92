// How one training step's forward and backward run over the model, up to gradients ready for the
// update: data parallel (train.cpp) or a pipeline of stages (pipeline_step.hpp).
#pragma once

#include <cstdint>
#include <span>

#include "trainer/batch_source.hpp"

namespace wb::dump {
class StepDump;
}

namespace wb::trainer {

class StepSchedule {
 public:
  virtual ~StepSchedule() = default;
  // Returns the loss; adds the time spent waiting for gradients from other ranks to `comm_ns`.
  virtual float forward_backward(Batch& batch, std::int64_t step, std::int64_t& comm_ns) = 0;
  // Around a step dump, on every rank: the model of the dumping rank must then hold every tensor the
  // dump reads (a pipeline gathers the other stages' parameters, gradients and statistics).
  // after_dump's `dump` is the step's dump on the rank that writes it (null elsewhere, and when a
  // checkpoint is saved), before its gradients and state after the update are written.
  virtual void before_dump(std::int64_t step) { (void)step; }
  virtual void after_dump(std::int64_t step, dump::StepDump* dump) {
    (void)step;
    (void)dump;
  }
  // True when after_dump writes the step's activations itself (a pipeline's are spread over its
  // stages and micro-batches); else the model's observer writes them as they come.
  virtual bool dumps_activations() const { return false; }
  // The parameters this rank's optimizer updates: all of them, or a pipeline stage's own.
  virtual std::span<const backend::ParamSegment> own_segments(const model::ResNet50& model) const {
    return model.segments();
  }
};

}  // namespace wb::trainer
