// ReLU, residual add, max and global average pooling, the classifier (cuBLAS), softmax cross-entropy
// and the fused SGD update. Elementwise ops work in their first input's layout (a second input in
// another layout is converted first); the classifier and the loss work on plain (N, K) data.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "trainer/backend/cuda/cuda_backend.hpp"
#include "trainer/backend/cuda/kernels.hpp"

namespace wb::backend::cuda {

namespace {

kernels::Dims4 dims(const Shape& s) { return {s[0], s[1], s[2], s[3]}; }

// The output shape, checked also against the kernels' int plane index.
Shape max_geometry(const Shape& x, const Pool2dParams& p, const char* op) {
  const Shape y = maxpool_output_shape(x, p, op);
  if (x[2] * x[3] > 0x7fffffff) throw BackendError(std::string(op) + ": input plane " + x.to_string() + " too large");
  return y;
}

int as_int(std::int64_t v, const char* op) {
  if (v > 0x7fffffff) throw BackendError(std::string(op) + ": dimension " + std::to_string(v) + " exceeds cuBLAS's int");
  return static_cast<int>(v);
}

}  // namespace

// ---- elementwise ------------------------------------------------------------------------------------

void CudaBackend::relu_forward(const Tensor& x, Tensor& y) {
  activate();
  check_f32(x, 0, "relu_forward", "x");
  const float* src = x.data_as<float>();  // read before y may be reallocated
  const Layout layout = layout_of(x);
  if (y.impl() != x.impl()) ensure(y, x.shape(), layout);
  WB_CUDA_CHECK(kernels::relu_forward(src, y.data_as<float>(), x.numel(), stream_));
}

void CudaBackend::relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  activate();
  check_relu_backward(y, dy, this);
  const Layout layout = layout_of(y);
  const float* grad = static_cast<const float*>(as_form(dy, layout, false, kScratchIn));
  // In place on dy is fine for an elementwise op when dy is already in y's layout.
  const bool in_place = dx.impl() == dy.impl() && grad == dy.data();
  if (!in_place) ensure(dx, y.shape(), layout);
  WB_CUDA_CHECK(kernels::relu_backward(y.data_as<float>(), grad, dx.data_as<float>(), y.numel(), stream_));
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  activate();
  check_add(a, b, this);
  const Layout layout = layout_of(a);
  const float* src0 = a.data_as<float>();
  const float* src1 = static_cast<const float*>(as_form(b, layout, false, kScratchIn));
  const bool in_place = y.impl() == a.impl() || (y.impl() == b.impl() && src1 == b.data());
  if (!in_place) ensure(y, a.shape(), layout);
  WB_CUDA_CHECK(kernels::add(src0, src1, y.data_as<float>(), a.numel(), relu, stream_));
}

// ---- pooling ----------------------------------------------------------------------------------------

void CudaBackend::maxpool_forward(const Tensor& x, Tensor& y, Tensor& workspace, const Pool2dParams& p) {
  activate();
  check_f32(x, 4, "maxpool_forward", "x");
  const Shape& xs = x.shape();
  const Shape ys = max_geometry(xs, p, "maxpool_forward");         // (N, C, OH, OW)
  const Layout layout = layout_of(x);
  const float* src = x.data_as<float>();
  ensure(y, ys, layout);                                             // (N, C, OH, OW) in x's layout
  // The argmax of each output element, in y's memory order; flat, so that its layout never matters.
  ensure(workspace, Shape{ys.numel()}, Layout::nchw, DType::i32);
  // One layout flag for x and y: when y is 1x1 (stored NCHW) both orders are the same bytes.
  WB_CUDA_CHECK(kernels::maxpool_forward(src, y.data_as<float>(), workspace.data_as<std::int32_t>(), dims(xs), ys[2],
                                         ys[3], p.kernel, p.stride, p.pad, layout == Layout::nhwc, stream_));
}

