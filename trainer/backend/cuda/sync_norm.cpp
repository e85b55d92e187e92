// Synchronised batch norm on the CUDA backend (--sync-bn with --device cuda). cuDNN's batch norm
// takes no outside statistics in training, so the four steps are the backend's own kernels
// (kernels.cu), in the input's layout (NCHW or NHWC):
//   batchnorm_sums               per-channel sums of x and x^2 in double, copied to the host;
//   batchnorm_forward_with_stats y = (x - mean) * invstd * gamma + beta (and the fused relu) with the
//                                group's mean and variance, and the running statistics' update;
//   batchnorm_backward_reduce    per-channel sums of dy and dy * (x - mean) in double (to the host),
//                                dgamma and dbeta of this process's part, and dx = gamma * invstd * dy;
//   batchnorm_backward_elemt     dx += a_c + b_c * x from the group's sums (torch's
//                                batch_norm_backward_elemt; see cpu/sync_norm.cpp for the algebra).
// As in cuDNN's path (norm.cpp), BatchNormState holds the mean and the inverse standard deviation
// 1 / sqrt(var + eps), and with fuse_relu the output y, whose sign masks dy.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "trainer/backend/cuda/cuda_backend.hpp"
#include "trainer/backend/cuda/kernels.hpp"

namespace wb::backend::cuda {

namespace {

kernels::Dims4 dims4(const Shape& s) { return {s[0], s[1], s[2], s[3]}; }

void check_sums(std::size_t got, std::int64_t c, const char* op) {
  if (got != static_cast<std::size_t>(2 * c)) {
    throw BackendError(std::string(op) + ": sums must hold 2C = " + std::to_string(2 * c) + " values, got " +
                       std::to_string(got));
  }
}

}  // namespace

void CudaBackend::batchnorm_sums(const Tensor& x, std::span<double> sums) {
  activate();
  const char* op = "batchnorm_sums";
  check_f32(x, 4, op, "x");
  const Shape& xs = x.shape();
  check_sums(sums.size(), xs[1], op);
  if (sums.empty()) return;
  auto* dev = static_cast<double*>(scratch(kScratchLoss, kernels::bn_sums_doubles(dims4(xs)) * sizeof(double)));
  WB_CUDA_CHECK(kernels::bn_sums(x.data_as<float>(), dims4(xs), layout_of(x) == Layout::nhwc, dev, stream_));
  WB_CUDA_CHECK(cudaMemcpyAsync(sums.data(), dev, sums.size_bytes(), cudaMemcpyDeviceToHost, stream_));
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::batchnorm_forward_with_stats(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                               const Tensor& running_mean, const Tensor& running_var,
                                               std::span<const double> mean, std::span<const double> var,
                                               std::int64_t count, BatchNormState& state, const BatchNormParams& p) {
  activate();
  const char* op = "batchnorm_forward_with_stats";
  const std::int64_t c = check_batchnorm_forward(x, gamma, beta, running_mean, running_var, op, this);
  if (mean.size() != static_cast<std::size_t>(c) || var.size() != static_cast<std::size_t>(c)) {
    throw BackendError(std::string(op) + ": mean and var must hold C = " + std::to_string(c) + " values");
  }
  if (count < 2) {
    throw BackendError(std::string(op) + ": the unbiased variance needs at least 2 values per channel over all "
                       "processes, got " + std::to_string(count));
  }
  if (!(p.eps > 0.0f)) throw BackendError(std::string(op) + ": eps must be positive, got " + std::to_string(p.eps));
  const Shape& xs = x.shape();
  const Layout layout = layout_of(x);
  // Host side, as the CPU backend rounds them: the statistics in float, the running variance's input
  // var * count / (count - 1) in float arithmetic.
  const std::size_t cu = static_cast<std::size_t>(c);
  auto* host = static_cast<float*>(host_staging(3 * cu * sizeof(float)));
  const float unbias = static_cast<float>(static_cast<double>(count) / static_cast<double>(count - 1));
  for (std::size_t i = 0; i < cu; ++i) {
    host[i] = static_cast<float>(mean[i]);
    host[cu + i] = static_cast<float>(1.0 / std::sqrt(var[i] + static_cast<double>(p.eps)));
    host[2 * cu + i] = static_cast<float>(var[i]) * unbias;
  }
  ensure(state.mean, Shape{c}, Layout::nchw);
  ensure(state.var, Shape{c}, Layout::nchw);
  const std::size_t cbytes = cu * sizeof(float);
  auto* unbiased = static_cast<float*>(scratch(kScratchOut, cbytes));
  WB_CUDA_CHECK(cudaMemcpyAsync(state.mean.data(), host, cbytes, cudaMemcpyHostToDevice, stream_));
  WB_CUDA_CHECK(cudaMemcpyAsync(state.var.data(), host + cu, cbytes, cudaMemcpyHostToDevice, stream_));
  WB_CUDA_CHECK(cudaMemcpyAsync(unbiased, host + 2 * cu, cbytes, cudaMemcpyHostToDevice, stream_));
  host_staging_issued();
  const float* xin = x.data_as<float>();  // read before y may be reallocated
  ensure(y, xs, layout);
  WB_CUDA_CHECK(kernels::bn_normalize(xin, y.data_as<float>(), state.mean.data_as<float>(),
                                      state.var.data_as<float>(), gamma.data_as<float>(), beta.data_as<float>(),
                                      dims4(xs), layout == Layout::nhwc, p.fuse_relu, stream_));
  WB_CUDA_CHECK(kernels::bn_running_update(running_mean.data_as<float>(), running_var.data_as<float>(),
                                           state.mean.data_as<float>(), unbiased, c, p.momentum, stream_));
  if (p.fuse_relu) {
    state.workspace = y;  // the relu mask is y > 0
  } else {
    state.workspace.reset();
  }
}

void CudaBackend::batchnorm_backward_reduce(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                            const BatchNormState& state, Tensor& dx, const Tensor& dgamma,
                                            const Tensor& dbeta, std::span<double> sums, const BatchNormParams& p) {
  activate();
  const char* op = "batchnorm_backward_reduce";
  const std::int64_t c = check_batchnorm_backward(x, dy, gamma, beta, dgamma, dbeta, this);
  check_sums(sums.size(), c, op);
  const Shape& xs = x.shape();
  const bool have_state = state.mean.defined() && state.var.defined() && state.mean.shape() == Shape{c} &&
                          state.var.shape() == Shape{c};
  const bool have_mask = state.workspace.defined() && state.workspace.shape() == xs;
  if (!have_state || (p.fuse_relu && !have_mask)) {
    throw BackendError(std::string(op) +
                       ": the state of batchnorm_forward_with_stats (with the same fuse_relu) is missing");
  }
  const Layout layout = layout_of(x);
  if (p.fuse_relu && layout_of(state.workspace) != layout) {
    throw BackendError(std::string(op) + ": the saved relu output is not in x's layout");
  }
  const auto* grad = static_cast<const float*>(as_form(dy, layout, false, kScratchIn));  // dy in x's layout
  const float* mask = p.fuse_relu ? state.workspace.data_as<float>() : nullptr;
  const kernels::Dims4 d = dims4(xs);
  const bool nhwc = layout == Layout::nhwc;
  auto* dev = static_cast<double*>(scratch(kScratchLoss, kernels::bn_sums_doubles(d) * sizeof(double)));
  WB_CUDA_CHECK(kernels::bn_grad_sums(x.data_as<float>(), grad, mask, state.mean.data_as<float>(), d, nhwc, dev,
                                      stream_));
  ensure(dx, xs, layout);  // dx may be dy: the sums above have read it, the local step is elementwise
  WB_CUDA_CHECK(kernels::bn_backward_local(grad, mask, dx.data_as<float>(), gamma.data_as<float>(),
                                           state.var.data_as<float>(), dev, dgamma.data_as<float>(),
                                           dbeta.data_as<float>(), d, nhwc, stream_));
  WB_CUDA_CHECK(cudaMemcpyAsync(sums.data(), dev, sums.size_bytes(), cudaMemcpyDeviceToHost, stream_));
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::batchnorm_backward_elemt(const Tensor& x, const Tensor& gamma, const BatchNormState& state,
                                           Tensor& dx, std::span<const double> sums, std::int64_t count,
                                           const BatchNormParams& p) {
  activate();
  const char* op = "batchnorm_backward_elemt";
  check_f32(x, 4, op, "x");
  const Shape& xs = x.shape();
  if (!dx.defined() || !(dx.shape() == xs) || layout_of(dx) != layout_of(x)) {
    throw BackendError(std::string(op) + ": dx must be batchnorm_backward_reduce's, of x's shape and layout");
  }
  const std::int64_t c = xs[1];
  check_sums(sums.size(), c, op);
  if (count < 1) throw BackendError(std::string(op) + ": expected a positive count, got " + std::to_string(count));
  if (!state.mean.defined() || !state.var.defined() || !(state.mean.shape() == Shape{c})) {
    throw BackendError(std::string(op) + ": the state of batchnorm_forward_with_stats is missing");
  }
  (void)p;
  auto* dev = static_cast<double*>(scratch(kScratchLoss, sums.size_bytes()));
  // The caller's `sums` may be gone before an asynchronous copy reads it: through pinned staging.
  auto* host = static_cast<double*>(host_staging(sums.size_bytes()));
  std::copy(sums.begin(), sums.end(), host);
  WB_CUDA_CHECK(cudaMemcpyAsync(dev, host, sums.size_bytes(), cudaMemcpyHostToDevice, stream_));
  host_staging_issued();
  WB_CUDA_CHECK(kernels::bn_backward_elemt(x.data_as<float>(), dx.data_as<float>(), dev, gamma.data_as<float>(),
                                           state.mean.data_as<float>(), state.var.data_as<float>(),
                                           static_cast<double>(count), dims4(xs), layout_of(x) == Layout::nhwc,
                                           stream_));
}

}  // namespace wb::backend::cuda
