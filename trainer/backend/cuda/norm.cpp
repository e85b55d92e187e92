// Batch normalisation on cuDNN (CUDNN_BATCHNORM_SPATIAL; the PERSISTENT variant is faster but may
// overflow on some inputs), in the input's own layout (NCHW or NHWC). cuDNN updates the running
// variance with the unbiased batch variance n / (n - 1), as torch does, and with
// exponentialAverageFactor = momentum its running update is torch's (1 - m) * running + m * batch.
//
// BatchNormState here holds cuDNN's saved mean and saved inverse standard deviation 1 / sqrt(var + eps)
// and, with fuse_relu, a handle to the output y: the relu is applied after the normalisation by our
// own kernel, and the backward masks dy by y > 0 before cuDNN's backward.
#include <string>

#include "trainer/backend/cuda/cuda_backend.hpp"
#include "trainer/backend/cuda/kernels.hpp"

namespace wb::backend::cuda {

namespace {

struct BnEntry final : CacheEntry {
  cudnnTensorDescriptor_t x = nullptr;   // x, y, dy and dx alike
  cudnnTensorDescriptor_t stat = nullptr;  // (1, C, 1, 1) float
  BnEntry() = default;
  BnEntry(const BnEntry&) = delete;
  BnEntry& operator=(const BnEntry&) = delete;
  ~BnEntry() override {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (stat) cudnnDestroyTensorDescriptor(stat);
  }
};

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL;

BnEntry& bn_entry(CudaBackend& be, const Shape& xs, Layout layout, const char* op) {
  CacheKey key;
  key.add(kOpBn).add(xs).add(static_cast<std::int64_t>(layout));
  if (auto* e = be.find(key)) return static_cast<BnEntry&>(*e);
  for (int i = 0; i < 4; ++i) {
    if (xs[i] > 0x7fffffff) throw BackendError(std::string(op) + ": input " + xs.to_string() + " exceeds cuDNN's int");
  }
  auto e = std::make_unique<BnEntry>();
  WB_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->x));
  WB_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->stat));
  WB_CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->x, layout == Layout::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                            CUDNN_DATA_FLOAT, static_cast<int>(xs[0]), static_cast<int>(xs[1]),
                                            static_cast<int>(xs[2]), static_cast<int>(xs[3])));
  WB_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(e->stat, e->x, kMode));
  return static_cast<BnEntry&>(*be.insert(key, std::move(e)));
}

void check_eps(const BatchNormParams& p, const char* op) {
  if (!(static_cast<double>(p.eps) >= CUDNN_BN_MIN_EPSILON) || !(p.eps > 0.0f)) {
    throw BackendError(std::string(op) + ": eps must be positive, got " + std::to_string(p.eps));
  }
}

}  // namespace

void CudaBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          BatchNormState& state, const BatchNormParams& p) {
  activate();
  const char* op = "batchnorm_forward_train";
  const std::int64_t c = check_batchnorm_forward(x, gamma, beta, running_mean, running_var, op, this);
  check_eps(p, op);
  const Shape& xs = x.shape();
  check_batchnorm_batch(xs, op);
  const Layout layout = layout_of(x);
  BnEntry& e = bn_entry(*this, xs, layout, op);
  const void* xin = x.data();  // read before y may be reallocated
  ensure(y, xs, layout);                                             // (N, C, H, W) in x's layout
  ensure(state.mean, Shape{c}, Layout::nchw);
  ensure(state.var, Shape{c}, Layout::nchw);
  const float one = 1.0f, zero = 0.0f;
  WB_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      cudnn_, kMode, &one, &zero, e.x, xin, e.x, y.data(), e.stat, gamma.data(), beta.data(),
      static_cast<double>(p.momentum), running_mean.data(), running_var.data(), static_cast<double>(p.eps),
      state.mean.data(), state.var.data()));
  if (p.fuse_relu) {
    WB_CUDA_CHECK(kernels::relu_forward(y.data_as<float>(), y.data_as<float>(), xs.numel(), stream_));
    state.workspace = y;  // the relu mask is y > 0
  } else {
    state.workspace.reset();
  }
}

void CudaBackend::batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                         const Tensor& running_mean, const Tensor& running_var,
                                         const BatchNormParams& p) {
  activate();
  const char* op = "batchnorm_forward_eval";
  check_batchnorm_forward(x, gamma, beta, running_mean, running_var, op, this);
  check_eps(p, op);
  const Shape& xs = x.shape();
  const Layout layout = layout_of(x);
  BnEntry& e = bn_entry(*this, xs, layout, op);
  const void* xin = x.data();
  ensure(y, xs, layout);
  const float one = 1.0f, zero = 0.0f;
  WB_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(cudnn_, kMode, &one, &zero, e.x, xin, e.x, y.data(), e.stat,
                                                         gamma.data(), beta.data(), running_mean.data(),
                                                         running_var.data(), static_cast<double>(p.eps)));
  if (p.fuse_relu) WB_CUDA_CHECK(kernels::relu_forward(y.data_as<float>(), y.data_as<float>(), xs.numel(), stream_));
}

void CudaBackend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                     const BatchNormState& state, Tensor& dx, const Tensor& dgamma,
                                     const Tensor& dbeta, const BatchNormParams& p) {
  activate();
  const char* op = "batchnorm_backward";
  const std::int64_t c = check_batchnorm_backward(x, dy, gamma, beta, dgamma, dbeta, this);
  check_eps(p, op);
  const Shape& xs = x.shape();
  const bool have_state = state.mean.defined() && state.var.defined() && state.mean.shape() == Shape{c} &&
                          state.var.shape() == Shape{c};
  const bool have_mask = state.workspace.defined() && state.workspace.shape() == xs;
  if (!have_state || (p.fuse_relu && !have_mask)) {
    throw BackendError(std::string(op) + ": the state of a training forward (with the same fuse_relu) is missing");
  }
  const Layout layout = layout_of(x);
  BnEntry& e = bn_entry(*this, xs, layout, op);
  const std::size_t bytes = static_cast<std::size_t>(xs.numel()) * sizeof(float);
  const void* grad = as_form(dy, layout, false, kScratchIn);  // dy in x's layout
  if (p.fuse_relu) {
    if (layout_of(state.workspace) != layout) {
      throw BackendError(std::string(op) + ": the saved relu output is not in x's layout");
    }
    void* masked = scratch(kScratchIn2, bytes);
    WB_CUDA_CHECK(kernels::relu_backward(state.workspace.data_as<float>(), static_cast<const float*>(grad),
                                         static_cast<float*>(masked), xs.numel(), stream_));
    grad = masked;
  } else if (dx.defined() && grad == dx.data()) {
    // cuDNN does not promise in-place backward: read dy from a copy.
    void* copy = scratch(kScratchIn2, bytes);
    WB_CUDA_CHECK(cudaMemcpyAsync(copy, grad, bytes, cudaMemcpyDeviceToDevice, stream_));
    grad = copy;
  }
  const void* xin = x.data();
  ensure(dx, xs, layout);
  const float one = 1.0f, zero = 0.0f;
  WB_CUDNN_CHECK(cudnnBatchNormalizationBackward(cudnn_, kMode, &one, &zero, &one, &zero, e.x, xin, e.x, grad, e.x,
                                                 dx.data(), e.stat, gamma.data(), dgamma.data(), dbeta.data(),
                                                 static_cast<double>(p.eps), state.mean.data(), state.var.data()));
}

}  // namespace wb::backend::cuda
