// The CUDA backend's own kernels: layout/type conversion, fill, relu, residual add, max and global
// average pooling, the classifier's bias and bias gradient, softmax cross-entropy, and the fused SGD
// update. Elementwise kernels use grid-stride loops over 64-bit indices; reductions that feed compared
// results (loss, pooling gradients) run in a fixed order so that they are deterministic.
#include "trainer/backend/cuda/kernels.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

namespace wb::backend::cuda::kernels {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<std::int64_t>(std::max<std::int64_t>(blocks, 1), 1 << 20));
}

__device__ inline float load(const float* p, std::int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, std::int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void store(float* p, std::int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, std::int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

struct Index4 {
  std::int64_t n, c, h, w;
};

// (n, c, h, w) of memory position i in NCHW or NHWC order.
__device__ inline Index4 decode(std::int64_t i, const Dims4& d, bool nhwc) {
  Index4 r;
  if (nhwc) {
    r.c = i % d.c;
    i /= d.c;
    r.w = i % d.w;
    i /= d.w;
    r.h = i % d.h;
    r.n = i / d.h;
  } else {
    r.w = i % d.w;
    i /= d.w;
    r.h = i % d.h;
    i /= d.h;
    r.c = i % d.c;
    r.n = i / d.c;
  }
  return r;
}

__device__ inline std::int64_t offset(const Index4& x, const Dims4& d, bool nhwc) {
  return nhwc ? ((x.n * d.h + x.h) * d.w + x.w) * d.c + x.c : ((x.n * d.c + x.c) * d.h + x.h) * d.w + x.w;
}

template <class S, class D>
__global__ void convert_kernel(const S* src, bool src_nhwc, D* dst, bool dst_nhwc, Dims4 d) {
  const std::int64_t n = d.numel();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const std::int64_t s = src_nhwc == dst_nhwc ? i : offset(decode(i, d, dst_nhwc), d, src_nhwc);
    store(dst, i, load(src, s));
  }
}

__global__ void fill_kernel(float* dst, std::int64_t n, float value) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    dst[i] = value;
  }
}

__device__ inline float relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

__global__ void relu_forward_kernel(const float* x, float* y, std::int64_t n) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    y[i] = relu(x[i]);
  }
}

__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, std::int64_t n) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

__global__ void add_kernel(const float* a, const float* b, float* y, std::int64_t n, bool with_relu) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float s = a[i] + b[i];
    y[i] = with_relu ? relu(s) : s;
  }
}

__global__ void accumulate_kernel(const float* x, float scale, float* y, std::int64_t n, bool assign) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    y[i] = assign ? scale * x[i] : y[i] + scale * x[i];
  }
}

struct PoolGeometry {
  Dims4 x, y;
  int kernel, stride, pad;
  bool nhwc;
};

__global__ void maxpool_forward_kernel(const float* x, float* y, std::int32_t* argmax, PoolGeometry g) {
  const std::int64_t n = g.y.numel();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Index4 o = decode(i, g.y, g.nhwc);
    const std::int64_t h0 = o.h * g.stride - g.pad, w0 = o.w * g.stride - g.pad;
    const std::int64_t hs = h0 < 0 ? 0 : h0, ws = w0 < 0 ? 0 : w0;
    const std::int64_t he = min(h0 + g.kernel, g.x.h), we = min(w0 + g.kernel, g.x.w);
    float best = -INFINITY;
    std::int64_t arg = hs * g.x.w + ws;
    for (std::int64_t h = hs; h < he; ++h) {
      for (std::int64_t w = ws; w < we; ++w) {
        const float v = x[offset(Index4{o.n, o.c, h, w}, g.x, g.nhwc)];
        // Strictly greater keeps the first maximum; NaN wins, as in torch.
        if (v > best || v != v) {
          best = v;
          arg = h * g.x.w + w;
        }
      }
    }
    y[i] = best;
    argmax[i] = static_cast<std::int32_t>(arg);
  }
}

