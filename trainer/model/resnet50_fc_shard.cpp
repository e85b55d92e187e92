// ResNet50's classifier sharded over a group of ranks (--shard-fc): the forward's loss over the group's
// rows and the backward's gradients, with the exchanges through FcShard.
#include <algorithm>
#include <cmath>

#include "trainer/backend/checks.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/model/resnet50_layers.hpp"

namespace wb::model {

using detail::whole;

// ---- the sharded classifier -------------------------------------------------------------------------
//
// Member s of a group of N holds classes [s * K/N, (s + 1) * K/N). Its rows of the group batch are
// [s * B, (s + 1) * B): the group batch is the members' batches in member order. With t the smoothed
// targets (they sum to 1 over the K classes: t = on for the label, off elsewhere), each row's loss is
//   -sum_j t_j log softmax(z)_j = M + log S - (on - off) * z_label - off * sum_j z_j
// with M the row's maximum and S = sum_j exp(z_j - M): three sums over the members, in double. Each
// member reports the mean over its own rows, as a data-parallel rank does for its batch, and backward
// gives d/dz = (softmax(z) - t) / B over all the group's rows: the features' gradient, summed over the
// members and scattered back, is then the gradient of this rank's own loss, and the slice's gradient the
// sum of the members' (over every shard group with FcShard::sync_grads), which the division by
// replicas() turns into data parallel's mean.

float ResNet50::sharded_fc_forward(const Tensor& labels) {
  if (!fc_shard_) throw ModelError("forward: a sharded classifier needs its FcShard (set_fc_shard)");
  if (fc_shard_->shards() != config_.fc_shards || fc_shard_->shard() != config_.fc_shard) {
    throw ModelError("forward: the FcShard's group (" + std::to_string(fc_shard_->shard()) + " of " +
                     std::to_string(fc_shard_->shards()) + ") is not the model's");
  }
  Layers& L = *layers_;
  if (!sharded_) sharded_ = std::make_unique<ShardedFc>();
  ShardedFc& h = *sharded_;
  const std::int64_t b = config_.batch_size, f = L.gap_y.shape()[1], n = config_.fc_shards;
  const std::int64_t rows = n * b, k = config_.num_classes, kl = k / n, c0 = config_.fc_shard * kl;
  const auto ub = static_cast<std::size_t>(b), uf = static_cast<std::size_t>(f), un = static_cast<std::size_t>(n);
  const auto ukl = static_cast<std::size_t>(kl), urows = static_cast<std::size_t>(rows);

  begin(L.fc_module, Phase::forward);
  // The group's features and labels (labels travel as floats: exact below 2^24 classes).
  h.mine.resize(ub * (uf + 1));
  backend_.to_host(L.gap_y, std::span<float>(h.mine).first(ub * uf));
  std::vector<std::int32_t> own(ub);
  backend_.to_host(labels, std::span<std::int32_t>(own));
  for (std::size_t i = 0; i < ub; ++i) h.mine[ub * uf + i] = static_cast<float>(own[i]);
  h.all.resize(un * h.mine.size());
  fc_shard_->gather(FcExchange::features, h.mine, h.all);
  h.features.resize(urows * uf);
  h.labels.resize(urows);
  for (std::size_t m = 0; m < un; ++m) {
    const float* block = h.all.data() + m * h.mine.size();
    std::copy_n(block, ub * uf, h.features.begin() + static_cast<std::ptrdiff_t>(m * ub * uf));
    for (std::size_t i = 0; i < ub; ++i) h.labels[m * ub + i] = static_cast<std::int32_t>(block[ub * uf + i]);
  }
  backend::check_label_range(h.labels, k, "forward (sharded classifier)");
  if (!h.x.defined()) h.x = backend_.empty(Shape{rows, f, 1, 1}, backend::DType::f32);
  backend_.from_host(h.x, h.features);
  backend_.linear_forward(h.x, L.fc_w, L.fc_b, logits_);  // (N * B, K/N): this slice, every row of the group
  end(L.fc_module, Phase::forward);

  begin(loss_module_id(), Phase::loss);
  h.z.resize(urows * ukl);
  backend_.to_host(logits_, h.z);
  const backend::LossTargets t = backend::loss_targets(config_.loss, k, "forward (sharded classifier)");
  h.max.assign(urows, -HUGE_VAL);
  for (std::size_t i = 0; i < urows; ++i)
    for (std::size_t j = 0; j < ukl; ++j) h.max[i] = std::max(h.max[i], static_cast<double>(h.z[i * ukl + j]));
  fc_shard_->allreduce(FcExchange::max, h.max);
  h.sum.assign(urows, 0.0);
  h.target.assign(2 * urows, 0.0);
  for (std::size_t i = 0; i < urows; ++i) {
    const std::int64_t label = h.labels[i] - c0;  // in this slice when 0 <= label < K/N
    for (std::size_t j = 0; j < ukl; ++j) {
      const double z = h.z[i * ukl + j];
      h.sum[i] += std::exp(z - h.max[i]);
      h.target[2 * i + 1] += z;
    }
    if (label >= 0 && label < kl) h.target[2 * i] = h.z[i * ukl + static_cast<std::size_t>(label)];
  }
  fc_shard_->allreduce(FcExchange::sum, h.sum);
  fc_shard_->allreduce(FcExchange::target, h.target);
  h.probs.resize(h.z.size());
  for (std::size_t i = 0; i < urows; ++i) {
    for (std::size_t j = 0; j < ukl; ++j) {
      h.probs[i * ukl + j] = static_cast<float>(std::exp(static_cast<double>(h.z[i * ukl + j]) - h.max[i]) / h.sum[i]);
    }
  }
  double total = 0.0;
  for (std::size_t i = ub * static_cast<std::size_t>(config_.fc_shard), e = i + ub; i < e; ++i) {
    total += h.max[i] + std::log(h.sum[i]) - (t.on - t.off) * h.target[2 * i] - t.off * h.target[2 * i + 1];
  }
  end(loss_module_id(), Phase::loss);

  // A step dump's "fc": this rank's rows of the full logits, from every member's slice.
  if (fc_shard_->full_logits()) {
    std::vector<float> slices(un * h.z.size()), full(ub * static_cast<std::size_t>(k));
    fc_shard_->gather(FcExchange::logits, h.z, slices);
    for (std::size_t i = 0; i < ub; ++i) {
      const std::size_t row = ub * static_cast<std::size_t>(config_.fc_shard) + i;
      for (std::size_t m = 0; m < un; ++m) {
        std::copy_n(slices.begin() + static_cast<std::ptrdiff_t>(m * h.z.size() + row * ukl), ukl,
                    full.begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(k) + m * ukl));
      }
    }
    if (!h.full_logits.defined()) h.full_logits = backend_.empty(Shape{b, k}, backend::DType::f32);
    backend_.from_host(h.full_logits, full);
    emit("fc", h.full_logits);
  }
  return static_cast<float>(total / static_cast<double>(b));
}

