// ResNet50's pipeline units: their names and parameter, statistics and counter ranges, the activation
// slots a stage keeps for its micro-batches in flight, and the forward and backward of a run of units.
#include <memory>
#include <string>

#include "trainer/model/resnet50.hpp"
#include "trainer/model/resnet50_layers.hpp"

namespace wb::model {

using detail::names_table;

// ---- pipeline stages --------------------------------------------------------------------------------

namespace {

// Drops every activation of a slot, keeping the parameter and gradient views.
template <class Layers, class Conv, class Bn, class Block>
void clear_activations(Layers& L) {
  auto conv = [](Conv& c) {
    c.y.reset();
    c.dx.reset();
  };
  auto bn = [](Bn& b) {
    b.state = {};
    b.y.reset();
    b.dx.reset();
    b.relu_dx.reset();
  };
  conv(L.conv1);
  bn(L.bn1);
  for (Block& blk : L.blocks) {
    for (Conv* c : {&blk.c1, &blk.c2, &blk.c3, &blk.dc}) conv(*c);
    for (Bn* b : {&blk.b1, &blk.b2, &blk.b3, &blk.db}) bn(*b);
    blk.out.reset();
    blk.d_sum.reset();
  }
  for (Tensor* t : {&L.mp_y, &L.mp_ws, &L.mp_dx, &L.gap_y, &L.gap_dx, &L.head_dx}) t->reset();
}

}  // namespace

std::string ResNet50::unit_name(int unit) {
  if (unit < 0 || unit >= kUnits) throw ModelError("unit_name: expected a unit in 0.." + std::to_string(kUnits - 1));
  return layout::unit_name(unit);
}

std::pair<int, int> ResNet50::unit_params(int first_unit, int end_unit) const {
  auto first_param = [&](int u) {
    if (u <= 0) return 0;
    if (u >= kUnits) return kParamTensors;
    if (u == kUnits - 1) return layers_->fc_param;
    return layers_->blocks[static_cast<std::size_t>(u - 1)].c1.param;
  };
  return {first_param(first_unit), first_param(end_unit)};
}

std::pair<std::size_t, std::size_t> ResNet50::unit_stats(int first_unit, int end_unit) const {
  auto first_stat = [&](int u) -> std::size_t {
    if (u >= kUnits - 1) return stats_count_;
    const Bn& b = u <= 0 ? layers_->bn1 : layers_->blocks[static_cast<std::size_t>(u - 1)].b1;
    const int i = buffer_index(names_table()[static_cast<std::size_t>(b.module)] + ".running_mean");
    return buffers_[static_cast<std::size_t>(i)].offset;
  };
  return {first_stat(first_unit), first_stat(end_unit)};
}

std::pair<std::size_t, std::size_t> ResNet50::unit_batch_counters(int first_unit, int end_unit) const {
  auto first_counter = [&](int u) -> std::size_t {
    if (u >= kUnits - 1) return num_batches_tracked_.size();
    const Bn& b = u <= 0 ? layers_->bn1 : layers_->blocks[static_cast<std::size_t>(u - 1)].b1;
    return static_cast<std::size_t>(b.nbt);
  };
  return {first_counter(first_unit), first_counter(end_unit)};
}

void ResNet50::use_gradient_scratch() {
  if (slots_.size() > 1) throw ModelError("use_gradient_scratch: call it before set_activation_slots");
  if (scratch_buf_.defined()) return;
  auto& be = backend_;
  backend::MemoryTagScope tag(backend::MemoryRole::gradient);
  scratch_buf_ = be.empty(Shape{static_cast<std::int64_t>(param_count_)}, backend::DType::f32);
  be.fill(scratch_buf_, 0.0f);
  Layers& L = *layers_;
  auto grad_view = [&](int param) {
    const ParamInfo& pi = params_[static_cast<std::size_t>(param)];
    return be.view(scratch_buf_, pi.offset, Shape(pi.shape));
  };
  auto conv = [&](Conv& c) { c.dw = grad_view(c.param); };
  auto bn = [&](Bn& b) {
    b.dgamma = grad_view(b.param);
    b.dbeta = grad_view(b.param + 1);
  };
  conv(L.conv1);
  bn(L.bn1);
  for (Block& blk : L.blocks) {
    for (Conv* c : {&blk.c1, &blk.c2, &blk.c3}) conv(*c);
    for (Bn* b : {&blk.b1, &blk.b2, &blk.b3}) bn(*b);
    if (blk.ds) {
      conv(blk.dc);
      bn(blk.db);
    }
  }
  L.fc_dw = grad_view(L.fc_param);
  L.fc_db = grad_view(L.fc_param + 1);
}

void ResNet50::set_activation_slots(int n) {
  if (n < 1) throw ModelError("set_activation_slots: expected at least 1 slot, got " + std::to_string(n));
  use_slot(0);
  slots_.clear();
  if (n == 1) return;
  slots_.resize(static_cast<std::size_t>(n));  // slots_[0] stands for the slot in use
  for (int k = 1; k < n; ++k) {
    auto layers = std::make_unique<Layers>(*layers_);
    clear_activations<Layers, Conv, Bn, Block>(*layers);
    slots_[static_cast<std::size_t>(k)].layers = std::move(layers);
  }
}

int ResNet50::activation_slots() const { return slots_.empty() ? 1 : static_cast<int>(slots_.size()); }

void ResNet50::swap_slot(Slot& o) {
  std::swap(layers_, o.layers);
  std::swap(logits_, o.logits);
  std::swap(loss_, o.loss);
  std::swap(probs_, o.probs);
  std::swap(dlogits_, o.dlogits);
  std::swap(input_ref_, o.input_ref);
  std::swap(label_ref_, o.label_ref);
  std::swap(units_dx_, o.units_dx);
  std::swap(last_loss_, o.last_loss);
  std::swap(have_forward_, o.have_forward);
  std::swap(fused_, o.fused);
  std::swap(emit_, o.emit);
  std::swap(units_first_, o.units_first);
  std::swap(units_end_, o.units_end);
}

void ResNet50::use_slot(int slot) {
  if (slot == slot_) return;
  if (slot < 0 || slot >= activation_slots()) {
    throw ModelError("use_slot: slot " + std::to_string(slot) + " of " + std::to_string(activation_slots()));
  }
  swap_slot(slots_[static_cast<std::size_t>(slot_)]);  // the slot in use goes back to its place
  swap_slot(slots_[static_cast<std::size_t>(slot)]);
  slot_ = slot;
}

const Tensor& ResNet50::unit_input(int unit) const {
  const Layers& L = *layers_;
  if (unit == units_first_) return input_ref_;
  if (unit == 1) return L.mp_y;
  return L.blocks[static_cast<std::size_t>(unit - 2)].out;
}

float ResNet50::forward_units(int first, int end_unit, const Tensor& x, const Tensor& labels) {
  if (fc_sharded()) throw ModelError("forward_units: pipeline stages run the whole classifier (no fc_shards)");
  if (first < 0 || first >= end_unit || end_unit > kUnits) {
    throw ModelError("forward_units: expected 0 <= first < end <= " + std::to_string(kUnits) + ", got [" +
                     std::to_string(first) + ", " + std::to_string(end_unit) + ")");
  }
  const std::int64_t n = config_.batch_size, s = config_.image_size;
  if (first == 0 && (!x.defined() || !(x.shape() == Shape{n, 3, s, s}) || x.dtype() != backend::DType::f32)) {
    throw ModelError("forward_units: images must be f32 " + Shape{n, 3, s, s}.to_string());
  }
  if (!x.defined()) throw ModelError("forward_units: no input for unit " + unit_name(first));
  if (end_unit == kUnits && (!labels.defined() || !(labels.shape() == Shape{n}) || labels.dtype() != backend::DType::i32)) {
    throw ModelError("forward_units: labels must be i32 [" + std::to_string(n) + "]");
  }
  Layers& L = *layers_;
  emit_ = observer_ != nullptr && observer_->wants_outputs();
  fused_ = !emit_;
  units_first_ = first;
  units_end_ = end_unit;
  input_ref_ = x;
  if (end_unit == kUnits) label_ref_ = labels;
  float loss = 0.0f;
  const Tensor* cur = &x;
  for (int u = first; u < end_unit; ++u) {
    if (u == 0) {
      conv_forward(L.conv1, x, "conv1");
      bn_forward(L.bn1, L.conv1.y, true, L.relu_module, "bn1", "relu");
      const backend::Pool2dParams mp{3, 2, 1};
      begin(L.maxpool_module, Phase::forward);
      backend_.maxpool_forward(L.bn1.y, L.mp_y, L.mp_ws, mp);
      end(L.maxpool_module, Phase::forward);
      emit("maxpool", L.mp_y);
      cur = &L.mp_y;
    } else if (u < kUnits - 1) {
      Block& blk = L.blocks[static_cast<std::size_t>(u - 1)];
      block_forward(blk, *cur);
      cur = &blk.out;
    } else {
      begin(L.avgpool_module, Phase::forward);
      backend_.global_avgpool_forward(*cur, L.gap_y);
      end(L.avgpool_module, Phase::forward);
      emit("avgpool", L.gap_y);
      begin(L.fc_module, Phase::forward);
      backend_.linear_forward(L.gap_y, L.fc_w, L.fc_b, logits_);
      end(L.fc_module, Phase::forward);
      emit("fc", logits_);
      begin(loss_module_id(), Phase::loss);
      backend_.softmax_cross_entropy_forward(logits_, labels, config_.loss, loss_, probs_);
      end(loss_module_id(), Phase::loss);
      backend_.to_host(loss_, std::span<float>(&last_loss_, 1));
      loss = last_loss_;
    }
  }
  have_forward_ = training_;
  return loss;
}

const Tensor& ResNet50::units_output() const {
  if (units_end_ <= 0 || units_end_ >= kUnits) throw ModelError("units_output: the last forward_units ran the tail");
  const Layers& L = *layers_;
  return units_end_ == 1 ? L.mp_y : L.blocks[static_cast<std::size_t>(units_end_ - 2)].out;
}

const Tensor& ResNet50::backward_units(const Tensor& dy) {
  if (!training_) throw ModelError("backward_units: the model is in eval mode (set_training(true) first)");
  if (!have_forward_) throw ModelError("backward_units: no training forward_units to differentiate in this slot");
  Layers& L = *layers_;
  if (units_end_ < kUnits && !dy.defined()) throw ModelError("backward_units: no gradient for the stage's output");
  const Tensor* d = &dy;
  for (int u = units_end_ - 1; u >= units_first_; --u) {
    if (u == kUnits - 1) {
      loss_and_fc_backward();
      begin(L.avgpool_module, Phase::backward);
      backend_.global_avgpool_backward(unit_input(u), L.gap_dx, L.head_dx);
      end(L.avgpool_module, Phase::backward);
      d = &L.head_dx;
    } else if (u >= 1) {
      d = &block_backward(L.blocks[static_cast<std::size_t>(u - 1)], unit_input(u), *d);
    } else {
      const backend::Pool2dParams mp{3, 2, 1};
      begin(L.maxpool_module, Phase::backward);
      backend_.maxpool_backward(L.bn1.y, L.mp_y, *d, L.mp_ws, L.mp_dx, mp);
      end(L.maxpool_module, Phase::backward);
      bn_backward(L.bn1, L.conv1.y, L.mp_dx, true, L.relu_module);
      conv_backward(L.conv1, input_ref_, L.bn1.dx, false);
    }
  }
  have_forward_ = false;
  if (units_first_ == 0) {
    units_dx_.reset();
  } else {
    units_dx_ = *d;
  }
  return units_dx_;
}

}  // namespace wb::model
