#pragma once
// The CUDA backend: cuDNN (legacy API) for convolution and batch norm, cuBLAS for the classifier, and
// the kernels in kernels.cu for everything else. Every op is issued on one stream (compute_stream());
// code that works on other streams (a data-prefetch queue, NCCL) orders itself against it with events.
//
// Memory comes from a caching allocator: cudaMalloc only when no cached block of the rounded size is
// free, blocks return to the cache when their last Tensor handle drops. Blocks are reused in the order
// of the compute stream, so a tensor written or read on another stream must stay referenced until that
// work is ordered before later compute-stream work (hold the handle, record an event, wait on it).
//
// Layout: activations are NCHW (plain) by default; with channels_last they are NHWC inside the backend
// (is_plain() false; a 4-D tensor with H = W = 1 has the same bytes in both and counts as plain).
// Parameters stay plain OIHW in the parameter buffer; converted copies (NHWC filters, bf16 filters) are
// cached until the next write to parameter memory through the backend (sgd_update, from_host, copy,
// fill overlapping cached weights) or params_written().
//
// Files: cuda_backend.cpp (memory, transfers, layouts, caches, factory), allocator.cpp, conv.cpp,
// norm.cpp, ops.cpp (eltwise, pooling, linear, loss, SGD), kernels.cu (the device code).

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/check.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/backend/cache_key.hpp"
#include "trainer/backend/checks.hpp"
#include "trainer/backend/memory.hpp"

namespace wb::backend::cuda {

// ---- checked vendor calls: the statement, file:line, device and the library's own message -----------
// CUDA runtime calls use WB_CUDA_CHECK (cuda/check.hpp); cuDNN and cuBLAS report the same way.
inline void check_cudnn(cudnnStatus_t rc, const char* statement, const char* file, int line) {
  if (rc != CUDNN_STATUS_SUCCESS) ::wb::cuda::throw_error("cuDNN", statement, file, line, cudnnGetErrorString(rc));
}
void check_cublas(cublasStatus_t rc, const char* statement, const char* file, int line);

#define WB_CUDNN_CHECK(call) ::wb::backend::cuda::check_cudnn((call), #call, __FILE__, __LINE__)
#define WB_CUBLAS_CHECK(call) ::wb::backend::cuda::check_cublas((call), #call, __FILE__, __LINE__)

// ---- memory ---------------------------------------------------------------------------------------

// Size-bucketed cache of device blocks. Thread-safe (the prefetch thread allocates too).
class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  struct Stats {
    std::int64_t cuda_malloc_count = 0;  // cudaMalloc calls (cache misses)
    std::int64_t cuda_malloc_bytes = 0;  // bytes obtained from cudaMalloc, all told
    std::int64_t requests = 0;           // allocate() calls
    std::int64_t in_use_bytes = 0;       // held by live handles
    std::int64_t peak_in_use_bytes = 0;  // the most in_use_bytes ever reached
    std::int64_t cached_bytes = 0;       // free in the cache
  };

  static std::shared_ptr<CachingAllocator> create(int device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A device block of at least `bytes` (256-byte aligned); its deleter returns it to the cache. The
  // rounded size is reported to the memory listener (trainer/backend/memory.hpp) under this thread's
  // tag, as role workspace for the backend's own buffers, and its return to the cache as a free.
  std::shared_ptr<void> allocate(std::size_t bytes, bool workspace = false);
  // cudaFree every cached (free) block.
  void release_cached();
  Stats stats() const;
  // Small requests round to 512 bytes, large ones to 2 MiB, so that blocks of similar tensors are shared.
  static std::size_t round_size(std::size_t bytes);

 private:
  explicit CachingAllocator(int device) : device_(device) {}
  void give_back(void* p, std::size_t rounded, std::uint64_t ticket, MemoryTag tag) noexcept;

  int device_;
  mutable std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  Stats stats_;
};

// NCHW is the plain layout; NHWC is the channels_last activation layout.
enum class Layout : std::uint8_t { nchw, nhwc };

class CudaTensorImpl final : public TensorImpl {
 public:
  Layout layout = Layout::nchw;
  std::shared_ptr<void> storage;  // the block (shared with views)
};

// The descriptor caches' key: op code, shapes and parameters.
using CacheKey = FixedKey<16>;
using CacheKeyHash = FixedKeyHash;

// A cached per-shape entry (descriptors, chosen algorithms); op files derive from it.
struct CacheEntry {
  virtual ~CacheEntry() = default;
};

// Scratch buffers, one per role inside an op; ops run one at a time on the stream, so roles are shared
// between ops and only grow (to the largest use, reached during the first step).
enum ScratchSlot : int {
  kScratchIn,       // an input converted to the compute layout/type
  kScratchIn2,      // a second converted input
  kScratchOut,      // an output in the compute layout/type before conversion back
  kScratchHost,     // plain staging for from_host / to_host of NHWC tensors
  kScratchLoss,     // per-row losses (double) and the bad-label flag
  kScratchCount
};

enum OpCode : std::int64_t { kOpConv = 1, kOpBn };

// Which converted copy of a weight tensor.
enum WeightForm : int { kWeightConv = 0, kWeightLinear = 1 };

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  std::string_view name() const override { return "cuda"; }