__global__ void maxpool_backward_kernel(const float* dy, const std::int32_t* argmax, float* dx, PoolGeometry g) {
  const std::int64_t n = g.x.numel();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Index4 e = decode(i, g.x, g.nhwc);
    // Output rows whose window [oh * s - p, oh * s - p + k) contains e.h.
    const std::int64_t ah = e.h + g.pad - g.kernel + 1, aw = e.w + g.pad - g.kernel + 1;
    const std::int64_t oh_lo = ah <= 0 ? 0 : (ah + g.stride - 1) / g.stride;
    const std::int64_t ow_lo = aw <= 0 ? 0 : (aw + g.stride - 1) / g.stride;
    const std::int64_t oh_hi = min((e.h + g.pad) / g.stride, g.y.h - 1);
    const std::int64_t ow_hi = min((e.w + g.pad) / g.stride, g.y.w - 1);
    const std::int32_t me = static_cast<std::int32_t>(e.h * g.x.w + e.w);
    float sum = 0.0f;
    for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh) {
      for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const std::int64_t yo = offset(Index4{e.n, e.c, oh, ow}, g.y, g.nhwc);
        if (argmax[yo] == me) sum += dy[yo];
      }
    }
    dx[i] = sum;
  }
}

// NCHW: one warp per (n, c) plane, the plane being contiguous.
__global__ void gap_forward_nchw_kernel(const float* x, float* y, std::int64_t planes, std::int64_t hw) {
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; p < planes;
       p += warps) {
    const float* src = x + p * hw;
    float s = 0.0f;
    for (std::int64_t j = lane; j < hw; j += 32) s += src[j];
    for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) y[p] = s / static_cast<float>(hw);
  }
}

// NHWC: one thread per (n, c); neighbouring threads read neighbouring channels.
__global__ void gap_forward_nhwc_kernel(const float* x, float* y, Dims4 d) {
  const std::int64_t total = d.n * d.c, hw = d.h * d.w;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const std::int64_t n = i / d.c, c = i % d.c;
    const float* src = x + n * hw * d.c + c;
    float s = 0.0f;
    for (std::int64_t j = 0; j < hw; ++j) s += src[j * d.c];
    y[i] = s / static_cast<float>(hw);
  }
}

__global__ void gap_backward_kernel(const float* dy, float* dx, Dims4 d, bool nhwc) {
  const std::int64_t total = d.numel(), hw = d.h * d.w;
  const float inv = 1.0f / static_cast<float>(hw);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const std::int64_t nc = nhwc ? (i / (hw * d.c)) * d.c + i % d.c : i / hw;
    dx[i] = dy[nc] * inv;
  }
}

__global__ void bias_add_kernel(float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  const std::int64_t total = rows * cols;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    y[i] += b[i % cols];
  }
}

__global__ void column_sums_kernel(const float* x, float* out, std::int64_t rows, std::int64_t cols) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols; j += step) {
    float s = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) s += x[r * cols + j];
    out[j] = s;
  }
}

// Block-wide reductions for blockDim.x == kThreads; `shared` holds kThreads values.
template <class T, class Op>
__device__ T block_reduce(T v, T* shared, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  T r = shared[0];
  __syncthreads();  // shared may be reused right after
  return r;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// One block per row: max, log-sum-exp in double, probabilities and the row's smoothed loss.
__global__ void softmax_xent_rows_kernel(const float* logits, const std::int32_t* labels, std::int64_t k, float on,
                                         float off, float* probs, double* row_loss, int* bad_label) {
  __shared__ float fshared[kThreads];
  __shared__ double dshared[kThreads];
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * k;
  float* pr = probs + row * k;
  const std::int32_t label = labels[row];
  if (threadIdx.x == 0 && (label < 0 || label >= k)) atomicExch(bad_label, 1);

  float mx = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < k; j += kThreads) mx = MaxOp()(z[j], mx);
  mx = block_reduce(mx, fshared, MaxOp());
  double sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < k; j += kThreads) sum += exp(static_cast<double>(z[j]) - mx);
  sum = block_reduce(sum, dshared, SumOp());
  const double log_sum = log(sum);
  double loss = 0.0;
  for (std::int64_t j = threadIdx.x; j < k; j += kThreads) {
    const double logp = static_cast<double>(z[j]) - mx - log_sum;
    pr[j] = static_cast<float>(exp(logp));
    loss -= static_cast<double>(j == label ? on : off) * logp;
  }
  loss = block_reduce(loss, dshared, SumOp());
  if (threadIdx.x == 0) row_loss[row] = loss;
}

