// ResNet50's training step: each op's forward next to its backward (convolution, batch norm with its
// synchronised form, the bottleneck block, the whole network), and the freeing of what backward consumed.
#include <algorithm>
#include <cmath>

#include "trainer/backend/checks.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/model/resnet50_layers.hpp"

namespace wb::model {

using detail::kBnEps;
using detail::kBnMomentum;
using detail::names_table;

// Drops a tensor backward no longer needs, where the backend makes that cheap (Backend::
// cheap_reallocation): an activation gradient once consumed, an activation once the backward of every
// op that reads it has run. Only a few gradients are then alive at once instead of one per layer, and
// the activations held fall as backward goes down the network, as in PyTorch; forward allocates them
// again. With free_consumed_grads 0 every tensor is kept for the next step instead.
void ResNet50::consumed(Tensor& t) const {
  const bool free = config_.free_consumed_grads < 0 ? backend_.cheap_reallocation() : config_.free_consumed_grads > 0;
  if (free) t = Tensor();
}

void ResNet50::conv_forward(Conv& c, const Tensor& x, std::string_view name) {
  begin(c.module, Phase::forward);
  backend_.conv2d_forward(x, c.w, c.y, c.p);
  end(c.module, Phase::forward);
  emit(name, c.y);
}

void ResNet50::conv_backward(Conv& c, const Tensor& x, const Tensor& dy, bool need_dx) {
  begin(c.module, Phase::backward);
  backend_.conv2d_backward_weights(x, dy, c.dw, c.p);
  grads_ready(c.param, c.param + 1);
  if (need_dx) backend_.conv2d_backward_data(dy, c.w, c.dx, x.shape(), c.p);
  end(c.module, Phase::backward);
}

void ResNet50::bn_forward(Bn& b, const Tensor& x, bool relu, int relu_module, std::string_view bn_name,
                          std::string_view relu_name) {
  const backend::BatchNormParams bp{kBnEps, kBnMomentum, relu && fused_};
  begin(b.module, Phase::forward);
  if (training_ && bn_sync_) {
    sync_bn_forward(b, x, bp);
    ++num_batches_tracked_[static_cast<std::size_t>(b.nbt)];
  } else if (training_) {
    b.count = 0;
    backend_.batchnorm_forward_train(x, b.gamma, b.beta, b.y, b.rmean, b.rvar, b.state, bp);
    ++num_batches_tracked_[static_cast<std::size_t>(b.nbt)];
  } else {
    backend_.batchnorm_forward_eval(x, b.gamma, b.beta, b.y, b.rmean, b.rvar, bp);
  }
  end(b.module, Phase::forward);
  emit(bn_name, b.y);
  if (relu && !fused_) {
    begin(relu_module, Phase::forward);
    backend_.relu_forward(b.y, b.y);  // in place, like torchvision's ReLU(inplace=True)
    end(relu_module, Phase::forward);
    emit(relu_name, b.y);
  }
}

// SyncBatchNorm's forward: this process's sums of x and x^2 and its count, summed over the group; the
// whole batch's mean and biased variance from them, in double.
void ResNet50::sync_bn_forward(Bn& b, const Tensor& x, const backend::BatchNormParams& bp) {
  const Shape& xs = x.shape();
  const std::size_t c = static_cast<std::size_t>(xs[1]);
  b.sums.resize(2 * c + 1);
  backend_.batchnorm_sums(x, std::span(b.sums).first(2 * c));
  b.sums[2 * c] = static_cast<double>(xs[0] * xs[2] * xs[3]);
  bn_sync_->allreduce(b.module, true, b.sums);
  const double n = b.sums[2 * c];
  b.count = static_cast<std::int64_t>(std::llround(n));
  b.mean.resize(c);
  b.var.resize(c);
  for (std::size_t i = 0; i < c; ++i) {
    const double m = b.sums[i] / n;
    b.mean[i] = m;
    b.var[i] = std::max(0.0, b.sums[c + i] / n - m * m);
  }
  backend_.batchnorm_forward_with_stats(x, b.gamma, b.beta, b.y, b.rmean, b.rvar, b.mean, b.var, b.count, b.state,
                                        bp);
}

void ResNet50::bn_backward(Bn& b, const Tensor& x, const Tensor& dy, bool relu, int relu_module) {
  const Tensor* g = &dy;
  if (relu && !fused_) {
    begin(relu_module, Phase::backward);
    backend_.relu_backward(b.y, dy, b.relu_dx);
    end(relu_module, Phase::backward);
    g = &b.relu_dx;
  }
  const backend::BatchNormParams bp{kBnEps, kBnMomentum, relu && fused_};
  begin(b.module, Phase::backward);
  if (b.count > 0 && bn_sync_) {
    // dgamma and dbeta are this process's and final: their bucket may start before the sums return.
    const std::size_t c = b.mean.size();
    b.sums.resize(2 * c);
    backend_.batchnorm_backward_reduce(x, *g, b.gamma, b.beta, b.state, b.dx, b.dgamma, b.dbeta, b.sums, bp);
    grads_ready(b.param, b.param + 2);
    bn_sync_->allreduce(b.module, false, b.sums);
    backend_.batchnorm_backward_elemt(x, b.gamma, b.state, b.dx, b.sums, b.count, bp);
  } else {
    backend_.batchnorm_backward(x, *g, b.gamma, b.beta, b.state, b.dx, b.dgamma, b.dbeta, bp);
    grads_ready(b.param, b.param + 2);
  }
  if (g != &dy) consumed(b.relu_dx);
  end(b.module, Phase::backward);
}

void ResNet50::block_forward(Block& blk, const Tensor& x) {
  const auto& names = names_table();
  auto name = [&](const Conv& c) -> std::string_view { return names[static_cast<std::size_t>(c.module)]; };
  auto bname = [&](const Bn& b) -> std::string_view { return names[static_cast<std::size_t>(b.module)]; };
  begin(blk.module, Phase::forward);
  conv_forward(blk.c1, x, name(blk.c1));                                                    // (N, w, H, W)
  bn_forward(blk.b1, blk.c1.y, true, blk.relu_module, bname(blk.b1), blk.relu_names[0]);
  conv_forward(blk.c2, blk.b1.y, name(blk.c2));                                             // (N, w, H/s, W/s)
  bn_forward(blk.b2, blk.c2.y, true, blk.relu_module, bname(blk.b2), blk.relu_names[1]);
  conv_forward(blk.c3, blk.b2.y, name(blk.c3));                                             // (N, 4w, H/s, W/s)
  bn_forward(blk.b3, blk.c3.y, false, -1, bname(blk.b3), {});
  const Tensor* identity = &x;
  if (blk.ds) {
    conv_forward(blk.dc, x, name(blk.dc));
    bn_forward(blk.db, blk.dc.y, false, -1, bname(blk.db), {});
    identity = &blk.db.y;
  }
  // The residual add carries the block's final relu as a post-op; the add itself is no module of its own.
  begin(blk.relu_module, Phase::forward);
  backend_.add(blk.b3.y, *identity, blk.out, true);
  end(blk.relu_module, Phase::forward);
  // No backward reads the summands (bn3's and the downsample bn's outputs): only the sum, through its relu.
  if (training_) {
    consumed(blk.b3.y);
    if (blk.ds) consumed(blk.db.y);
  }
  emit(blk.relu_names[2], blk.out);
  end(blk.module, Phase::forward);
  emit(names[static_cast<std::size_t>(blk.module)], blk.out);
}

Tensor& ResNet50::block_backward(Block& blk, const Tensor& x, const Tensor& dy) {
  begin(blk.module, Phase::backward);
  begin(blk.relu_module, Phase::backward);
  backend_.relu_backward(blk.out, dy, blk.d_sum);
  end(blk.relu_module, Phase::backward);
  // The block's output was also the next block's input, whose backward has run.
  consumed(blk.out);
  // The downsample branch first: its parameters come last in forward order, so gradients become ready
  // in strictly decreasing index order.
  const Tensor* d_identity = &blk.d_sum;
  if (blk.ds) {
    bn_backward(blk.db, blk.dc.y, blk.d_sum, false, -1);
    consumed(blk.dc.y);
    conv_backward(blk.dc, x, blk.db.dx, true);
    consumed(blk.db.dx);
    d_identity = &blk.dc.dx;
  }
  bn_backward(blk.b3, blk.c3.y, blk.d_sum, false, -1);
  consumed(blk.c3.y);
  if (blk.ds) consumed(blk.d_sum);
  conv_backward(blk.c3, blk.b2.y, blk.b3.dx, true);
  consumed(blk.b3.dx);
  bn_backward(blk.b2, blk.c2.y, blk.c3.dx, true, blk.relu_module);
  consumed(blk.c2.y);
  consumed(blk.b2.y);
  consumed(blk.c3.dx);
  conv_backward(blk.c2, blk.b1.y, blk.b2.dx, true);
  consumed(blk.b2.dx);
  bn_backward(blk.b1, blk.c1.y, blk.c2.dx, true, blk.relu_module);
  consumed(blk.c1.y);
  consumed(blk.b1.y);
  consumed(blk.c2.dx);
  conv_backward(blk.c1, x, blk.b1.dx, true);
  consumed(blk.b1.dx);
  backend_.add(blk.c1.dx, *d_identity, blk.c1.dx, false);  // both paths reach the block input
  consumed(blk.ds ? blk.dc.dx : blk.d_sum);
  end(blk.module, Phase::backward);
  return blk.c1.dx;
}

float ResNet50::forward(std::span<const float> images, std::span<const std::int32_t> labels) {
  if (images.size() != static_cast<std::size_t>(images_.numel())) {
    throw ModelError("forward: images must hold batch*3*S*S = " + std::to_string(images_.numel()) + " floats, got " +
                     std::to_string(images.size()));
  }
  if (labels.size() != static_cast<std::size_t>(config_.batch_size)) {
    throw ModelError("forward: expected " + std::to_string(config_.batch_size) + " labels, got " +
                     std::to_string(labels.size()));
  }
  backend_.from_host(images_, images);
  backend_.from_host(labels_, labels);
  return forward(images_, labels_);
}

float ResNet50::forward(const Tensor& images, const Tensor& labels) {
  const std::int64_t n = config_.batch_size, s = config_.image_size;
  if (!images.defined() || !(images.shape() == Shape{n, 3, s, s}) || images.dtype() != backend::DType::f32) {
    throw ModelError("forward: images must be f32 " + Shape{n, 3, s, s}.to_string() + ", got " +
                     (images.defined() ? images.shape().to_string() : std::string("undefined")));
  }
  if (!labels.defined() || !(labels.shape() == Shape{n}) || labels.dtype() != backend::DType::i32) {
    throw ModelError("forward: labels must be i32 [" + std::to_string(n) + "]");
  }
  Layers& L = *layers_;
  emit_ = observer_ != nullptr && observer_->wants_outputs();
  fused_ = !emit_;
  input_ref_ = images;
  label_ref_ = labels;

  conv_forward(L.conv1, images, "conv1");                                       // (N, 64, S/2, S/2)
  bn_forward(L.bn1, L.conv1.y, true, L.relu_module, "bn1", "relu");
  const backend::Pool2dParams mp{3, 2, 1};
  begin(L.maxpool_module, Phase::forward);
  backend_.maxpool_forward(L.bn1.y, L.mp_y, L.mp_ws, mp);                       // (N, 64, S/4, S/4)
  end(L.maxpool_module, Phase::forward);
  emit("maxpool", L.mp_y);
  const Tensor* x = &L.mp_y;
  for (Block& blk : L.blocks) {
    block_forward(blk, *x);
    x = &blk.out;                                                               // (N, 2048, S/32, S/32) at the end
  }
  begin(L.avgpool_module, Phase::forward);
  backend_.global_avgpool_forward(*x, L.gap_y);                                 // (N, 2048, 1, 1)
  end(L.avgpool_module, Phase::forward);
  emit("avgpool", L.gap_y);
  if (fc_sharded()) {
    last_loss_ = sharded_fc_forward(labels);
    have_forward_ = training_;
    return last_loss_;
  }
  begin(L.fc_module, Phase::forward);
  backend_.linear_forward(L.gap_y, L.fc_w, L.fc_b, logits_);                    // (N, classes)
  end(L.fc_module, Phase::forward);
  emit("fc", logits_);
  begin(loss_module_id(), Phase::loss);
  backend_.softmax_cross_entropy_forward(logits_, labels, config_.loss, loss_, probs_);
  end(loss_module_id(), Phase::loss);
  backend_.to_host(loss_, std::span<float>(&last_loss_, 1));
  have_forward_ = training_;
  return last_loss_;
}

void ResNet50::loss_and_fc_backward() {
  Layers& L = *layers_;
  begin(loss_module_id(), Phase::loss, backend::MemoryRole::gradient);
  backend_.softmax_cross_entropy_backward(probs_, label_ref_, config_.loss, dlogits_);
  end(loss_module_id(), Phase::loss);
  begin(L.fc_module, Phase::backward);
  backend_.linear_backward(L.gap_y, L.fc_w, dlogits_, L.gap_dx, L.fc_dw, L.fc_db);
  grads_ready(L.fc_param, L.fc_param + 2);
  end(L.fc_module, Phase::backward);
}

void ResNet50::backward() {
  if (!training_) throw ModelError("backward: the model is in eval mode (set_training(true) first)");
  if (!have_forward_) throw ModelError("backward: no training forward to differentiate");
  Layers& L = *layers_;
  if (fc_sharded()) sharded_fc_backward();
  else loss_and_fc_backward();

  const Tensor& last = L.blocks.back().out;
  begin(L.avgpool_module, Phase::backward);
  backend_.global_avgpool_backward(last, L.gap_dx, L.head_dx);
  end(L.avgpool_module, Phase::backward);

  Tensor* d = &L.head_dx;
  for (std::size_t i = L.blocks.size(); i-- > 0;) {
    const Tensor& x = i == 0 ? L.mp_y : L.blocks[i - 1].out;
    Tensor& dx = block_backward(L.blocks[i], x, *d);  // the block's own c1.dx
    consumed(*d);  // the block's relu backward has read the gradient of its output
    d = &dx;
  }
  const backend::Pool2dParams mp{3, 2, 1};
  begin(L.maxpool_module, Phase::backward);
  backend_.maxpool_backward(L.bn1.y, L.mp_y, *d, L.mp_ws, L.mp_dx, mp);
  end(L.maxpool_module, Phase::backward);
  consumed(*d);
  consumed(L.mp_y);
  bn_backward(L.bn1, L.conv1.y, L.mp_dx, true, L.relu_module);
  consumed(L.conv1.y);
  consumed(L.bn1.y);
  consumed(L.mp_dx);
  conv_backward(L.conv1, input_ref_, L.bn1.dx, false);  // no gradient for the images
  consumed(L.bn1.dx);
  have_forward_ = false;
}

}  // namespace wb::model
