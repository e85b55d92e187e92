#pragma once
// The oneDNN (v2.6) CPU backend. Activations stay in the layouts oneDNN's primitives pick (blocked
// nChw16c on AVX-512) from one layer to the next; conversions happen only at the edges: the network
// input, the classifier, to_host/from_host, and conv weights, which live plain (OIHW) in the parameter
// buffer and are converted into a blocked copy when an op needs them.
//
// Every primitive is created once per (op, shapes, layouts) and cached. Ops run one at a time, so the
// scratchpad is one buffer shared by all primitives, and the layout conversions (weight copies, inputs,
// blocked weight gradients) are slots of a few shared pools (SlotPool), each sized for its largest
// user: the backend's own memory does not grow with the depth. Primitives are executed through the C
// API with argument arrays on the stack; a step after the first allocates only what the model frees
// (the activation gradients it consumed).
//
// Files: cpu_backend.cpp (memory, caches, layout conversion), conv.cpp, norm.cpp, eltwise_pool.cpp,
// linear_loss.cpp, sgd.cpp.

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "trainer/backend/backend.hpp"
#include "trainer/backend/cache_key.hpp"
#include "trainer/backend/checks.hpp"
#include "trainer/backend/memory.hpp"

namespace wb::backend::cpu {

class CpuTensorImpl final : public TensorImpl {
 public:
  dnnl::memory::desc md;             // empty for i64 tensors, which no oneDNN primitive reads
  dnnl::memory mem;                  // wraps `data`, created once so that ops need not build one
  int layout_id = -1;                // index of md among the layouts this backend has seen
  std::shared_ptr<void> storage;     // the allocation (shared with views)
};

class BlockCache;

// The primitive cache's key: op code, shapes, layout ids and parameters.
using CacheKey = FixedKey<28>;
using CacheKeyHash = FixedKeyHash;

// A cached primitive with its descriptors; op files derive from it.
struct Entry {
  virtual ~Entry() = default;
  dnnl::memory scratch;  // wraps the shared scratchpad
  std::size_t scratch_bytes = 0;
};

// What a slot holds during one op. Every slot of one pool shares the pool's buffer, sized for the
// largest: a slot's contents live only until the next op that uses its pool, so no op may take two
// slots from one pool, and the backend holds one buffer per pool instead of one per layer.
enum class SlotPool : int {
  src,           // an input converted to the primitive's layout (x, the second summand)
  diff_dst,      // an incoming gradient converted to the primitive's layout
  weights,       // a forward convolution's weights in its blocked layout
  weights_bwd,   // a backward-data convolution's weights in its blocked layout
  diff_weights,  // a blocked weight gradient, before its conversion into the plain slice
  window,        // an input's receptive field unrolled (im2col) for a convolution with a 1x1 output
  count
};

// A view of a pool's buffer in one layout, for a cache entry (layout conversions of inputs, blocked
// weight gradients). It keeps the reorder primitive that last filled it, so a repeated conversion
// costs one comparison.
struct Slot {
  dnnl::memory::desc md;
  dnnl::memory mem;
  SlotPool pool = SlotPool::src;
  dnnl::memory::desc from;
  dnnl::reorder prim;
};

enum OpCode : std::int64_t {
  kOpConvFwd = 1, kOpConvBwdData, kOpConvBwdWeights, kOpBnTrain, kOpBnEval, kOpBnBwd, kOpReluFwd, kOpReluBwd,
  kOpAdd, kOpMaxFwd, kOpMaxBwd, kOpGapFwd, kOpGapBwd, kOpLinFwd, kOpLinBwd, kOpLinBwdWeights,
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options);
  std::string_view name() const override { return "cpu"; }
  // A freed tensor's block goes back to malloc, which hands it to the next tensor of its size.
  bool cheap_reallocation() const override { return true; }

  Tensor empty(const Shape& shape, DType dtype) override;
  Tensor view(const Tensor& base, std::size_t offset, const Shape& shape) override;
  void from_host(const Tensor& dst, std::span<const float> src) override;
  void from_host(const Tensor& dst, std::span<const std::int32_t> src) override;
  void to_host(const Tensor& src, std::span<float> dst) override;
  void to_host(const Tensor& src, std::span<std::int32_t> dst) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void accumulate(const Tensor& src, float scale, const Tensor& dst, bool assign) override;
  void synchronize() override {}
  void params_written() override { bump_param_generation(); }

