// ResNet-50 v1.5 on the Backend interface: the model built from its layout (layout/resnet50.hpp: names,
// parameter and buffer tables), the deterministic torchvision-style initialisation, and access to its
// state. The training step is in resnet50_ops.cpp (each op's forward next to its backward), the sharded
// classifier in resnet50_fc_shard.cpp and the pipeline units in resnet50_units.cpp; the layer records
// they share are in resnet50_layers.hpp. Shapes in comments are for the ImageNet stem at input S: conv1
// halves S, maxpool halves it again, layer2..4 each halve it in their first block.
#include "trainer/model/resnet50.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <random>

#include "layout/resnet50.hpp"
#include "trainer/backend/checks.hpp"
#include "trainer/model/resnet50_layers.hpp"

namespace wb::model {

namespace {

enum ParamKind { kConvWeight, kBnGamma, kBnBeta, kFcWeight, kFcBias };

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

namespace detail {

std::vector<float> whole(backend::Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  be.to_host(t, v);
  return v;
}

const std::vector<std::string>& names_table() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const layout::Module& m : layout::modules()) n.push_back(m.name);
    return n;
  }();
  return names;
}

}  // namespace detail

using detail::names_table;
using detail::whole;

std::span<const std::string> ResNet50::module_names() { return names_table(); }
int ResNet50::loss_module_id() { return layout::loss_module(); }
int ResNet50::optimizer_module_id() { return layout::optimizer_module(); }

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
  register_layers();
  allocate_buffers();
  bind_views();
}

// Every module of the layout in forward order: its record, its id, its parameters and buffers (their
// offsets into the flat buffers allocated next).
void ResNet50::register_layers() {
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

  // Every module of the layout in forward order: its record, its parameters, its id (module++).
  Block* blk = nullptr;
  auto conv_record = [&](const layout::Module& m) -> Conv& {
    if (m.stage < 0) return L.conv1;
    switch (m.part) {
      case layout::Part::conv1: return blk->c1;
      case layout::Part::conv2: return blk->c2;
      case layout::Part::conv3: return blk->c3;
      default: return blk->dc;
    }
  };
  auto bn_record = [&](const layout::Module& m) -> Bn& {
    if (m.stage < 0) return L.bn1;
    switch (m.part) {
      case layout::Part::bn1: return blk->b1;
      case layout::Part::bn2: return blk->b2;
      case layout::Part::bn3: return blk->b3;
      default: return blk->db;
    }
  };
  std::int64_t channels = 0;
  for (const layout::Module& m : layout::modules()) {
    if (m.stage >= 0 && m.part == layout::Part::conv1) {
      L.blocks.emplace_back();
      blk = &L.blocks.back();
      for (int r = 0; r < 3; ++r) {
        blk->relu_names[static_cast<std::size_t>(r)] = layout::block_name(m.stage, m.block) + ".relu." + std::to_string(r);
      }
    }
    switch (m.kind) {
      case layout::ModuleKind::conv: {
        const layout::Conv& g = layout::convs()[static_cast<std::size_t>(m.conv)];
        add_conv(conv_record(m), m.name, g.in, g.out, g.kernel, g.stride, g.pad);
        channels = g.out;
        if (m.part == layout::Part::downsample_conv) blk->ds = true;
        break;
      }
      case layout::ModuleKind::batch_norm: add_bn(bn_record(m), m.name, channels); break;
      case layout::ModuleKind::relu: (m.stage < 0 ? L.relu_module : blk->relu_module) = module++; break;
      case layout::ModuleKind::maxpool: L.maxpool_module = module++; break;
      case layout::ModuleKind::block: blk->module = module++; break;
      case layout::ModuleKind::avgpool:
      case layout::ModuleKind::fc:
      case layout::ModuleKind::loss:
      case layout::ModuleKind::optimizer: break;
    }
    if (m.kind == layout::ModuleKind::avgpool) break;
  }
  const std::int64_t in = channels;
  L.avgpool_module = module++;
  L.fc_module = module++;
  const std::int64_t fc_rows = config_.num_classes / config_.fc_shards;  // this model's slice of the classes
  L.fc_param = add_param("fc.weight", {fc_rows, in}, kFcWeight);
  add_param("fc.bias", {fc_rows}, kFcBias);
  if (module != loss_module_id()) throw std::logic_error("resnet50: module table out of step with the layers");
  if (params_.size() != static_cast<std::size_t>(kParamTensors))
    throw std::logic_error("resnet50: " + std::to_string(params_.size()) + " parameter tensors, kParamTensors says " +
                           std::to_string(kParamTensors));
}

// One flat buffer each for the parameters, their gradients, the momentum and the running statistics, and
// the batch's images and labels.
void ResNet50::allocate_buffers() {
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
  const std::int64_t n = config_.batch_size, s = config_.image_size;
  MemoryTagScope batch_tag(MemoryRole::data);
  images_ = be.empty(Shape{n, 3, s, s}, backend::DType::f32);
  labels_ = be.empty(Shape{n}, backend::DType::i32);
}

// Each layer's weights, gradients and statistics as views into the flat buffers.
void ResNet50::bind_views() {
  Layers& L = *layers_;
  auto& be = backend_;
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

}  // namespace wb::model