__global__ void mean_kernel(const double* row_loss, std::int64_t n, float* out) {
  __shared__ double dshared[kThreads];
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += kThreads) s += row_loss[i];
  s = block_reduce(s, dshared, SumOp());
  if (threadIdx.x == 0) out[0] = static_cast<float>(s / static_cast<double>(n));
}

__global__ void softmax_xent_backward_kernel(const float* probs, const std::int32_t* labels, std::int64_t n,
                                             std::int64_t k, float on, float off, float inv_n, float* d) {
  const std::int64_t total = n * k;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const std::int64_t row = i / k, j = i % k;
    d[i] = (probs[i] - (j == labels[row] ? on : off)) * inv_n;
  }
}

// The CPU backend's arithmetic, rounded step by step (no fused multiply-add), so both agree bitwise.
__global__ void sgd_kernel(float* w, const float* g, float* buf, const SgdChunk* chunks, std::int64_t nchunks, float lr,
                           float m, float weight_decay, bool nesterov, bool first, bool use_momentum) {
  for (std::int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const SgdChunk ch = chunks[c];
    const float wd = ch.decay ? weight_decay : 0.0f;
    for (std::int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      float d = __fadd_rn(g[i], __fmul_rn(wd, w[i]));
      if (use_momentum) {
        const float b = first ? d : __fadd_rn(__fmul_rn(m, buf[i]), d);
        buf[i] = b;
        d = nesterov ? __fadd_rn(d, __fmul_rn(m, b)) : b;
      }
      w[i] = __fsub_rn(w[i], __fmul_rn(lr, d));
    }
  }
}

}  // namespace

cudaError_t convert(const void* src, bool src_bf16, bool src_nhwc, void* dst, bool dst_bf16, bool dst_nhwc, Dims4 d,
                    cudaStream_t stream) {
  const std::int64_t n = d.numel();
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n);
  if (!src_bf16 && !dst_bf16) {
    convert_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(src), src_nhwc, static_cast<float*>(dst),
                                                  dst_nhwc, d);
  } else if (!src_bf16 && dst_bf16) {
    convert_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(src), src_nhwc,
                                                  static_cast<__nv_bfloat16*>(dst), dst_nhwc, d);
  } else if (src_bf16 && !dst_bf16) {
    convert_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), src_nhwc,
                                                  static_cast<float*>(dst), dst_nhwc, d);
  } else {
    convert_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), src_nhwc,
                                                  static_cast<__nv_bfloat16*>(dst), dst_nhwc, d);
  }
  return cudaGetLastError();
}

cudaError_t fill(float* dst, std::int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, n, value);
  return cudaGetLastError();
}

cudaError_t relu_forward(const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  relu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t relu_backward(const float* y, const float* dy, float* dx, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  relu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t accumulate(const float* x, float scale, float* y, std::int64_t n, bool assign, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  accumulate_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, scale, y, n, assign);
  return cudaGetLastError();
}

cudaError_t add(const float* a, const float* b, float* y, std::int64_t n, bool relu, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(a, b, y, n, relu);
  return cudaGetLastError();
}

cudaError_t maxpool_forward(const float* x, float* y, std::int32_t* argmax, Dims4 xd, std::int64_t oh, std::int64_t ow,
                            int kernel, int stride, int pad, bool nhwc, cudaStream_t stream) {
  PoolGeometry g{xd, Dims4{xd.n, xd.c, oh, ow}, kernel, stride, pad, nhwc};
  const std::int64_t n = g.y.numel();
  if (n == 0) return cudaSuccess;
  maxpool_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, argmax, g);
  return cudaGetLastError();
}

