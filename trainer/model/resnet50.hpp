#pragma once
// ResNet-50 v1.5, exactly torchvision.models.resnet50: stride on each bottleneck's 3x3 conv, downsample
// = 1x1 conv + batch norm, torchvision's parameter names, order and initialisation, any input size from
// 32 to 224 and any number of classes. The batch size is fixed at construction so that every tensor is
// allocated once.
//
// Parameters, gradients and momentum each live in ONE plain float buffer, laid out in forward order as
// described by params() (torchvision layouts: OIHW conv weights, [out, in] fc weight), so a gradient
// bucket is a slice, a checkpoint or dump is a copy. Running statistics live in one float buffer too;
// num_batches_tracked counters are int64 on the host.
//
// A training step:   model.forward(images, labels) -> loss;  model.backward();  sgd.step(model, lr);

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "layout/resnet50.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/backend/memory.hpp"
#include "trainer/model/batch_norm_sync.hpp"
#include "trainer/model/fc_shard.hpp"
#include "trainer/model/observer.hpp"

namespace wb::model {

// Bad model configuration or inputs of the wrong size; the message names the setting and what was expected.
class ModelError : public std::runtime_error {
 public:
  explicit ModelError(const std::string& what) : std::runtime_error(what) {}
};

// Trainable parameter tensors, whatever the classes and input size (torchvision's 161): what
// --allreduce-split's points index, known before a model is built.
inline constexpr int kParamTensors = layout::kParamTensors;

struct ModelConfig {
  int num_classes = 10;
  int image_size = 32;   // square inputs, 32..224
  int batch_size = 32;
  std::uint64_t seed = 0;
  backend::LossParams loss{};
  // Free each activation gradient once backward has consumed it, and each activation once every op
  // reading it has been differentiated (the residual sums' summands right after forward), instead of
  // keeping one of each per layer for the next step: -1 (default) where the backend reallocates for
  // next to nothing (Backend::cheap_reallocation: the CPU and CUDA backends), 0 never, 1 always.
  int free_consumed_grads = -1;
  // The sharded classifier (fc_shard.hpp): this model holds the rows [fc_shard * K/fc_shards, ...) of
  // fc.weight and fc.bias only, and its forward and backward run through an FcShard (set_fc_shard).
  // num_classes must be divisible by fc_shards. 1: the whole classifier.
  int fc_shards = 1;
  int fc_shard = 0;
};

struct ParamInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset, numel;
  bool decay;  // weight decay applies (conv and fc weights; not batch-norm gamma/beta nor biases)
};

struct BufferInfo {
  std::string name;  // "<bn>.running_mean", "<bn>.running_var", "<bn>.num_batches_tracked"
  std::vector<std::int64_t> shape;
  backend::DType dtype;  // f32: offset into running_stats(); i64: offset into num_batches_tracked()
  std::size_t offset, numel;
};

// One entry of torchvision's state_dict, in its order: a parameter or a buffer.
struct StateEntry {
  std::string name;
  bool is_param;
  std::size_t index;  // into params() or buffers()
};

class ResNet50 {
 public:
  ResNet50(backend::Backend& backend, const ModelConfig& config);
  ~ResNet50();
  ResNet50(const ResNet50&) = delete;
  ResNet50& operator=(const ResNet50&) = delete;

  // ---- the step -----------------------------------------------------------------------------------
  // images: plain NCHW (batch, 3, S, S); labels in [0, num_classes). Returns the mean loss.
  float forward(std::span<const float> images, std::span<const std::int32_t> labels);
  // The same from backend tensors: images f32 (batch, 3, S, S) plain, labels i32 (batch).
  float forward(const backend::Tensor& images, const backend::Tensor& labels);
  // Gradients of the last forward's loss into grad_buffer() (overwritten, not accumulated).
  void backward();
  // Training mode (default) normalises with batch statistics and updates the running ones; eval mode
  // uses the running statistics, like torch's module.eval().
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  void set_observer(ModelObserver* observer) { observer_ = observer; }
  ModelObserver* observer() const { return observer_; }
  // SyncBatchNorm: training forwards and backwards take each batch norm's statistics over the group
  // `sync` sums over (null: this process's batch alone, the default).
  void set_batchnorm_sync(BatchNormSync* sync) { bn_sync_ = sync; }
  // Batch norm and its ReLU run fused wherever outputs are not observed (dumps observe them).
  // The sharded classifier's group (required when config().fc_shards > 1). With it, forward's loss is
  // the mean over this rank's own rows, and backward leaves in fc's gradients the slice's gradient
  // averaged over FcShard::replicas() ranks, as the data-parallel allreduce leaves the others.
  void set_fc_shard(FcShard* shard) { fc_shard_ = shard; }
  bool fc_sharded() const { return config_.fc_shards > 1; }