void CudaBackend::maxpool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace,
                                   Tensor& dx, const Pool2dParams& p) {
  activate();
  check_f32(x, 4, "maxpool_backward", "x");
  check_f32(y, 4, "maxpool_backward", "y");
  check_f32(dy, 4, "maxpool_backward", "dy");
  const Shape& xs = x.shape();
  const Shape ys = max_geometry(xs, p, "maxpool_backward");
  if (!(dy.shape() == ys) || !(y.shape() == ys)) {
    throw BackendError("maxpool_backward: y and dy must be " + ys.to_string() + " for x " + xs.to_string() + ", got y " +
                       y.shape().to_string() + " dy " + dy.shape().to_string());
  }
  if (!workspace.defined() || workspace.dtype() != DType::i32 || workspace.numel() != ys.numel()) {
    throw BackendError("maxpool_backward: the workspace is not that of a maxpool_forward on this backend for x " +
                       xs.to_string());
  }
  // The forward wrote the argmax in the memory order of x's layout; dy and dx follow it.
  const Layout layout = layout_of(x);
  const float* grad = static_cast<const float*>(as_form(dy, layout, false, kScratchIn));
  ensure(dx, xs, layout);
  WB_CUDA_CHECK(kernels::maxpool_backward(grad, workspace.data_as<std::int32_t>(), dx.data_as<float>(), dims(xs), ys[2],
                                          ys[3], p.kernel, p.stride, p.pad, layout == Layout::nhwc, stream_));
}

void CudaBackend::global_avgpool_forward(const Tensor& x, Tensor& y) {
  activate();
  check_f32(x, 4, "global_avgpool_forward", "x");
  const Shape& xs = x.shape();
  const float* src = x.data_as<float>();
  const bool nhwc = layout_of(x) == Layout::nhwc;
  ensure(y, Shape{xs[0], xs[1], 1, 1}, Layout::nchw);                // (N, C, 1, 1), plain in any layout
  WB_CUDA_CHECK(kernels::global_avgpool_forward(src, y.data_as<float>(), dims(xs), nhwc, stream_));
}

void CudaBackend::global_avgpool_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  activate();
  check_global_avgpool_backward(x, dy, this);
  const Shape& xs = x.shape();
  const float* grad = dy.data_as<float>();
  ensure(dx, xs, layout_of(x));
  WB_CUDA_CHECK(kernels::global_avgpool_backward(grad, dx.data_as<float>(), dims(xs), layout_of(dx) == Layout::nhwc,
                                                 stream_));
}

// ---- linear -------------------------------------------------------------------------------------------
// Row-major (N, IN) x and (OUT, IN) W are column-major x^T (IN, N) and W^T (IN, OUT) to cuBLAS:
//   y^T (OUT, N)  = W  x^T      -> gemm(T, N, m = OUT, n = N,   k = IN)
//   dx^T (IN, N)  = W^T dy^T    -> gemm(N, N, m = IN,  n = N,   k = OUT)
//   dW^T (IN, OUT) = x^T dy     -> gemm(N, T, m = IN,  n = OUT, k = N)