  void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const Conv2dParams& p) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Shape& x_shape,
                            const Conv2dParams& p) override;
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw,
                               const Conv2dParams& p) override;

  void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                               const Tensor& running_mean, const Tensor& running_var, BatchNormState& state,
                               const BatchNormParams& p) override;
  void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                              const Tensor& running_mean, const Tensor& running_var,
                              const BatchNormParams& p) override;
  void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                          const BatchNormState& state, Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                          const BatchNormParams& p) override;

  // sync_norm.cpp
  void batchnorm_sums(const Tensor& x, std::span<double> sums) override;
  void batchnorm_forward_with_stats(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                    const Tensor& running_mean, const Tensor& running_var,
                                    std::span<const double> mean, std::span<const double> var, std::int64_t count,
                                    BatchNormState& state, const BatchNormParams& p) override;
  void batchnorm_backward_reduce(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                 const BatchNormState& state, Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                 std::span<double> sums, const BatchNormParams& p) override;
  void batchnorm_backward_elemt(const Tensor& x, const Tensor& gamma, const BatchNormState& state, Tensor& dx,
                                std::span<const double> sums, std::int64_t count, const BatchNormParams& p) override;

  void relu_forward(const Tensor& x, Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void add(const Tensor& a, const Tensor& b, Tensor& y, bool relu) override;

  void maxpool_forward(const Tensor& x, Tensor& y, Tensor& workspace, const Pool2dParams& p) override;
  void maxpool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace, Tensor& dx,
                        const Pool2dParams& p) override;
  void global_avgpool_forward(const Tensor& x, Tensor& y) override;
  void global_avgpool_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, const Tensor& dw,
                       const Tensor& db) override;

  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const LossParams& p,
                                     Tensor& loss, Tensor& probs) override;
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const LossParams& p,
                                      Tensor& dlogits) override;

  void sgd_update(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                  std::span<const ParamSegment> segments, const SgdParams& p) override;

  // Time spent converting plain weights to the primitives' layouts and blocked weight gradients back.
  struct Stats {
    std::int64_t weight_reorder_ns = 0;
    std::int64_t weight_reorders = 0;
    std::int64_t input_reorders = 0;  // activations whose layout did not match the primitive's
    std::int64_t allocations = 0;     // tensor, slot and scratchpad allocations (0 in a steady step)
  };
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // oneDNN 2.6's JIT kernels may store a whole vector register past the end of a tensor even when the
  // buffer is exactly the primitive's own descriptor's get_size(): measured, the AVX2 binary kernel
  // with an eltwise post-op on an nChw16c tensor whose last channel block holds fewer than 8 channels
  // writes 32 bytes past the end. So every allocation (tensor, slot, scratchpad) is its descriptor's
  // size rounded up to 64 bytes, then kTailSlack zeroed bytes any kernel may scribble on (one AVX-512
  // register), then a canary of kCanaryBytes that no write may reach.
  static constexpr std::size_t kTailSlack = 64;
  static constexpr std::size_t kCanaryBytes = 64;
  // The number of live allocations whose canary a write has reached: 0 unless some kernel wrote more
  // than kTailSlack bytes past its buffer. Cheap (one pass over the live allocations); tests check it
  // after every op, at every ISA.
  std::size_t damaged_guards() const;
  // Bytes of storage no tensor holds now, kept for the next tensor of the same size (blocks.hpp).
  std::size_t idle_block_bytes() const;

  // ---- helpers shared by the op files -------------------------------------------------------------
  const dnnl::engine& engine() const { return engine_; }
  static CpuTensorImpl& impl(const Tensor& t);
  static const dnnl::memory::desc& md(const Tensor& t) { return impl(t).md; }
  static dnnl::memory::desc plain_md(const Shape& shape, DType dtype = DType::f32);

  // Makes `t` a tensor of `shape` in layout `want` unless it already is one.
  void ensure(Tensor& t, const Shape& shape, const dnnl::memory::desc& want);
  Tensor allocate(const Shape& shape, DType dtype, const dnnl::memory::desc& md);
  // A slot of layout md in `pool`, growing the pool's buffer to fit it.
  Slot make_slot(const dnnl::memory::desc& md, SlotPool pool);
  // The slot's memory, pointed at its pool's buffer (which may have grown, and moved, since).
  const dnnl::memory& bind(Slot& slot);
  // t's memory if it already has layout `want`, else a conversion of t into `slot` (a view of `pool`,
  // remade when its layout differs). Valid until the next op that uses the same pool.
  const dnnl::memory& as_layout(const Tensor& t, const dnnl::memory::desc& want, Slot& slot, SlotPool pool);
  // A plain or blocked copy of weights `w` in layout `want` (cache 0 forward, 1 backward-data), in the
  // cache's pool: reused while no parameter was written and no other weights took the pool since.
  const dnnl::memory& weights_as(const Tensor& w, const dnnl::memory::desc& want, int cache);
  void reorder(const dnnl::memory& src, const dnnl::memory& dst);
  // Runs a reorder primitive on {FROM, TO} arguments.
  void reorder_raw(const dnnl::reorder& prim, const dnnl_exec_arg_t (&args)[2]);

  Entry* find(const CacheKey& key) {
    auto it = cache_.find(key);
    return it == cache_.end() ? nullptr : it->second.get();
  }
  // Stores `entry` under `key` after sizing the shared scratchpad for `pd`.
  Entry* insert(const CacheKey& key, std::unique_ptr<Entry> entry, const dnnl::primitive_desc_base& pd);
  // Runs `prim` with `args` plus the shared scratchpad.
  void execute(const dnnl::primitive& prim, Entry& entry, std::initializer_list<dnnl_exec_arg_t> args);
  dnnl::primitive_attr attr(bool relu_post_op = false) const;
  // `pd` as oneDNN chose it (its fastest implementation), or with reference kernels on
  // (CpuOptions::reference_kernels) its reference implementation ("ref:any", "bnorm_ref:any"), where the
  // primitive has one.
  template <class PD>
  PD chosen(PD pd) const {
    if (!reference_kernels_) return pd;
    const PD fastest = pd;  // holds its own implementation while the shared iterator advances
    do {
      const std::string_view impl = pd.impl_info_str(), name = impl.substr(0, impl.find(':'));
      if (name == "ref" || (name.size() > 4 && name.substr(name.size() - 4) == "_ref")) return pd;  // bnorm_ref
    } while (pd.next_impl());
    return fastest;
  }
  void bump_param_generation() { ++param_generation_; }
  // Invalidates cached weight copies when [data, data + bytes) overlaps memory they were made from.
  void note_write(const void* data, std::size_t bytes);
  // Converts src (layout slot.from) into slot, reusing the slot's reorder primitive.
  void run_slot_reorder(const dnnl::memory& src, Slot& slot);
  void apply_threads() const;
  // conv2d_backward_weights of a KxK convolution (K > 1) whose output is 1x1 (conv.cpp).
  void conv2d_backward_weights_one_output(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p);

 private:
  struct WeightCopy {
    Slot slot;
    std::uint64_t generation = 0;
  };
  struct Pool {
    std::shared_ptr<void> storage;
    std::size_t bytes = 0;
    const WeightCopy* filled_by = nullptr;  // weight pools: whose copy the buffer holds now
  };
  struct ReorderEntry {
    dnnl::memory::desc src, dst;
    dnnl::reorder prim;
  };

  struct Guard {
    std::weak_ptr<void> owner;
    std::size_t canary_offset = 0;
  };

  int layout_id(const dnnl::memory::desc& md);
  // A 64-byte aligned allocation of `bytes` with the tail slack and canary described at kTailSlack,
  // reported to the memory listener under this thread's tag (role workspace for the backend's own
  // buffers: slots, the scratchpad).
  std::shared_ptr<void> storage(std::size_t bytes, bool workspace = false);
  void grow_scratch(std::size_t bytes);

  int threads_ = 0;
  bool reference_kernels_ = false;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unordered_map<CacheKey, std::unique_ptr<Entry>, CacheKeyHash> cache_;
  std::vector<ReorderEntry> reorders_;
  std::vector<dnnl::memory::desc> layouts_;
  std::array<std::unordered_map<const void*, WeightCopy>, 2> weight_cache_;  // [0] forward, [1] backward-data
  std::array<Pool, static_cast<std::size_t>(SlotPool::count)> pools_;
  std::uint64_t param_generation_ = 1;
  const char* cached_lo_ = nullptr;  // bounds of the plain weights the caches were made from
  const char* cached_hi_ = nullptr;
  std::shared_ptr<void> scratch_;
  std::size_t scratch_bytes_ = 0;
  // Storage freed by its tensors, kept by exact size for the next tensor of that size (blocks.hpp says
  // why not malloc); shared with the storage's deleters, which may outlive the backend.
  std::shared_ptr<BlockCache> blocks_;
  std::vector<Guard> guards_;  // every allocation's canary, pruned of freed ones as it grows
  std::size_t live_guards_ = 0;

 public:
  Stats stats_;  // written by the op files
};

// Monotonic nanoseconds for the stats counters.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace wb::backend::cpu