  Tensor empty(const Shape& shape, DType dtype) override;
  Tensor view(const Tensor& base, std::size_t offset, const Shape& shape) override;
  void from_host(const Tensor& dst, std::span<const float> src) override;
  void from_host(const Tensor& dst, std::span<const std::int32_t> src) override;
  void to_host(const Tensor& src, std::span<float> dst) override;
  void to_host(const Tensor& src, std::span<std::int32_t> dst) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, float value) override;
  void accumulate(const Tensor& src, float scale, const Tensor& dst, bool assign) override;
  void synchronize() override;
  void* native_stream() override { return static_cast<void*>(stream()); }
  // Blocks go back to the cache when the last handle drops and are reused in compute-stream order.
  bool cheap_reallocation() const override { return true; }
  void params_written() override { ++param_generation_; }

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
  // SyncBatchNorm's steps (sync_norm.cpp): the backend's own kernels, the sums through the host.
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

  struct Stats {
    CachingAllocator::Stats memory;
    std::int64_t algorithm_searches = 0;  // cudnnFind* calls (one per conv shape and direction)
    std::int64_t weight_conversions = 0;  // filters converted to NHWC / bf16 (once per parameter update)
    std::int64_t input_conversions = 0;   // inputs whose layout or type did not match the compute form
  };
  Stats stats() const;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  Precision precision() const { return precision_; }
  bool channels_last() const { return channels_last_; }

  // ---- helpers shared by the op files -------------------------------------------------------------
  static CudaTensorImpl& impl(const Tensor& t);
  // An f32 tensor of this backend with the expected rank (0: any); throws BackendError otherwise.
  void check_f32(const Tensor& t, int rank, const char* op, const char* what) const {
    backend::check_f32(t, rank, op, what, this);
  }
  // The layout 4-D activations of `shape` get (NCHW when H = W = 1, where both are the same bytes).
  Layout act_layout(const Shape& shape) const;
  static Layout layout_of(const Tensor& t) { return impl(t).layout; }
  // Makes `t` an f32 tensor of `shape` in `layout` unless it already is one.
  void ensure(Tensor& t, const Shape& shape, Layout layout, DType dtype = DType::f32);
  Tensor allocate(const Shape& shape, DType dtype, Layout layout);
  // A device buffer of at least `bytes` for `slot`, valid until the slot is next grown.
  void* scratch(ScratchSlot slot, std::size_t bytes);
  // t's data in `layout` as f32 (bf16 = false) or bf16: t itself when it already is (and 16-byte
  // aligned, as cuDNN's vectorised kernels may need), otherwise a conversion or copy into `slot`.
  const void* as_form(const Tensor& t, Layout layout, bool bf16, ScratchSlot slot);
  // Converted copy of plain weights `w`: layout (conv filters only) and bf16; cached until the next
  // parameter write. Returns w's own data when no conversion is needed and it is 16-byte aligned.
  const void* weights_as(const Tensor& w, Layout layout, bool bf16, WeightForm form);
  // The cuDNN workspace, grown to at least `bytes`.
  void* workspace(std::size_t bytes);
  // Pinned host memory of at least `bytes` for small host-to-device copies (SyncBatchNorm's statistics):
  // cudaMemcpyAsync from pageable memory may read it after the call returns, so values a function builds
  // on its stack or a caller's vector go through here. Waits until the copies issued from the previous
  // use have read it; call host_staging_issued() after issuing the copies from it.
  void* host_staging(std::size_t bytes);
  void host_staging_issued();
  // Invalidates cached weight copies when [data, data + bytes) overlaps memory they were made from.
  void note_write(const void* data, std::size_t bytes);
  // Makes this backend's device current on the calling thread.
  void activate() const;

  CacheEntry* find(const CacheKey& key) {
    auto it = cache_.find(key);
    return it == cache_.end() ? nullptr : it->second.get();
  }
  CacheEntry* insert(const CacheKey& key, std::unique_ptr<CacheEntry> entry) {
    CacheEntry* raw = entry.get();
    cache_[key] = std::move(entry);
    return raw;
  }

  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  std::int64_t algorithm_searches_ = 0;  // written by conv.cpp

 private:
  struct Scratch {
    std::shared_ptr<void> block;
    std::size_t bytes = 0;
  };
  struct WeightCopy {
    std::shared_ptr<void> block;
    std::size_t bytes = 0;
    std::uint64_t generation = 0;
    Layout layout = Layout::nchw;
    bool bf16 = false;
    Shape shape;
  };

  int device_ = 0;
  Precision precision_ = Precision::fp32;
  bool channels_last_ = false;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<CachingAllocator> alloc_;
  std::array<Scratch, kScratchCount> scratch_{};
  Scratch workspace_;
  void* staging_host_ = nullptr;  // host_staging(): pinned (cudaHostAlloc)
  std::size_t staging_bytes_ = 0;
  cudaEvent_t staging_read_ = nullptr;  // recorded after the copies from staging_host_
  bool staging_pending_ = false;
  std::unordered_map<CacheKey, std::unique_ptr<CacheEntry>, CacheKeyHash> cache_;
  std::array<std::unordered_map<const void*, WeightCopy>, 2> weights_;
  std::uint64_t param_generation_ = 1;
  const char* cached_lo_ = nullptr;  // bounds of the plain weights the copies were made from
  const char* cached_hi_ = nullptr;
  // The SGD update's per-block chunk table on the device, rebuilt when the segments change.
  std::vector<ParamSegment> sgd_segments_;
  std::shared_ptr<void> sgd_chunks_;
  std::int64_t sgd_nchunks_ = 0;
  std::int64_t weight_conversions_ = 0;
  std::int64_t input_conversions_ = 0;
};

// The stream every op of `backend` runs on. Throws BackendError when `backend` is not a CudaBackend.
cudaStream_t compute_stream(Backend& backend);

}  // namespace wb::backend::cuda

namespace wb::backend {
using cuda::compute_stream;  // also reachable as wb::backend::compute_stream
}  // namespace wb::backend
