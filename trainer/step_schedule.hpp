// How one training step's forward and backward run over the model, up to gradients ready for the
// update: data parallel (train.cpp) or a pipeline of stages (pipeline_step.hpp).
#pragma once

#include <cstdint>
#include <span>

#include "trainer/batch_source.hpp"

namespace wb::trainer {

class StepSchedule {
 public:
  virtual ~StepSchedule() = default;
  // Returns the loss; adds the time spent waiting for gradients from other ranks to `comm_ns`.
  virtual float forward_backward(Batch& batch, std::int64_t step, std::int64_t& comm_ns) = 0;
  // Around a step dump, on every rank: the model of the dumping rank must then hold every tensor the
  // dump reads (a pipeline gathers the other stages' parameters, gradients and statistics).
  virtual void before_dump(std::int64_t step) { (void)step; }
  virtual void after_dump(std::int64_t step) { (void)step; }
  // The parameters this rank's optimizer updates: all of them, or a pipeline stage's own.
  virtual std::span<const backend::ParamSegment> own_segments(const model::ResNet50& model) const {
    return model.segments();
  }
};

}  // namespace wb::trainer
