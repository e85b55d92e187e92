#pragma once
// Momentum SGD over the model's contiguous buffers, torch.optim.SGD semantics (dampening 0). Weight
// decay applies only to parameters whose ParamInfo::decay is set (conv and fc weights), like the
// parameter groups of the seed guide.

#include <cstdint>
#include <span>

#include "trainer/model/resnet50.hpp"

namespace wb::optim {

struct SgdConfig {
  float momentum = 0.9f;
  float weight_decay = 1e-4f;
  bool nesterov = false;
};

class Sgd {
 public:
  explicit Sgd(const SgdConfig& config);
  // One update with learning rate lr, wrapped in the observer's Phase::optimizer range. The first step
  // initialises the momentum buffer with the gradient, as torch does.
  void step(model::ResNet50& model, float lr);
  // The same over some parameters only (a pipeline stage's): the others keep their values and momentum.
  void step(model::ResNet50& model, float lr, std::span<const backend::ParamSegment> segments);
  std::int64_t steps() const { return steps_; }
  // After restoring a momentum buffer from a checkpoint, so the next step continues it.
  void set_steps(std::int64_t steps) { steps_ = steps; }
  const SgdConfig& config() const { return config_; }

 private:
  SgdConfig config_;
  std::int64_t steps_ = 0;
};

}  // namespace wb::optim