cudaError_t maxpool_backward(const float* dy, const std::int32_t* argmax, float* dx, Dims4 xd, std::int64_t oh,
                             std::int64_t ow, int kernel, int stride, int pad, bool nhwc, cudaStream_t stream) {
  PoolGeometry g{xd, Dims4{xd.n, xd.c, oh, ow}, kernel, stride, pad, nhwc};
  const std::int64_t n = xd.numel();
  if (n == 0) return cudaSuccess;
  maxpool_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dy, argmax, dx, g);
  return cudaGetLastError();
}

cudaError_t global_avgpool_forward(const float* x, float* y, Dims4 xd, bool nhwc, cudaStream_t stream) {
  const std::int64_t planes = xd.n * xd.c, hw = xd.h * xd.w;
  if (planes == 0 || hw == 0) return cudaSuccess;
  if (nhwc) {
    gap_forward_nhwc_kernel<<<grid_for(planes), kThreads, 0, stream>>>(x, y, xd);
  } else {
    gap_forward_nchw_kernel<<<grid_for(planes * 32), kThreads, 0, stream>>>(x, y, planes, hw);
  }
  return cudaGetLastError();
}

cudaError_t global_avgpool_backward(const float* dy, float* dx, Dims4 xd, bool nhwc, cudaStream_t stream) {
  const std::int64_t n = xd.numel();
  if (n == 0) return cudaSuccess;
  gap_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dy, dx, xd, nhwc);
  return cudaGetLastError();
}

cudaError_t bias_add(float* y, const float* b, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  bias_add_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(y, b, rows, cols);
  return cudaGetLastError();
}

cudaError_t column_sums(const float* x, float* out, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  column_sums_kernel<<<grid_for(cols), kThreads, 0, stream>>>(x, out, rows, cols);
  return cudaGetLastError();
}

cudaError_t softmax_xent_forward(const float* logits, const std::int32_t* labels, std::int64_t n, std::int64_t k,
                                 float on, float off, float* probs, double* row_loss, float* loss, int* bad_label,
                                 cudaStream_t stream) {
  cudaError_t rc = cudaMemsetAsync(bad_label, 0, sizeof(int), stream);
  if (rc != cudaSuccess) return rc;
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  softmax_xent_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(logits, labels, k, on, off, probs,
                                                                              row_loss, bad_label);
  rc = cudaGetLastError();
  if (rc != cudaSuccess) return rc;
  mean_kernel<<<1, kThreads, 0, stream>>>(row_loss, n, loss);
  return cudaGetLastError();
}

cudaError_t softmax_xent_backward(const float* probs, const std::int32_t* labels, std::int64_t n, std::int64_t k,
                                  float on, float off, float* dlogits, cudaStream_t stream) {
  if (n * k == 0) return cudaSuccess;
  const float inv_n = 1.0f / static_cast<float>(n);
  softmax_xent_backward_kernel<<<grid_for(n * k), kThreads, 0, stream>>>(probs, labels, n, k, on, off, inv_n, dlogits);
  return cudaGetLastError();
}

cudaError_t sgd_update(float* w, const float* g, float* buf, const SgdChunk* chunks, std::int64_t nchunks, float lr,
                       float momentum, float weight_decay, bool nesterov, bool first_step, cudaStream_t stream) {
  if (nchunks == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(nchunks, 1 << 20));
  sgd_kernel<<<grid, kThreads, 0, stream>>>(w, g, buf, chunks, nchunks, lr, momentum, weight_decay, nesterov,
                                            first_step, momentum != 0.0f);
  return cudaGetLastError();
}

// ---- synchronised batch norm ----------------------------------------------------------------------

