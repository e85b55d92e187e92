// ResNet50's private parts, shared by its source files: the layer records (a convolution, a batch norm,
// a bottleneck block, the whole network's layers, an activation slot), batch norm's constants, and the
// helpers more than one of the files uses. Only trainer/model/resnet50*.cpp include it.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "trainer/model/resnet50.hpp"

namespace wb::model {

using backend::Shape;
using backend::Tensor;

// ---- layer records --------------------------------------------------------------------------------

struct ResNet50::Conv {
  int module = -1;
  int param = -1;
  backend::Conv2dParams p;
  Tensor w, dw;  // views of the parameter / gradient buffers, OIHW
  Tensor y, dx;  // output (N, O, OH, OW) and input gradient
};

struct ResNet50::Bn {
  int module = -1;
  int param = -1;  // gamma; beta is param + 1
  int nbt = -1;    // index into num_batches_tracked_
  Tensor gamma, beta, dgamma, dbeta, rmean, rvar;
  backend::BatchNormState state;
  Tensor y;        // output; after the relu (in place or fused) when one follows
  Tensor dx;       // input gradient
  Tensor relu_dx;  // gradient before the bn when its relu runs unfused
  // SyncBatchNorm: the sums exchanged with the group ([sum x | sum x^2 | count] forward, [sum dy |
  // sum dy (x - mean)] backward), the whole batch's statistics and its count per channel.
  std::vector<double> sums, mean, var;
  std::int64_t count = 0;
};

struct ResNet50::Block {
  int module = -1;
  int relu_module = -1;
  std::array<std::string, 3> relu_names;
  bool ds = false;
  Conv c1, c2, c3, dc;
  Bn b1, b2, b3, db;
  Tensor out;    // relu(bn3 + identity)
  Tensor d_sum;  // gradient at the residual sum
};

struct ResNet50::Layers {
  Conv conv1;
  Bn bn1;
  int relu_module = -1, maxpool_module = -1, avgpool_module = -1, fc_module = -1, fc_param = -1;
  Tensor mp_y, mp_ws, mp_dx;
  std::vector<Block> blocks;
  Tensor fc_w, fc_b, fc_dw, fc_db;
  Tensor gap_y;    // (N, 2048, 1, 1)
  Tensor gap_dx;   // (N, 2048, 1, 1) plain, from the fc backward
  Tensor head_dx;  // gradient of layer4's output
  std::vector<int> kinds;  // per parameter: what init it gets
  std::vector<StateEntry> state;
};

// One activation slot's state while another slot is in use (see use_slot).
struct ResNet50::Slot {
  std::unique_ptr<Layers> layers;
  Tensor logits, loss, probs, dlogits, input_ref, label_ref, units_dx;
  float last_loss = 0.0f;
  bool have_forward = false, fused = false, emit = false;
  int units_first = 0, units_end = 0;
};

// The sharded classifier's buffers (resnet50_fc_shard.cpp).
struct ResNet50::ShardedFc {
  std::vector<float> mine, all;          // this rank's features and labels; the group's
  std::vector<float> features;           // the group's features (N * B, F)
  std::vector<std::int32_t> labels;      // the group's labels
  std::vector<float> z, probs, dz, dx;   // logits slice, its softmax, its gradient; the group's feature gradient
  std::vector<double> max, sum, target;  // per group row; target holds [labelled logit, sum of logits]
  Tensor x, dx_t, full_logits;           // features (N * B, F, 1, 1); their gradient; own rows' full logits
};

namespace detail {

inline constexpr float kBnEps = 1e-5f;
inline constexpr float kBnMomentum = 0.1f;

// The whole of `t` on the host.
std::vector<float> whole(backend::Backend& be, const Tensor& t);
// The module names in id order (layout::modules()'s).
const std::vector<std::string>& names_table();

}  // namespace detail

}  // namespace wb::model