namespace {

// C (m, n) = op(A) op(B) in column-major terms, fp32 or bf16 inputs, fp32 output and accumulation.
void gemm(CudaBackend& be, bool bf16, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a,
          int lda, const void* b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  if (bf16) {
    WB_CUBLAS_CHECK(cublasGemmEx(be.cublas(), ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &zero,
                                 c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    WB_CUBLAS_CHECK(cublasSgemm(be.cublas(), ta, tb, m, n, k, &one, static_cast<const float*>(a), lda,
                                static_cast<const float*>(b), ldb, &zero, c, ldc));
  }
}

}  // namespace

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  activate();
  const auto [n, in, out] = check_linear_forward(x, w, b, this);
  const bool bf16 = precision_ == Precision::bf16;
  // (N, IN, 1, 1) is the same bytes as (N, IN) in either layout.
  const void* xin = as_form(x, Layout::nchw, bf16, kScratchIn);
  const void* win = weights_as(w, Layout::nchw, bf16, kWeightLinear);
  ensure(y, Shape{n, out}, Layout::nchw);                            // (N, OUT)
  if (n == 0 || out == 0) return;
  if (in == 0) {
    WB_CUDA_CHECK(kernels::fill(y.data_as<float>(), n * out, 0.0f, stream_));
  } else {
    gemm(*this, bf16, CUBLAS_OP_T, CUBLAS_OP_N, as_int(out, "linear_forward"), as_int(n, "linear_forward"),
         as_int(in, "linear_forward"), win, static_cast<int>(in), xin, static_cast<int>(in), y.data_as<float>(),
         static_cast<int>(out));
  }
  WB_CUDA_CHECK(kernels::bias_add(y.data_as<float>(), b.data_as<float>(), n, out, stream_));
}

void CudaBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, const Tensor& dw,
                                  const Tensor& db) {
  activate();
  const auto [n, in, out] = check_linear_backward(x, w, dy, dw, db, this);
  const bool bf16 = precision_ == Precision::bf16;
  const void* xin = as_form(x, Layout::nchw, bf16, kScratchIn);
  const void* dyin = as_form(dy, Layout::nchw, bf16, kScratchIn2);
  const void* win = weights_as(w, Layout::nchw, bf16, kWeightLinear);
  const int ni = as_int(n, "linear_backward"), ii = as_int(in, "linear_backward"), oi = as_int(out, "linear_backward");
  // db: column sums of dy (fp32 dy, whatever the precision).
  WB_CUDA_CHECK(kernels::column_sums(dy.data_as<float>(), db.data_as<float>(), n, out, stream_));
  if (n == 0) {
    WB_CUDA_CHECK(kernels::fill(dw.data_as<float>(), out * in, 0.0f, stream_));
  } else if (in > 0 && out > 0) {
    gemm(*this, bf16, CUBLAS_OP_N, CUBLAS_OP_T, ii, oi, ni, xin, ii, dyin, oi, dw.data_as<float>(), ii);
  }
  ensure(dx, x.shape(), Layout::nchw);                               // x's shape, plain
  if (n == 0 || in == 0) return;
  if (out == 0) {
    WB_CUDA_CHECK(kernels::fill(dx.data_as<float>(), n * in, 0.0f, stream_));
    return;
  }
  gemm(*this, bf16, CUBLAS_OP_N, CUBLAS_OP_N, ii, ni, oi, win, ii, dyin, oi, dx.data_as<float>(), ii);
}

// ---- softmax cross-entropy ---------------------------------------------------------------------------

namespace {

void check_loss_inputs(const CudaBackend& be, const Tensor& logits, const Tensor& labels, const char* op) {
  check_logits(logits, op, &be);
  if (logits.shape()[1] < 1) throw BackendError(std::string(op) + ": logits need at least one class");
  check_labels(labels, logits.shape()[0], op, &be);
}

}  // namespace

void CudaBackend::softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const LossParams& p,
                                                Tensor& loss, Tensor& probs) {
  activate();
  const char* op = "softmax_cross_entropy_forward";
  check_loss_inputs(*this, logits, labels, op);
  const std::int64_t n = logits.shape()[0], k = logits.shape()[1];
  const LossTargets t = loss_targets(p, k, op);
  ensure(loss, Shape{1}, Layout::nchw);
  ensure(probs, logits.shape(), Layout::nchw);
  // Row losses (double) followed by the bad-label flag.
  const std::size_t rows_bytes = static_cast<std::size_t>(n) * sizeof(double);
  char* s = static_cast<char*>(scratch(kScratchLoss, rows_bytes + sizeof(int)));
  int* flag = reinterpret_cast<int*>(s + rows_bytes);
  WB_CUDA_CHECK(kernels::softmax_xent_forward(logits.data_as<float>(), labels.data_as<std::int32_t>(), n, k, t.on, t.off,
                                              probs.data_as<float>(), reinterpret_cast<double*>(s),
                                              loss.data_as<float>(), flag, stream_));
  // The caller reads the loss right after, so waiting here for the label check costs nothing extra.
  int bad = 0;
  WB_CUDA_CHECK(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, stream_));
  WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (bad) {
    std::vector<std::int32_t> host(static_cast<std::size_t>(n));
    to_host(labels, host);
    check_label_range(host, k, op);
  }
}