namespace {

__device__ inline std::int64_t channel_of(std::int64_t i, const Dims4& d, bool nhwc) {
  return nhwc ? i % d.c : (i / (d.h * d.w)) % d.c;
}

// One block per channel (blockIdx.x) and slice (blockIdx.y of gridDim.y): kThreads threads each sum a
// strided share of the slice's values in double, then a fixed-order tree over the block; the slice's two
// sums go to partial[(c * slices + slice) * 2 + {0, 1}].
__global__ void bn_channel_partial_kernel(const float* x, const float* dy, const float* mask, const float* mean,
                                          Dims4 d, bool nhwc, double* partial) {
  const std::int64_t c = blockIdx.x, slice = blockIdx.y, slices = gridDim.y;
  const std::int64_t hw = d.h * d.w, count = d.n * hw;
  const std::int64_t chunk = (count + slices - 1) / slices;
  const std::int64_t begin = slice * chunk, end = begin + chunk < count ? begin + chunk : count;
  double s1 = 0.0, s2 = 0.0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const std::int64_t n = i / hw, p = i % hw;
    const std::int64_t o = nhwc ? (n * hw + p) * d.c + c : (n * d.c + c) * hw + p;
    const double v = x[o];
    if (dy == nullptr) {
      s1 += v;
      s2 += v * v;
    } else {
      const double g = (mask != nullptr && !(mask[o] > 0.0f)) ? 0.0 : static_cast<double>(dy[o]);
      s1 += g;
      s2 += g * (v - static_cast<double>(mean[c]));
    }
  }
  __shared__ double a[kThreads], b[kThreads];
  a[threadIdx.x] = s1;
  b[threadIdx.x] = s2;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      a[threadIdx.x] += a[threadIdx.x + s];
      b[threadIdx.x] += b[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[(c * slices + slice) * 2] = a[0];
    partial[(c * slices + slice) * 2 + 1] = b[0];
  }
}

// One thread per channel adds its slices in order: out[c] and out[C + c].
__global__ void bn_channel_combine_kernel(const double* partial, std::int64_t slices, std::int64_t c, double* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  double s1 = 0.0, s2 = 0.0;
  for (std::int64_t k = 0; k < slices; ++k) {
    s1 += partial[(i * slices + k) * 2];
    s2 += partial[(i * slices + k) * 2 + 1];
  }
  out[i] = s1;
  out[c + i] = s2;
}

__global__ void bn_normalize_kernel(const float* x, float* y, const float* mean, const float* invstd,
                                    const float* gamma, const float* beta, Dims4 d, bool nhwc, bool with_relu) {
  const std::int64_t n = d.numel();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const std::int64_t c = channel_of(i, d, nhwc);
    const float v = (x[i] - mean[c]) * invstd[c] * gamma[c] + beta[c];
    y[i] = with_relu ? relu(v) : v;
  }
}

__global__ void bn_running_kernel(float* rm, float* rv, const float* mean, const float* var, std::int64_t c, float m) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  rm[i] = (1.0f - m) * rm[i] + m * mean[i];
  rv[i] = (1.0f - m) * rv[i] + m * var[i];
}

__global__ void bn_backward_local_kernel(const float* dy, const float* mask, float* dx, const float* gamma,
                                         const float* invstd, Dims4 d, bool nhwc) {
  const std::int64_t n = d.numel();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const std::int64_t c = channel_of(i, d, nhwc);
    const float g = (mask != nullptr && !(mask[i] > 0.0f)) ? 0.0f : dy[i];
    dx[i] = gamma[c] * invstd[c] * g;
  }
}

__global__ void bn_param_grads_kernel(const double* sums, const float* invstd, float* dgamma, float* dbeta,
                                      std::int64_t c) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  dbeta[i] = static_cast<float>(sums[i]);
  dgamma[i] = static_cast<float>(sums[c + i] * static_cast<double>(invstd[i]));
}

__global__ void bn_backward_elemt_kernel(const float* x, float* dx, const double* sums, const float* gamma,
                                         const float* mean, const float* invstd, double count, Dims4 d, bool nhwc) {
  const std::int64_t n = d.numel();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const std::int64_t c = channel_of(i, d, nhwc);
    const double inv = invstd[c], g = gamma[c];
    const double bc = -g * inv * inv * inv * (sums[d.c + c] / count);
    const double ac = -g * inv * (sums[c] / count) - bc * static_cast<double>(mean[c]);
    dx[i] += static_cast<float>(ac) + static_cast<float>(bc) * x[i];
  }
}

}  // namespace

