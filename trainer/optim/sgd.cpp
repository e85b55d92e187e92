#include "trainer/optim/sgd.hpp"

#include <cmath>
#include <string>

namespace wb::optim {

Sgd::Sgd(const SgdConfig& config) : config_(config) {
  if (!(config.momentum >= 0.0f) || !(config.weight_decay >= 0.0f) || !std::isfinite(config.momentum) ||
      !std::isfinite(config.weight_decay)) {
    throw model::ModelError("sgd: momentum and weight_decay must be finite and >= 0, got " +
                            std::to_string(config.momentum) + " and " + std::to_string(config.weight_decay));
  }
  if (config.nesterov && config.momentum == 0.0f) throw model::ModelError("sgd: nesterov needs momentum > 0");
}

void Sgd::step(model::ResNet50& model, float lr) { step(model, lr, model.segments()); }

void Sgd::step(model::ResNet50& model, float lr, std::span<const backend::ParamSegment> segments) {
  if (!std::isfinite(lr)) throw model::ModelError("sgd: learning rate is not finite");
  const int id = model::ResNet50::optimizer_module_id();
  model::ModelObserver* obs = model.observer();
  if (obs) obs->on_module_begin(id, model::Phase::optimizer);
  backend::SgdParams p{lr, config_.momentum, config_.weight_decay, config_.nesterov, steps_ == 0};
  model.compute_backend().sgd_update(model.param_buffer(), model.grad_buffer(), model.momentum_buffer(),
                                     segments, p);
  if (obs) obs->on_module_end(id, model::Phase::optimizer);
  ++steps_;
}

}  // namespace wb::optim