void CudaBackend::softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const LossParams& p,
                                                 Tensor& dlogits) {
  activate();
  const char* op = "softmax_cross_entropy_backward";
  check_loss_inputs(*this, probs, labels, op);
  const std::int64_t n = probs.shape()[0], k = probs.shape()[1];
  const LossTargets t = loss_targets(p, k, op);
  const float* pr = probs.data_as<float>();
  ensure(dlogits, probs.shape(), Layout::nchw);
  // Labels outside [0, k) were reported by the forward; here they only mean no class gets the on-value.
  WB_CUDA_CHECK(kernels::softmax_xent_backward(pr, labels.data_as<std::int32_t>(), n, k, t.on, t.off,
                                               dlogits.data_as<float>(), stream_));
}

// ---- SGD -----------------------------------------------------------------------------------------------

void CudaBackend::sgd_update(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                             std::span<const ParamSegment> segments, const SgdParams& p) {
  activate();
  const std::size_t total = check_sgd_buffers(params, grads, momentum, this);
  const bool same = sgd_segments_.size() == segments.size() &&
                    std::equal(segments.begin(), segments.end(), sgd_segments_.begin(),
                               [](const ParamSegment& a, const ParamSegment& b) {
                                 return a.offset == b.offset && a.numel == b.numel && a.decay == b.decay;
                               });
  if (!same) {
    check_sgd_segments(segments, total);
    // Every element is updated by one thread: overlapping segments would race.
    std::vector<ParamSegment> sorted(segments.begin(), segments.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamSegment& a, const ParamSegment& b) { return a.offset < b.offset; });
    for (std::size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i].offset < sorted[i - 1].offset + sorted[i - 1].numel) {
        throw BackendError("sgd_update: segments [" + std::to_string(sorted[i - 1].offset) + ", " +
                           std::to_string(sorted[i - 1].offset + sorted[i - 1].numel) + ") and [" +
                           std::to_string(sorted[i].offset) + ", ...) overlap");
      }
    }
    std::vector<kernels::SgdChunk> chunks;
    for (const auto& s : segments) {
      const auto begin = static_cast<std::int64_t>(s.offset), end = begin + static_cast<std::int64_t>(s.numel);
      for (std::int64_t c = begin; c < end; c += kernels::kSgdChunk) {
        chunks.push_back({c, std::min(end, c + kernels::kSgdChunk), s.decay ? 1 : 0, 0});
      }
    }
    sgd_chunks_.reset();
    sgd_nchunks_ = static_cast<std::int64_t>(chunks.size());
    if (!chunks.empty()) {
      const std::size_t bytes = chunks.size() * sizeof(kernels::SgdChunk);
      sgd_chunks_ = alloc_->allocate(bytes, /*workspace=*/true);
      // From pageable memory: the call returns once `chunks` has been staged, so it may go out of scope.
      WB_CUDA_CHECK(cudaMemcpyAsync(sgd_chunks_.get(), chunks.data(), bytes, cudaMemcpyHostToDevice, stream_));
      WB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    sgd_segments_.assign(segments.begin(), segments.end());
  }
  ++param_generation_;
  WB_CUDA_CHECK(kernels::sgd_update(params.data_as<float>(), grads.data_as<float>(), momentum.data_as<float>(),
                                    static_cast<const kernels::SgdChunk*>(sgd_chunks_.get()), sgd_nchunks_, p.lr,
                                    p.momentum, p.weight_decay, p.nesterov, p.first_step, stream_));
}

}  // namespace wb::backend::cuda
