// ResNet-50 v1.5 on the Backend interface: the layer tables (names, parameter and buffer layout), the
// deterministic torchvision-style initialisation, and the training step's forward and backward, each
// module's backward next to its forward. Shapes in comments are for the ImageNet stem at input S:
// conv1 halves S, maxpool halves it again, layer2..4 each halve it in their first block.
#include "trainer/model/resnet50.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <random>

#include "trainer/backend/checks.hpp"

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

namespace {

enum ParamKind { kConvWeight, kBnGamma, kBnBeta, kFcWeight, kFcBias };

constexpr std::array<int, 4> kBlocksPerStage{3, 4, 6, 3};
constexpr std::array<int, 4> kWidth{64, 128, 256, 512};
constexpr int kExpansion = 4;
constexpr float kBnEps = 1e-5f;
constexpr float kBnMomentum = 0.1f;

std::string block_name(int stage, int index) {
  return "layer" + std::to_string(stage + 1) + "." + std::to_string(index);
}

std::vector<std::string> make_module_names() {
  std::vector<std::string> n{"conv1", "bn1", "relu", "maxpool"};
  for (int s = 0; s < 4; ++s) {
    for (int b = 0; b < kBlocksPerStage[static_cast<std::size_t>(s)]; ++b) {
      std::string p = block_name(s, b);
      for (const char* m : {".conv1", ".bn1", ".relu", ".conv2", ".bn2", ".conv3", ".bn3"}) n.push_back(p + m);
      if (b == 0) {
        n.push_back(p + ".downsample.0");
        n.push_back(p + ".downsample.1");
      }
      n.push_back(p);
    }
  }
  for (const char* m : {"avgpool", "fc", "loss", "optimizer"}) n.push_back(m);
  return n;
}

const std::vector<std::string>& names_table() {
  static const std::vector<std::string> names = make_module_names();
  return names;
}

// mt19937_64 with our own uniform and Box-Muller normal: libstdc++'s distributions are not specified
// bit for bit, these are.
class InitRng {
 public:
  explicit InitRng(std::uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    double u2 = uniform();
    double r = std::sqrt(-2.0 * std::log(u1));
    double a = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  std::mt19937_64 gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace

std::span<const std::string> ResNet50::module_names() { return names_table(); }
int ResNet50::loss_module_id() { return static_cast<int>(names_table().size()) - 2; }
int ResNet50::optimizer_module_id() { return static_cast<int>(names_table().size()) - 1; }

// ---- construction ---------------------------------------------------------------------------------

ResNet50::ResNet50(backend::Backend& backend, const ModelConfig& config)
    : backend_(backend), config_(config), layers_(std::make_unique<Layers>()) {
  if (config.num_classes < 1) {
    throw ModelError("model config: num_classes must be >= 1, got " + std::to_string(config.num_classes));
  }
  if (config.image_size < 32 || config.image_size > 224) {
    throw ModelError("model config: image_size must be in 32..224, got " + std::to_string(config.image_size));
  }
  if (config.fc_shards < 1 || config.fc_shard < 0 || config.fc_shard >= config.fc_shards ||
      config.num_classes % config.fc_shards != 0) {
    throw ModelError("model config: fc_shards " + std::to_string(config.fc_shards) + " (shard " +
                     std::to_string(config.fc_shard) + ") must divide num_classes " + std::to_string(config.num_classes));
  }
  if (config.batch_size < 1) {
    throw ModelError("model config: batch_size must be >= 1, got " + std::to_string(config.batch_size));
  }
  build();
  init_parameters();
}

ResNet50::~ResNet50() = default;

void ResNet50::build() {
  Layers& L = *layers_;
  int module = 0;
  auto add_param = [&](const std::string& name, std::vector<std::int64_t> shape, ParamKind kind) {
    std::size_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::size_t>(d);
    bool decay = kind == kConvWeight || kind == kFcWeight;
    params_.push_back({name, std::move(shape), param_count_, numel, decay});
    segments_.push_back({param_count_, numel, decay});
    L.kinds.push_back(kind);
    L.state.push_back({name, true, params_.size() - 1});
    param_count_ += numel;
    return static_cast<int>(params_.size() - 1);
  };
  auto add_conv = [&](Conv& c, const std::string& name, std::int64_t in, std::int64_t out, std::int64_t k, int stride,
                      int pad) {
    c.module = module++;
    c.param = add_param(name + ".weight", {out, in, k, k}, kConvWeight);
    c.p = {stride, pad};
  };
  auto add_bn = [&](Bn& b, const std::string& name, std::int64_t c) {
    b.module = module++;
    b.param = add_param(name + ".weight", {c}, kBnGamma);
    add_param(name + ".bias", {c}, kBnBeta);
    for (const char* s : {".running_mean", ".running_var"}) {
      buffers_.push_back({name + s, {c}, backend::DType::f32, stats_count_, static_cast<std::size_t>(c)});
      L.state.push_back({name + s, false, buffers_.size() - 1});
      stats_count_ += static_cast<std::size_t>(c);
    }
    b.nbt = static_cast<int>(num_batches_tracked_.size());
    num_batches_tracked_.push_back(0);
    buffers_.push_back({name + ".num_batches_tracked", {}, backend::DType::i64, static_cast<std::size_t>(b.nbt), 1});
    L.state.push_back({name + ".num_batches_tracked", false, buffers_.size() - 1});
  };

  add_conv(L.conv1, "conv1", 3, 64, 7, 2, 3);
  add_bn(L.bn1, "bn1", 64);
  L.relu_module = module++;
  L.maxpool_module = module++;
  std::int64_t in = 64;
  for (int s = 0; s < 4; ++s) {
    const std::int64_t width = kWidth[static_cast<std::size_t>(s)];
    for (int b = 0; b < kBlocksPerStage[static_cast<std::size_t>(s)]; ++b) {
      Block blk;
      const std::string p = block_name(s, b);
      const int stride = (b == 0 && s > 0) ? 2 : 1;
      add_conv(blk.c1, p + ".conv1", in, width, 1, 1, 0);
      add_bn(blk.b1, p + ".bn1", width);
      blk.relu_module = module++;
      add_conv(blk.c2, p + ".conv2", width, width, 3, stride, 1);  // v1.5: the stride sits on the 3x3
      add_bn(blk.b2, p + ".bn2", width);
      add_conv(blk.c3, p + ".conv3", width, width * kExpansion, 1, 1, 0);
      add_bn(blk.b3, p + ".bn3", width * kExpansion);
      if (b == 0) {
        blk.ds = true;
        add_conv(blk.dc, p + ".downsample.0", in, width * kExpansion, 1, stride, 0);
        add_bn(blk.db, p + ".downsample.1", width * kExpansion);
      }
      blk.module = module++;
      for (int r = 0; r < 3; ++r) blk.relu_names[static_cast<std::size_t>(r)] = p + ".relu." + std::to_string(r);
      in = width * kExpansion;
      L.blocks.push_back(std::move(blk));
    }
  }
  L.avgpool_module = module++;
  L.fc_module = module++;
  const std::int64_t fc_rows = config_.num_classes / config_.fc_shards;  // this model's slice of the classes
  L.fc_param = add_param("fc.weight", {fc_rows, in}, kFcWeight);
  add_param("fc.bias", {fc_rows}, kFcBias);
  if (module != loss_module_id()) throw std::logic_error("resnet50: module table out of step with the layers");
  if (params_.size() != static_cast<std::size_t>(kParamTensors))
    throw std::logic_error("resnet50: " + std::to_string(params_.size()) + " parameter tensors, kParamTensors says " +
                           std::to_string(kParamTensors));

  auto& be = backend_;
  using backend::MemoryRole;
  using backend::MemoryTagScope;
  const auto flat = [&](std::size_t n, MemoryRole role) {
    MemoryTagScope tag(role);
    return be.empty(Shape{static_cast<std::int64_t>(n)}, backend::DType::f32);
  };
  param_buf_ = flat(param_count_, MemoryRole::parameter);
  grad_buf_ = flat(param_count_, MemoryRole::gradient);
  momentum_buf_ = flat(param_count_, MemoryRole::momentum);
  stats_buf_ = flat(stats_count_, MemoryRole::parameter);
  be.fill(grad_buf_, 0.0f);
  be.fill(momentum_buf_, 0.0f);

  auto bind_conv = [&](Conv& c) {
    const ParamInfo& pi = params_[static_cast<std::size_t>(c.param)];
    c.w = be.view(param_buf_, pi.offset, Shape(pi.shape));
    c.dw = be.view(grad_buf_, pi.offset, Shape(pi.shape));
  };
  auto bind_bn = [&](Bn& b) {
    const ParamInfo& g = params_[static_cast<std::size_t>(b.param)];
    const ParamInfo& bt = params_[static_cast<std::size_t>(b.param + 1)];
    b.gamma = be.view(param_buf_, g.offset, Shape(g.shape));
    b.beta = be.view(param_buf_, bt.offset, Shape(bt.shape));
    b.dgamma = be.view(grad_buf_, g.offset, Shape(g.shape));
    b.dbeta = be.view(grad_buf_, bt.offset, Shape(bt.shape));
    const BufferInfo& rm = buffers_[static_cast<std::size_t>(buffer_index(g.name.substr(0, g.name.size() - 7) +
                                                                          ".running_mean"))];
    b.rmean = be.view(stats_buf_, rm.offset, Shape(rm.shape));
    b.rvar = be.view(stats_buf_, rm.offset + rm.numel, Shape(rm.shape));
  };
  bind_conv(L.conv1);
  bind_bn(L.bn1);
  for (Block& blk : L.blocks) {
    for (Conv* c : {&blk.c1, &blk.c2, &blk.c3}) bind_conv(*c);
    for (Bn* b : {&blk.b1, &blk.b2, &blk.b3}) bind_bn(*b);
    if (blk.ds) {
      bind_conv(blk.dc);
      bind_bn(blk.db);
    }
  }
  const ParamInfo& fw = params_[static_cast<std::size_t>(L.fc_param)];
  const ParamInfo& fb = params_[static_cast<std::size_t>(L.fc_param + 1)];
  L.fc_w = be.view(param_buf_, fw.offset, Shape(fw.shape));
  L.fc_b = be.view(param_buf_, fb.offset, Shape(fb.shape));
  L.fc_dw = be.view(grad_buf_, fw.offset, Shape(fw.shape));
  L.fc_db = be.view(grad_buf_, fb.offset, Shape(fb.shape));

  const std::int64_t n = config_.batch_size, s = config_.image_size;
  MemoryTagScope batch_tag(MemoryRole::data);
  images_ = be.empty(Shape{n, 3, s, s}, backend::DType::f32);
  labels_ = be.empty(Shape{n}, backend::DType::i32);
}

void ResNet50::init_parameters() {
  InitRng rng(config_.seed);
  std::vector<float> host(param_count_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_[i];
    float* dst = host.data() + p.offset;
    switch (layers_->kinds[i]) {
      case kConvWeight: {  // kaiming_normal_(mode="fan_out", nonlinearity="relu")
        const double fan_out = static_cast<double>(p.shape[0] * p.shape[2] * p.shape[3]);
        const double std = std::sqrt(2.0 / fan_out);
        for (std::size_t k = 0; k < p.numel; ++k) dst[k] = static_cast<float>(rng.normal() * std);
        break;
      }
      case kBnGamma: std::fill_n(dst, p.numel, 1.0f); break;
      case kBnBeta: std::fill_n(dst, p.numel, 0.0f); break;
      case kFcWeight:
      case kFcBias: {  // nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias
        // Drawn for all K rows, so that a shard holds the rows of the whole classifier's init.
        const double bound = 1.0 / std::sqrt(static_cast<double>(params_[static_cast<std::size_t>(layers_->fc_param)].shape[1]));
        const std::size_t first = p.numel * static_cast<std::size_t>(config_.fc_shard);
        const std::size_t all = p.numel * static_cast<std::size_t>(config_.fc_shards);
        for (std::size_t k = 0; k < all; ++k) {
          const float v = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
          if (k >= first && k < first + p.numel) dst[k - first] = v;
        }
        break;
      }
    }
  }
  backend_.from_host(param_buf_, host);
  std::vector<float> stats(stats_count_);
  for (const BufferInfo& b : buffers_) {
    if (b.dtype != backend::DType::f32) continue;
    bool var = b.name.ends_with(".running_var");
    std::fill_n(stats.data() + b.offset, b.numel, var ? 1.0f : 0.0f);
  }
  backend_.from_host(stats_buf_, stats);
}

// ---- state access ---------------------------------------------------------------------------------

std::vector<StateEntry> ResNet50::state_dict() const { return layers_->state; }

int ResNet50::param_index(std::string_view name) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

int ResNet50::buffer_index(std::string_view name) const {
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {
std::vector<float> whole(backend::Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  be.to_host(t, v);
  return v;
}
}  // namespace

std::vector<float> ResNet50::params_to_host() const { return whole(backend_, param_buf_); }
std::vector<float> ResNet50::grads_to_host() const { return whole(backend_, grad_buf_); }
std::vector<float> ResNet50::momentum_to_host() const { return whole(backend_, momentum_buf_); }

// fc.weight and fc.bias are the last two parameters: the full table differs from params() in their
// shapes and fc.bias's offset only.
std::vector<ParamInfo> ResNet50::full_params() const {
  std::vector<ParamInfo> full = params_;
  const auto n = static_cast<std::size_t>(config_.fc_shards);
  ParamInfo& w = full[static_cast<std::size_t>(layers_->fc_param)];
  ParamInfo& b = full[static_cast<std::size_t>(layers_->fc_param) + 1];
  w.shape[0] = b.shape[0] = config_.num_classes;
  w.numel *= n;
  b.numel *= n;
  b.offset = w.offset + w.numel;
  return full;
}

std::vector<float> ResNet50::full_to_host(const Tensor& buffer) const {
  std::vector<float> local = whole(backend_, buffer);
  if (!fc_sharded()) return local;
  if (!fc_shard_) throw ModelError("full_to_host: a sharded classifier needs its FcShard (set_fc_shard)");
  const ParamInfo& w = params_[static_cast<std::size_t>(layers_->fc_param)];
  const std::size_t slice = w.numel + params_.back().numel;  // one member's fc.weight and fc.bias rows
  std::vector<float> gathered(slice * static_cast<std::size_t>(config_.fc_shards));
  fc_shard_->gather(FcExchange::state, std::span<const float>(local).subspan(w.offset, slice), gathered);
  // Member s's block is [its weight rows, its bias rows]; the full layout has all weight rows, then all biases.
  std::vector<float> full(local.begin(), local.begin() + static_cast<std::ptrdiff_t>(w.offset));
  full.resize(w.offset + slice * static_cast<std::size_t>(config_.fc_shards));
  const std::size_t bias_at = w.offset + w.numel * static_cast<std::size_t>(config_.fc_shards);
  for (std::size_t m = 0; m < static_cast<std::size_t>(config_.fc_shards); ++m) {
    const float* block = gathered.data() + m * slice;
    std::copy(block, block + w.numel, full.begin() + static_cast<std::ptrdiff_t>(w.offset + m * w.numel));
    std::copy(block + w.numel, block + slice,
              full.begin() + static_cast<std::ptrdiff_t>(bias_at + m * params_.back().numel));
  }
  return full;
}

std::vector<float> ResNet50::slice_of_full(std::span<const float> full) const {
  const std::vector<ParamInfo> table = full_params();
  const ParamInfo& last = table.back();
  if (full.size() != last.offset + last.numel) {
    throw ModelError("slice_of_full: " + std::to_string(full.size()) + " values, expected " +
                     std::to_string(last.offset + last.numel));
  }
  std::vector<float> local(param_count_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    // A slice's rows are contiguous in both fc tensors: the part at fc_shard * (its numel).
    const std::size_t from = table[i].offset + (table[i].numel == params_[i].numel
                                                    ? 0
                                                    : params_[i].numel * static_cast<std::size_t>(config_.fc_shard));
    std::copy_n(full.begin() + static_cast<std::ptrdiff_t>(from), params_[i].numel,
                local.begin() + static_cast<std::ptrdiff_t>(params_[i].offset));
  }
  return local;
}
std::vector<float> ResNet50::running_stats_to_host() const { return whole(backend_, stats_buf_); }
std::vector<float> ResNet50::logits_to_host() const {
  if (!logits_.defined()) throw ModelError("logits_to_host: no forward has run yet");
  return whole(backend_, logits_);
}

void ResNet50::params_from_host(std::span<const float> values) {
  if (values.size() != param_count_) {
    throw ModelError("params_from_host: expected " + std::to_string(param_count_) + " values, got " +
                     std::to_string(values.size()));
  }
  backend_.from_host(param_buf_, values);
}

void ResNet50::running_stats_from_host(std::span<const float> values) {
  if (values.size() != stats_count_) {
    throw ModelError("running_stats_from_host: expected " + std::to_string(stats_count_) + " values, got " +
                     std::to_string(values.size()));
  }
  backend_.from_host(stats_buf_, values);
}

// ---- forward --------------------------------------------------------------------------------------

void ResNet50::conv_forward(Conv& c, const Tensor& x, std::string_view name) {
  begin(c.module, Phase::forward);
  backend_.conv2d_forward(x, c.w, c.y, c.p);
  end(c.module, Phase::forward);
  emit(name, c.y);
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
  emit(blk.relu_names[2], blk.out);
  end(blk.module, Phase::forward);
  emit(names[static_cast<std::size_t>(blk.module)], blk.out);
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

struct ResNet50::ShardedFc {
  std::vector<float> mine, all;          // this rank's features and labels; the group's
  std::vector<float> features;           // the group's features (N * B, F)
  std::vector<std::int32_t> labels;      // the group's labels
  std::vector<float> z, probs, dz, dx;   // logits slice, its softmax, its gradient; the group's feature gradient
  std::vector<double> max, sum, target;  // per group row; target holds [labelled logit, sum of logits]
  Tensor x, dx_t, full_logits;           // features (N * B, F, 1, 1); their gradient; own rows' full logits
};

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

// ---- backward -------------------------------------------------------------------------------------

// Drops an activation gradient that has been consumed, where the backend makes that free (a caching
// allocator ordered on the op queue reuses the block for the next gradient of the same size): only a
// few such gradients are then alive at once instead of one per layer, which roughly halves the
// activation memory of a training step. On other backends the tensors are kept for the next step.
void ResNet50::consumed(Tensor& t) const {
  const bool free = config_.free_consumed_grads < 0 ? backend_.cheap_reallocation() : config_.free_consumed_grads > 0;
  if (free) t = Tensor();
}

void ResNet50::conv_backward(Conv& c, const Tensor& x, const Tensor& dy, bool need_dx) {
  begin(c.module, Phase::backward);
  backend_.conv2d_backward_weights(x, dy, c.dw, c.p);
  grads_ready(c.param, c.param + 1);
  if (need_dx) backend_.conv2d_backward_data(dy, c.w, c.dx, x.shape(), c.p);
  end(c.module, Phase::backward);
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

const Tensor& ResNet50::block_backward(Block& blk, const Tensor& x, const Tensor& dy) {
  begin(blk.module, Phase::backward);
  begin(blk.relu_module, Phase::backward);
  backend_.relu_backward(blk.out, dy, blk.d_sum);
  end(blk.relu_module, Phase::backward);
  // The downsample branch first: its parameters come last in forward order, so gradients become ready
  // in strictly decreasing index order.
  const Tensor* d_identity = &blk.d_sum;
  if (blk.ds) {
    bn_backward(blk.db, blk.dc.y, blk.d_sum, false, -1);
    conv_backward(blk.dc, x, blk.db.dx, true);
    consumed(blk.db.dx);
    d_identity = &blk.dc.dx;
  }
  bn_backward(blk.b3, blk.c3.y, blk.d_sum, false, -1);
  if (blk.ds) consumed(blk.d_sum);
  conv_backward(blk.c3, blk.b2.y, blk.b3.dx, true);
  consumed(blk.b3.dx);
  bn_backward(blk.b2, blk.c2.y, blk.c3.dx, true, blk.relu_module);
  consumed(blk.c3.dx);
  conv_backward(blk.c2, blk.b1.y, blk.b2.dx, true);
  consumed(blk.b2.dx);
  bn_backward(blk.b1, blk.c1.y, blk.c2.dx, true, blk.relu_module);
  consumed(blk.c2.dx);
  conv_backward(blk.c1, x, blk.b1.dx, true);
  consumed(blk.b1.dx);
  backend_.add(blk.c1.dx, *d_identity, blk.c1.dx, false);  // both paths reach the block input
  consumed(blk.ds ? blk.dc.dx : blk.d_sum);
  end(blk.module, Phase::backward);
  return blk.c1.dx;
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
    Tensor& dx = const_cast<Tensor&>(block_backward(L.blocks[i], x, *d));  // the block's own c1.dx
    consumed(*d);  // the block's relu backward has read the gradient of its output
    d = &dx;
  }
  const backend::Pool2dParams mp{3, 2, 1};
  begin(L.maxpool_module, Phase::backward);
  backend_.maxpool_backward(L.bn1.y, L.mp_y, *d, L.mp_ws, L.mp_dx, mp);
  end(L.maxpool_module, Phase::backward);
  consumed(*d);
  bn_backward(L.bn1, L.conv1.y, L.mp_dx, true, L.relu_module);
  consumed(L.mp_dx);
  conv_backward(L.conv1, input_ref_, L.bn1.dx, false);  // no gradient for the images
  consumed(L.bn1.dx);
  have_forward_ = false;
}


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
  if (unit == 0) return "head";
  if (unit == kUnits - 1) return "fc";
  int b = unit - 1;
  for (int s = 0; s < 4; ++s) {
    if (b < kBlocksPerStage[static_cast<std::size_t>(s)]) return block_name(s, b);
    b -= kBlocksPerStage[static_cast<std::size_t>(s)];
  }
  return {};
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