// Slices per channel: at least 16 values per thread, at most 128 slices.
std::int64_t bn_sum_parts(Dims4 d) {
  const std::int64_t count = d.n * d.h * d.w, per_slice = std::int64_t{kThreads} * 16;
  const std::int64_t slices = (count + per_slice - 1) / per_slice;
  return slices < 1 ? 1 : (slices > 128 ? 128 : slices);
}

std::int64_t bn_sums_doubles(Dims4 d) { return 2 * d.c + 2 * d.c * bn_sum_parts(d); }

namespace {

cudaError_t channel_sums(const float* x, const float* dy, const float* mask, const float* mean, Dims4 d, bool nhwc,
                         double* out, cudaStream_t stream) {
  if (d.c == 0) return cudaSuccess;
  if (d.c > 0x7fffffff) return cudaErrorInvalidValue;
  const std::int64_t slices = bn_sum_parts(d);
  double* partial = out + 2 * d.c;
  const dim3 grid(static_cast<unsigned>(d.c), static_cast<unsigned>(slices));
  bn_channel_partial_kernel<<<grid, kThreads, 0, stream>>>(x, dy, mask, mean, d, nhwc, partial);
  if (const cudaError_t rc = cudaGetLastError(); rc != cudaSuccess) return rc;
  bn_channel_combine_kernel<<<grid_for(d.c), kThreads, 0, stream>>>(partial, slices, d.c, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t bn_sums(const float* x, Dims4 d, bool nhwc, double* out, cudaStream_t stream) {
  return channel_sums(x, nullptr, nullptr, nullptr, d, nhwc, out, stream);
}

cudaError_t bn_grad_sums(const float* x, const float* dy, const float* mask, const float* mean, Dims4 d, bool nhwc,
                         double* out, cudaStream_t stream) {
  if (dy == nullptr) return cudaErrorInvalidValue;
  return channel_sums(x, dy, mask, mean, d, nhwc, out, stream);
}

cudaError_t bn_normalize(const float* x, float* y, const float* mean, const float* invstd, const float* gamma,
                         const float* beta, Dims4 d, bool nhwc, bool relu, cudaStream_t stream) {
  const std::int64_t n = d.numel();
  if (n == 0) return cudaSuccess;
  bn_normalize_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, mean, invstd, gamma, beta, d, nhwc, relu);
  return cudaGetLastError();
}

cudaError_t bn_running_update(float* running_mean, float* running_var, const float* mean, const float* var,
                              std::int64_t c, float momentum, cudaStream_t stream) {
  if (c == 0) return cudaSuccess;
  bn_running_kernel<<<grid_for(c), kThreads, 0, stream>>>(running_mean, running_var, mean, var, c, momentum);
  return cudaGetLastError();
}

cudaError_t bn_backward_local(const float* dy, const float* mask, float* dx, const float* gamma, const float* invstd,
                              const double* sums, float* dgamma, float* dbeta, Dims4 d, bool nhwc,
                              cudaStream_t stream) {
  if (d.c > 0) {
    bn_param_grads_kernel<<<grid_for(d.c), kThreads, 0, stream>>>(sums, invstd, dgamma, dbeta, d.c);
    const cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return rc;
  }
  const std::int64_t n = d.numel();
  if (n == 0) return cudaSuccess;
  bn_backward_local_kernel<<<grid_for(n), kThreads, 0, stream>>>(dy, mask, dx, gamma, invstd, d, nhwc);
  return cudaGetLastError();
}

cudaError_t bn_backward_elemt(const float* x, float* dx, const double* sums, const float* gamma, const float* mean,
                              const float* invstd, double count, Dims4 d, bool nhwc, cudaStream_t stream) {
  const std::int64_t n = d.numel();
  if (n == 0) return cudaSuccess;
  bn_backward_elemt_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, dx, sums, gamma, mean, invstd, count, d, nhwc);
  return cudaGetLastError();
}

}  // namespace wb::backend::cuda::kernels
