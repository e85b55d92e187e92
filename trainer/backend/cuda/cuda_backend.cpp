// CUDA backend core: device selection and handles, tensor allocation and views, host transfers (through
// the compute stream, then a synchronisation: the caller's host buffer is free when the call returns),
// layout and type conversions, scratch buffers, and the cache of converted weights. Weight copies are
// invalidated by a generation counter that every write into memory they were made from advances
// (sgd_update always; from_host / copy / fill when the destination overlaps cached weights;
// params_written on request).
#include "trainer/backend/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "trainer/backend/cuda/kernels.hpp"

namespace wb::backend::cuda {

void check_cublas(cublasStatus_t rc, const char* statement, const char* file, int line) {
  if (rc != CUBLAS_STATUS_SUCCESS) ::wb::cuda::throw_error("cuBLAS", statement, file, line, cublasGetStatusString(rc));
}

namespace {

kernels::Dims4 dims_of(const Shape& s) {
  if (s.rank() == 4) return {s[0], s[1], s[2], s[3]};
  return {s.numel(), 1, 1, 1};
}

// cuDNN's vectorised kernels may assume 16-byte aligned operands; views into the parameter buffers can
// start anywhere.
bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

// ---- construction -----------------------------------------------------------------------------------

CudaBackend::CudaBackend(const CudaOptions& options)
    : device_(options.device), precision_(options.precision), channels_last_(options.channels_last) {
  try {
    activate();
    WB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    WB_CUDNN_CHECK(cudnnCreate(&cudnn_));
    WB_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    WB_CUBLAS_CHECK(cublasCreate(&cublas_));
    WB_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // fp32 keeps cuBLAS off TF32 (the default math mode uses it only when asked); bf16 runs GemmEx on
    // bf16 inputs, which uses tensor cores in any mode.
    WB_CUBLAS_CHECK(cublasSetMathMode(
        cublas_, precision_ == Precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    alloc_ = CachingAllocator::create(device_);
  } catch (...) {
    if (cublas_) cublasDestroy(cublas_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (stream_) cudaStreamDestroy(stream_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  // Outstanding work may still use scratch blocks that go back to the cache below.
  if (cudaSetDevice(device_) == cudaSuccess) cudaStreamSynchronize(stream_);
  cache_.clear();
  for (auto& s : scratch_) s.block.reset();
  workspace_.block.reset();
  for (auto& m : weights_) m.clear();
  sgd_chunks_.reset();
  if (staging_host_) cudaFreeHost(staging_host_);
  if (staging_read_) cudaEventDestroy(staging_read_);
  if (cublas_) cublasDestroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (stream_) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

void CudaBackend::activate() const { WB_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaBackend::synchronize() {
  activate();
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaBackend::Stats CudaBackend::stats() const {
  Stats s;
  s.memory = alloc_->stats();
  s.algorithm_searches = algorithm_searches_;
  s.weight_conversions = weight_conversions_;
  s.input_conversions = input_conversions_;
  return s;
}

// ---- tensors ----------------------------------------------------------------------------------------

CudaTensorImpl& CudaBackend::impl(const Tensor& t) { return impl_as<CudaTensorImpl>(t, "cuda"); }

Layout CudaBackend::act_layout(const Shape& shape) const {
  if (!channels_last_ || shape.rank() != 4 || shape[2] * shape[3] == 1) return Layout::nchw;
  return Layout::nhwc;
}

Tensor CudaBackend::allocate(const Shape& shape, DType dtype, Layout layout) {
  activate();
  auto t = std::make_shared<CudaTensorImpl>();
  t->shape = shape;
  t->dtype = dtype;
  t->owner = this;
  // NHWC and NCHW are the same bytes unless a 4-D tensor has more than one spatial position.
  if (shape.rank() != 4 || shape[2] * shape[3] == 1) layout = Layout::nchw;
  t->layout = layout;
  t->plain = layout == Layout::nchw;
  t->bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  t->storage = alloc_->allocate(t->bytes);
  t->data = t->storage.get();
  return Tensor(t);
}

void CudaBackend::ensure(Tensor& t, const Shape& shape, Layout layout, DType dtype) {
  if (shape.rank() != 4 || shape[2] * shape[3] == 1) layout = Layout::nchw;
  if (t.defined()) {
    auto* p = dynamic_cast<CudaTensorImpl*>(t.impl());
    if (p && p->owner == this && p->shape == shape && p->layout == layout && p->dtype == dtype) return;
  }
  t = allocate(shape, dtype, layout);
}

Tensor CudaBackend::empty(const Shape& shape, DType dtype) { return allocate(shape, dtype, Layout::nchw); }

Tensor CudaBackend::view(const Tensor& base, std::size_t offset, const Shape& shape) {
  auto t = make_view_impl(impl(base), offset, shape, *this);
  t->layout = Layout::nchw;
  return Tensor(t);
}

void* CudaBackend::scratch(ScratchSlot slot, std::size_t bytes) {
  Scratch& s = scratch_[static_cast<std::size_t>(slot)];
  if (!s.block || s.bytes < bytes) {
    // The old block returns to the cache; work already queued on the stream finishes with it before any
    // later user of the block, which is queued behind that work.
    s.block.reset();
    s.block = alloc_->allocate(bytes, /*workspace=*/true);
    s.bytes = bytes;
  }
  return s.block.get();
}

void* CudaBackend::workspace(std::size_t bytes) {
  if (bytes == 0) return workspace_.block.get();
  if (!workspace_.block || workspace_.bytes < bytes) {
    workspace_.block.reset();
    workspace_.block = alloc_->allocate(bytes, /*workspace=*/true);
    workspace_.bytes = bytes;
  }
  return workspace_.block.get();
}

void* CudaBackend::host_staging(std::size_t bytes) {
  if (staging_pending_) {
    WB_CUDA_CHECK(cudaEventSynchronize(staging_read_));
    staging_pending_ = false;
  }
  if (!staging_read_) WB_CUDA_CHECK(cudaEventCreateWithFlags(&staging_read_, cudaEventDisableTiming));
  if (staging_bytes_ < bytes) {
    if (staging_host_) WB_CUDA_CHECK(cudaFreeHost(staging_host_));
    staging_host_ = nullptr;
    staging_bytes_ = 0;
    const std::size_t grown = std::max<std::size_t>(bytes, 4096);
    WB_CUDA_CHECK(cudaHostAlloc(&staging_host_, grown, cudaHostAllocDefault));
    staging_bytes_ = grown;
  }
  return staging_host_;
}

void CudaBackend::host_staging_issued() {
  WB_CUDA_CHECK(cudaEventRecord(staging_read_, stream_));
  staging_pending_ = true;
}

const void* CudaBackend::as_form(const Tensor& t, Layout layout, bool bf16, ScratchSlot slot) {
  auto& ti = impl(t);
  Layout want = layout;
  if (ti.shape.rank() != 4 || ti.shape[2] * ti.shape[3] == 1) want = Layout::nchw;
  if (ti.layout == want && !bf16 && aligned(ti.data)) return ti.data;
  const std::int64_t n = ti.shape.numel();
  void* dst = scratch(slot, static_cast<std::size_t>(n) * (bf16 ? 2 : 4));
  WB_CUDA_CHECK(kernels::convert(ti.data, false, ti.layout == Layout::nhwc, dst, bf16, want == Layout::nhwc,
                                 dims_of(ti.shape), stream_));
  if (ti.layout != want || !aligned(ti.data)) ++input_conversions_;
  return dst;
}

const void* CudaBackend::weights_as(const Tensor& w, Layout layout, bool bf16, WeightForm form) {
  auto& wi = impl(w);
  if (!wi.plain) throw BackendError("cuda backend: weights " + wi.shape.to_string() + " must be plain");
  if (wi.shape.rank() != 4) layout = Layout::nchw;
  if (layout == Layout::nchw && !bf16 && aligned(wi.data)) return wi.data;
  WeightCopy& wc = weights_[static_cast<std::size_t>(form)][wi.data];
  if (wc.block && wc.generation == param_generation_ && wc.layout == layout && wc.bf16 == bf16 &&
      wc.shape == wi.shape) {
    return wc.block.get();
  }
  const std::size_t bytes = static_cast<std::size_t>(wi.shape.numel()) * (bf16 ? 2 : 4);
  if (!wc.block || wc.bytes != bytes) {
    wc.block.reset();
    wc.block = alloc_->allocate(bytes, /*workspace=*/true);
    wc.bytes = bytes;
  }
  // OIHW -> OHWI is NCHW -> NHWC with (N, C, H, W) = (O, I, K, K).
  WB_CUDA_CHECK(kernels::convert(wi.data, false, false, wc.block.get(), bf16, layout == Layout::nhwc,
                                 dims_of(wi.shape), stream_));
  ++weight_conversions_;
  wc.generation = param_generation_;
  wc.layout = layout;
  wc.bf16 = bf16;
  wc.shape = wi.shape;
  const char* lo = static_cast<const char*>(wi.data);
  const char* hi = lo + wi.bytes;
  cached_lo_ = cached_lo_ ? std::min(cached_lo_, lo) : lo;
  cached_hi_ = cached_hi_ ? std::max(cached_hi_, hi) : hi;
  return wc.block.get();
}

void CudaBackend::note_write(const void* data, std::size_t bytes) {
  const char* lo = static_cast<const char*>(data);
  if (cached_lo_ && lo < cached_hi_ && lo + bytes > cached_lo_) ++param_generation_;
}

// ---- host transfers ---------------------------------------------------------------------------------

void CudaBackend::from_host(const Tensor& dst, std::span<const float> src) {
  activate();
  auto& d = impl(dst);
  check_host_transfer(dst, DType::f32, src.size(), name(), "from_host");
  note_write(d.data, d.bytes);
  if (src.empty()) return;
  if (d.plain) {
    WB_CUDA_CHECK(cudaMemcpyAsync(d.data, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream_));
  } else {
    void* staging = scratch(kScratchHost, src.size_bytes());
    WB_CUDA_CHECK(cudaMemcpyAsync(staging, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream_));
    WB_CUDA_CHECK(kernels::convert(staging, false, false, d.data, false, true, dims_of(d.shape), stream_));
  }
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::from_host(const Tensor& dst, std::span<const std::int32_t> src) {
  activate();
  auto& d = impl(dst);
  check_host_transfer(dst, DType::i32, src.size(), name(), "from_host");
  if (src.empty()) return;
  WB_CUDA_CHECK(cudaMemcpyAsync(d.data, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream_));
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::to_host(const Tensor& src, std::span<float> dst) {
  activate();
  auto& s = impl(src);
  check_host_transfer(src, DType::f32, dst.size(), name(), "to_host");
  if (dst.empty()) return;
  const void* from = s.data;
  if (!s.plain) {
    void* staging = scratch(kScratchHost, dst.size_bytes());
    WB_CUDA_CHECK(kernels::convert(s.data, false, true, staging, false, false, dims_of(s.shape), stream_));
    from = staging;
  }
  WB_CUDA_CHECK(cudaMemcpyAsync(dst.data(), from, dst.size_bytes(), cudaMemcpyDeviceToHost, stream_));
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::to_host(const Tensor& src, std::span<std::int32_t> dst) {
  activate();
  auto& s = impl(src);
  check_host_transfer(src, DType::i32, dst.size(), name(), "to_host");
  if (dst.empty()) return;
  WB_CUDA_CHECK(cudaMemcpyAsync(dst.data(), s.data, dst.size_bytes(), cudaMemcpyDeviceToHost, stream_));
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  activate();
  auto& s = impl(src);
  auto& d = impl(dst);
  check_copy(src, dst, name());
  note_write(d.data, d.bytes);
  const std::size_t bytes = static_cast<std::size_t>(s.shape.numel()) * dtype_size(s.dtype);
  if (bytes == 0) return;
  if (s.layout == d.layout) {
    if (s.data != d.data) WB_CUDA_CHECK(cudaMemcpyAsync(d.data, s.data, bytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  if (s.dtype != DType::f32) {
    throw BackendError("cuda backend copy: layout conversion of " + std::string(dtype_name(s.dtype)) +
                       " tensors is not supported");
  }
  if (s.data == d.data) throw BackendError("cuda backend copy: source and destination alias in different layouts");
  WB_CUDA_CHECK(kernels::convert(s.data, false, s.layout == Layout::nhwc, d.data, false, d.layout == Layout::nhwc,
                                 dims_of(s.shape), stream_));
}

void CudaBackend::fill(const Tensor& dst, float value) {
  activate();
  auto& d = impl(dst);
  check_dtype(dst, DType::f32, name(), "fill");
  note_write(d.data, d.bytes);
  // A constant is the same in every layout.
  WB_CUDA_CHECK(kernels::fill(static_cast<float*>(d.data), d.shape.numel(), value, stream_));
}

void CudaBackend::accumulate(const Tensor& src, float scale, const Tensor& dst, bool assign) {
  activate();
  check_accumulate(src, dst, name());
  auto& d = impl(dst);
  note_write(d.data, d.bytes);
  WB_CUDA_CHECK(kernels::accumulate(src.data_as<float>(), scale, static_cast<float*>(d.data), src.numel(), assign, stream_));
}

cudaStream_t compute_stream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) {
    throw BackendError("compute_stream: the backend is '" + std::string(backend.name()) +
                       "', not the cuda backend");
  }
  return cuda->stream();
}

}  // namespace wb::backend::cuda

namespace wb::backend {

int cuda_device_count() { return ::wb::cuda::device_count(); }

bool have_cuda_backend() { return true; }

CudaDeviceInfo cuda_device_info(int device) {
  cudaDeviceProp prop{};
  WB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return CudaDeviceInfo{prop.name, static_cast<std::int64_t>(prop.totalGlobalMem), prop.major};
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) {
  const int count = cuda_device_count();
  if (count == 0) {
    throw BackendError("cuda backend: no CUDA device (cudaGetDeviceCount found no usable device or driver); use "
                       "the cpu backend");
  }
  if (options.device < 0 || options.device >= count) {
    throw BackendError("cuda backend: device " + std::to_string(options.device) + " out of range (" +
                       std::to_string(count) + " device(s) visible, expected 0.." + std::to_string(count - 1) + ")");
  }
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace wb::backend