  // ---- parameters and buffers -----------------------------------------------------------------------
  const std::vector<ParamInfo>& params() const { return params_; }                 // kParamTensors, forward order
  const std::vector<backend::ParamSegment>& segments() const { return segments_; }  // same order
  std::size_t param_count() const { return param_count_; }                          // total elements
  const backend::Tensor& param_buffer() const { return param_buf_; }
  const backend::Tensor& grad_buffer() const { return grad_buf_; }
  const backend::Tensor& momentum_buffer() const { return momentum_buf_; }
  const std::vector<BufferInfo>& buffers() const { return buffers_; }  // state_dict order
  const backend::Tensor& running_stats() const { return stats_buf_; }
  std::span<std::int64_t> num_batches_tracked() { return num_batches_tracked_; }
  std::span<const std::int64_t> num_batches_tracked() const { return num_batches_tracked_; }
  std::vector<StateEntry> state_dict() const;
  int param_index(std::string_view name) const;   // -1 when unknown
  int buffer_index(std::string_view name) const;  // -1 when unknown
  // Host copies (plain, torchvision layout) of a whole buffer.
  std::vector<float> params_to_host() const;
  std::vector<float> grads_to_host() const;
  std::vector<float> momentum_to_host() const;
  std::vector<float> running_stats_to_host() const;
  void params_from_host(std::span<const float> values);
  void running_stats_from_host(std::span<const float> values);
  // The parameter table of the whole model, torchvision's (fc at its full K rows), and host copies of
  // a parameter-sized buffer (param_buffer(), grad_buffer(), momentum_buffer()) laid out by it. With a
  // sharded classifier full_to_host gathers every member's slice: a collective over the shard group,
  // which every member calls. Unsharded, these are params() and a plain copy.
  std::vector<ParamInfo> full_params() const;
  std::vector<float> full_to_host(const backend::Tensor& buffer) const;
  // This model's part (params() layout) of values laid out by full_params().
  std::vector<float> slice_of_full(std::span<const float> full) const;

  // ---- outputs and names ----------------------------------------------------------------------------
  const backend::Tensor& logits() const { return logits_; }  // (batch, num_classes) plain
  std::vector<float> logits_to_host() const;
  // torchvision module names in first-call order, then "loss" and "optimizer".
  static std::span<const std::string> module_names();
  static int loss_module_id();
  static int optimizer_module_id();
  const ModelConfig& config() const { return config_; }
  backend::Backend& compute_backend() const { return backend_; }

  // ---- pipeline stages --------------------------------------------------------------------------------
  // The network as a chain of units a pipeline stage takes a run of: unit 0 is the head (conv1, bn1,
  // relu, maxpool), units 1..16 the bottleneck blocks layer1.0 .. layer4.2, unit 17 the tail (avgpool,
  // fc and the loss). A stage runs units [first, end).
  static constexpr int kUnits = layout::kUnits;
  static std::string unit_name(int unit);  // "head", "layer1.0", ..., "layer4.2", "fc"
  // Forward-ordered parameters [first, end) of units [first_unit, end_unit).
  std::pair<int, int> unit_params(int first_unit, int end_unit) const;
  // Running statistics (floats of running_stats()) and num_batches_tracked entries of those units.
  std::pair<std::size_t, std::size_t> unit_stats(int first_unit, int end_unit) const;
  std::pair<std::size_t, std::size_t> unit_batch_counters(int first_unit, int end_unit) const;

  // Gradient scratch: backward writes each module's gradients into a second buffer and reports them
  // with on_grads_ready as usual; whoever watches accumulates them into grad_buffer() (micro-batches).
  // Call before set_activation_slots.
  void use_gradient_scratch();
  const backend::Tensor& gradient_scratch() const { return scratch_buf_; }
  // Activation slots: n independent sets of activations sharing parameters, gradients and statistics,
  // so that n micro-batches can be in flight between their forward and their backward. Slot 0 is the
  // one forward() and backward() use.
  void set_activation_slots(int n);
  void use_slot(int slot);
  int activation_slots() const;
  // Forward of units [first, end) on the current slot. `x` is the images (f32 plain NCHW) when first is
  // 0, else unit first-1's output (any layout the backend reads); `labels` (i32) is read when the tail
  // runs. Returns the loss when the tail ran, else 0.
  float forward_units(int first, int end, const backend::Tensor& x, const backend::Tensor& labels);
  // The output of the current slot's last forward_units (not the tail's).
  const backend::Tensor& units_output() const;
  // Backward of the current slot's last forward_units: `dy` is the gradient of its output (unused when
  // the tail ran). Returns the gradient of its input (undefined when it began at the head).
  const backend::Tensor& backward_units(const backend::Tensor& dy);

