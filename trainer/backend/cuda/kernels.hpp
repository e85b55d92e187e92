#pragma once
// Launchers of the CUDA backend's own kernels (kernels.cu). Each enqueues on `stream` and returns the
// launch status (cudaGetLastError), which the caller checks with WB_CUDA_CHECK. Plain C++17 so that
// nvcc compiles the .cu file without the C++20 headers of the rest of the backend.
//
// 4-D tensors are addressed by (n, c, h, w) in NCHW or NHWC memory order; bf16 data is passed as void*
// (__nv_bfloat16 on the device side).

#include <cuda_runtime.h>

#include <cstdint>

#ifdef __CUDACC__
#define WB_HOST_DEVICE __host__ __device__
#else
#define WB_HOST_DEVICE
#endif

namespace wb::backend::cuda::kernels {

struct Dims4 {
  std::int64_t n = 1, c = 1, h = 1, w = 1;
  WB_HOST_DEVICE std::int64_t numel() const { return n * c * h * w; }
};

// dst = src with a layout change and/or an f32 <-> bf16 conversion (any of the four combinations).
// Flat data: Dims4{numel, 1, 1, 1}.
cudaError_t convert(const void* src, bool src_bf16, bool src_nhwc, void* dst, bool dst_bf16, bool dst_nhwc,
                    Dims4 d, cudaStream_t stream);

cudaError_t fill(float* dst, std::int64_t n, float value, cudaStream_t stream);

// y = max(x, 0) (NaN propagates, as torch's relu); y may equal x.
cudaError_t relu_forward(const float* x, float* y, std::int64_t n, cudaStream_t stream);
// dx = y > 0 ? dy : 0; dx may equal dy.
cudaError_t relu_backward(const float* y, const float* dy, float* dx, std::int64_t n, cudaStream_t stream);
// y = a + b, or relu(a + b); y may equal a or b.
cudaError_t add(const float* a, const float* b, float* y, std::int64_t n, bool relu, cudaStream_t stream);
// y = scale * x (assign) or y += scale * x.
cudaError_t accumulate(const float* x, float scale, float* y, std::int64_t n, bool assign, cudaStream_t stream);

// Max pooling, implicit -inf padding; argmax holds h * W + w of the chosen input per output element (in
// y's layout). Output (n, c, oh, ow) in the same layout as x.
cudaError_t maxpool_forward(const float* x, float* y, std::int32_t* argmax, Dims4 xd, std::int64_t oh,
                            std::int64_t ow, int kernel, int stride, int pad, bool nhwc, cudaStream_t stream);
// dx (x's shape and layout) gathers dy over the windows whose argmax is the element: deterministic.
cudaError_t maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, Dims4 xd, std::int64_t oh,
                             std::int64_t ow, int kernel, int stride, int pad, bool nhwc, cudaStream_t stream);

// y (n, c) = mean over h, w.
cudaError_t global_avgpool_forward(const float* x, float* y, Dims4 xd, bool nhwc, cudaStream_t stream);
// dx (n, c, h, w) = dy (n, c) / (h * w).
cudaError_t global_avgpool_backward(const float* dy, float* dx, Dims4 xd, bool nhwc, cudaStream_t stream);

// y (rows, cols) += b (cols), row-major.
cudaError_t bias_add(float* y, const float* b, std::int64_t rows, std::int64_t cols, cudaStream_t stream);
// out (cols) = sum over rows of x (rows, cols), row-major.
cudaError_t column_sums(const float* x, float* out, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// Softmax cross-entropy with smoothed targets (on for the label, off elsewhere). probs (n, k) gets the
// softmax, loss[0] the mean over rows; row_loss (n doubles) is scratch; *bad_label is set to 1 when a
// label lies outside [0, k) (it is cleared by the launcher first).
cudaError_t softmax_xent_forward(const float* logits, const std::int32_t* labels, std::int64_t n, std::int64_t k,
                                 float on, float off, float* probs, double* row_loss, float* loss, int* bad_label,
                                 cudaStream_t stream);
// dlogits = (probs - target) / n.
cudaError_t softmax_xent_backward(const float* probs, const std::int32_t* labels, std::int64_t n, std::int64_t k,
                                  float on, float off, float* dlogits, cudaStream_t stream);

// A contiguous run of elements of one parameter segment, handled by one thread block of the SGD update.
struct SgdChunk {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int32_t decay = 0;
  std::int32_t pad = 0;
};
constexpr std::int64_t kSgdChunk = 4096;  // elements per chunk (at most)

// torch.optim.SGD (dampening 0) over every chunk, one launch.
cudaError_t sgd_update(float* w, const float* g, float* buf, const SgdChunk* chunks, std::int64_t nchunks, float lr,
                       float momentum, float weight_decay, bool nesterov, bool first_step, cudaStream_t stream);

// ---- synchronised batch norm (SyncBatchNorm): per channel c of a 4-D tensor, NCHW or NHWC ----------
// The reductions accumulate in double, in a fixed order (deterministic): each channel's n*h*w values are
// cut into bn_sum_parts(d) slices, one block each (so a large batch fills the GPU, not one block per
// channel), and a second pass adds each channel's slices in order. `out` holds 2*C doubles and then the
// scratch for the slices: allocate bn_sums_doubles(d) of them.
//
// out[c] = sum of x, out[C + c] = sum of x^2, over (n, h, w).
std::int64_t bn_sum_parts(Dims4 d);
std::int64_t bn_sums_doubles(Dims4 d);
cudaError_t bn_sums(const float* x, Dims4 d, bool nhwc, double* out, cudaStream_t stream);
// out[c] = sum of g, out[C + c] = sum of g * (x - mean[c]), with g = dy, or dy where mask > 0 when mask is
// not null (a fused relu's output).
cudaError_t bn_grad_sums(const float* x, const float* dy, const float* mask, const float* mean, Dims4 d, bool nhwc,
                         double* out, cudaStream_t stream);
// y = (x - mean[c]) * invstd[c] * gamma[c] + beta[c], then max(y, 0) when relu; y may equal x.
cudaError_t bn_normalize(const float* x, float* y, const float* mean, const float* invstd, const float* gamma,
                         const float* beta, Dims4 d, bool nhwc, bool relu, cudaStream_t stream);
// running_mean = (1 - m) * running_mean + m * mean, running_var = (1 - m) * running_var + m * var (C each).
cudaError_t bn_running_update(float* running_mean, float* running_var, const float* mean, const float* var,
                              std::int64_t c, float momentum, cudaStream_t stream);
// The local half of the backward: dx = gamma[c] * invstd[c] * g (g as in bn_grad_sums; dx may equal dy),
// dbeta[c] = sums[c], dgamma[c] = sums[C + c] * invstd[c].
cudaError_t bn_backward_local(const float* dy, const float* mask, float* dx, const float* gamma, const float* invstd,
                              const double* sums, float* dgamma, float* dbeta, Dims4 d, bool nhwc,
                              cudaStream_t stream);
// Completes dx from the sums over every process (2C) and the whole count per channel, as torch's
// batch_norm_backward_elemt: dx += a_c + b_c * x with b_c = -gamma invstd^3 sum_dy_xmu / count and
// a_c = -gamma invstd sum_dy / count - b_c * mean.
cudaError_t bn_backward_elemt(const float* x, float* dx, const double* sums, const float* gamma, const float* mean,
                              const float* invstd, double count, Dims4 d, bool nhwc, cudaStream_t stream);

}  // namespace wb::backend::cuda::kernels