void ResNet50::sharded_fc_backward() {
  Layers& L = *layers_;
  ShardedFc& h = *sharded_;
  const std::int64_t b = config_.batch_size, f = L.gap_y.shape()[1], kl = config_.num_classes / config_.fc_shards;
  const std::int64_t c0 = config_.fc_shard * kl;
  const std::size_t rows = h.labels.size(), ukl = static_cast<std::size_t>(kl);
  const backend::LossTargets t = backend::loss_targets(config_.loss, config_.num_classes, "backward (sharded classifier)");
  begin(loss_module_id(), Phase::loss);
  h.dz.resize(h.probs.size());
  const double inv_b = 1.0 / static_cast<double>(b);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < ukl; ++j) {
      const bool labelled = h.labels[i] == c0 + static_cast<std::int64_t>(j);
      h.dz[i * ukl + j] = static_cast<float>((h.probs[i * ukl + j] - (labelled ? t.on : t.off)) * inv_b);
    }
  }
  if (!dlogits_.defined()) dlogits_ = backend_.empty(Shape{static_cast<std::int64_t>(rows), kl}, backend::DType::f32);
  backend_.from_host(dlogits_, h.dz);
  end(loss_module_id(), Phase::loss);

  begin(L.fc_module, Phase::backward);
  backend_.linear_backward(h.x, L.fc_w, dlogits_, h.dx_t, L.fc_dw, L.fc_db);
  // This rank's features' gradient: the members' parts summed, its own rows kept.
  h.dx.resize(rows * static_cast<std::size_t>(f));
  backend_.to_host(h.dx_t, h.dx);
  std::vector<float> mine(static_cast<std::size_t>(b * f));
  fc_shard_->reduce_scatter(FcExchange::grads, h.dx, mine);
  if (!L.gap_dx.defined()) L.gap_dx = backend_.empty(L.gap_y.shape(), backend::DType::f32);
  backend_.from_host(L.gap_dx, mine);
  // The slice's gradients: summed over the shard groups, then data parallel's mean over the replicas.
  const ParamInfo& w = params_[static_cast<std::size_t>(L.fc_param)];
  std::vector<float> grads(w.numel + params_.back().numel);
  backend_.to_host(L.fc_dw, std::span<float>(grads).first(w.numel));
  backend_.to_host(L.fc_db, std::span<float>(grads).subspan(w.numel));
  fc_shard_->sync_grads(grads);
  const float inv_replicas = 1.0f / static_cast<float>(fc_shard_->replicas());
  for (float& g : grads) g *= inv_replicas;
  backend_.from_host(L.fc_dw, std::span<const float>(grads).first(w.numel));
  backend_.from_host(L.fc_db, std::span<const float>(grads).subspan(w.numel));
  grads_ready(L.fc_param, L.fc_param + 2);
  end(L.fc_module, Phase::backward);
}

}  // namespace wb::model