 private:
  struct Conv;
  struct Bn;
  struct Block;
  struct Layers;

  void build();  // register_layers, allocate_buffers, bind_views
  void register_layers();
  void allocate_buffers();
  void bind_views();
  void init_parameters();
  // Around each module: the observer's calls, and the memory tag (trainer/backend/memory.hpp) that
  // names the module as the owner of what the backend allocates inside, as an activation in forward
  // and a gradient in backward (`role` overrides: the loss's backward).
  void begin(int id, Phase phase, std::optional<backend::MemoryRole> role = std::nullopt) const {
    if (tag_depth_ < kTagDepth) tag_stack_[static_cast<std::size_t>(tag_depth_)] = backend::memory_tag();
    ++tag_depth_;
    backend::set_memory_tag({role ? *role : phase == Phase::backward ? backend::MemoryRole::gradient
                                          : phase == Phase::optimizer ? backend::MemoryRole::momentum
                                                                      : backend::MemoryRole::activation,
                             id});
    if (observer_) observer_->on_module_begin(id, phase);
  }
  void end(int id, Phase phase) const {
    if (observer_) observer_->on_module_end(id, phase);
    if (--tag_depth_ < kTagDepth) backend::set_memory_tag(tag_stack_[static_cast<std::size_t>(tag_depth_)]);
  }
  void emit(std::string_view name, const backend::Tensor& t) const {
    if (emit_) observer_->on_output(name, t);
  }
  void grads_ready(int first, int last) const {
    if (observer_) observer_->on_grads_ready(first, last);
  }
  void conv_forward(Conv& c, const backend::Tensor& x, std::string_view name);
  // Runs bn (and, when fused, its relu); emits the bn output and, unfused with relu, the relu output.
  void bn_forward(Bn& b, const backend::Tensor& x, bool relu, int relu_module, std::string_view bn_name,
                  std::string_view relu_name);
  void sync_bn_forward(Bn& b, const backend::Tensor& x, const backend::BatchNormParams& bp);
  void bn_backward(Bn& b, const backend::Tensor& x, const backend::Tensor& dy, bool relu, int relu_module);
  void conv_backward(Conv& c, const backend::Tensor& x, const backend::Tensor& dy, bool need_dx);
  void consumed(backend::Tensor& t) const;
  // The sharded classifier's forward from the features (after avgpool) and backward down to them.
  float sharded_fc_forward(const backend::Tensor& labels);
  void sharded_fc_backward();
  // The loss's backward, then the classifier's (fc.weight, fc.bias and the features' gradient).
  void loss_and_fc_backward();
  void block_forward(Block& blk, const backend::Tensor& x);
  // Returns the block's own input gradient (its c1.dx), which the caller consumes.
  backend::Tensor& block_backward(Block& blk, const backend::Tensor& x, const backend::Tensor& dy);

  static constexpr int kTagDepth = 8;
  mutable std::array<backend::MemoryTag, kTagDepth> tag_stack_{};  // the tags begin() replaced
  mutable int tag_depth_ = 0;

  backend::Backend& backend_;
  ModelConfig config_;
  ModelObserver* observer_ = nullptr;
  BatchNormSync* bn_sync_ = nullptr;
  FcShard* fc_shard_ = nullptr;
  struct ShardedFc;                      // the sharded classifier's host buffers
  std::unique_ptr<ShardedFc> sharded_;
  bool training_ = true;
  bool fused_ = false;  // the last forward fused bn + relu
  bool emit_ = false;   // the current forward calls on_output
  bool have_forward_ = false;

  std::vector<ParamInfo> params_;
  std::vector<backend::ParamSegment> segments_;
  std::vector<BufferInfo> buffers_;
  std::size_t param_count_ = 0;
  std::size_t stats_count_ = 0;
  backend::Tensor param_buf_, grad_buf_, momentum_buf_, stats_buf_;
  std::vector<std::int64_t> num_batches_tracked_;

  std::unique_ptr<Layers> layers_;
  backend::Tensor images_, labels_, logits_, loss_, probs_, dlogits_;
  backend::Tensor input_ref_, label_ref_;  // what the last forward ran on (handles, no copies)
  float last_loss_ = 0.0f;

  // Pipeline stages: the other activation slots (swapped in by use_slot), the gradient scratch.
  struct Slot;
  void swap_slot(Slot& other);
  const backend::Tensor& unit_input(int unit) const;
  std::vector<Slot> slots_;
  int slot_ = 0;
  int units_first_ = 0, units_end_ = 0;  // the current slot's last forward_units
  backend::Tensor units_dx_;             // the gradient of that forward's input (when it did not begin at 0)
  backend::Tensor scratch_buf_;
};

}  // namespace wb::model
