// Convolution on cuDNN's legacy API: forward, backward-data, backward-filter. Descriptors are made once
// per (input shape, weight shape, stride, pad); the layout (NCHW or NHWC) and the precision are fixed per
// backend. Each direction's algorithm is chosen once with cudnnFind* (measured, fastest first) among the
// algorithms its precision allows, and the one workspace grows to the largest choice.
//
// Precision: fp32 searches and runs with CUDNN_FMA_MATH (no TF32) and skips FFT and Winograd, whose
// transforms cost accuracy the fp32 mode promises (it is compared with the CPU backend at 1e-5); which
// measured result each precision may run is conv_algo_choice.hpp's rule; tf32 uses
// CUDNN_DEFAULT_MATH, which lets fp32 convolutions run on TF32 tensor cores (ALLOW_CONVERSION would also
// permit fp16 down-conversion); bf16 runs on bf16 copies of the inputs and filters with fp32
// accumulation (PSEUDO_BFLOAT16 configuration) and converts the result back to fp32.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/backend/conv_algo_choice.hpp"
#include "trainer/backend/cuda/cuda_backend.hpp"
#include "trainer/backend/cuda/kernels.hpp"

namespace wb::backend::cuda {

namespace {

constexpr std::size_t kMaxWorkspaceBytes = std::size_t{1} << 30;

struct ConvEntry final : CacheEntry {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  // One convolution descriptor per direction: each carries the math type of its chosen algorithm.
  cudnnConvolutionDescriptor_t fwd_desc = nullptr, data_desc = nullptr, filter_desc = nullptr;
  Shape y_shape;
  bool have_fwd = false, have_data = false, have_filter = false;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t data{};
  cudnnConvolutionBwdFilterAlgo_t filter{};
  std::size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;

  ConvEntry() = default;
  ConvEntry(const ConvEntry&) = delete;
  ConvEntry& operator=(const ConvEntry&) = delete;
  ~ConvEntry() override {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (fwd_desc) cudnnDestroyConvolutionDescriptor(fwd_desc);
    if (data_desc) cudnnDestroyConvolutionDescriptor(data_desc);
    if (filter_desc) cudnnDestroyConvolutionDescriptor(filter_desc);
  }
};

int as_int(std::int64_t v, const char* op) {
  if (v > 0x7fffffff) throw BackendError(std::string(op) + ": dimension " + std::to_string(v) + " exceeds cuDNN's int");
  return static_cast<int>(v);
}

cudnnMathType_t search_math(Precision precision) {
  switch (precision) {
    case Precision::fp32: return CUDNN_FMA_MATH;
    case Precision::tf32: return CUDNN_DEFAULT_MATH;
    case Precision::bf16: return CUDNN_TENSOR_OP_MATH;
  }
  return CUDNN_FMA_MATH;
}

// cudnnFind* allocates and may leave a failed allocation's error behind: clear it after each search, or
// the next launch's cudaGetLastError would report it as its own.
void clear_stale_error() { cudaGetLastError(); }

cudnnMathType_t to_cudnn(FoundMath m, cudnnMathType_t found) {
  switch (m) {
    case FoundMath::fma: return CUDNN_FMA_MATH;
    case FoundMath::default_math: return CUDNN_DEFAULT_MATH;
    case FoundMath::tensor_op: return CUDNN_TENSOR_OP_MATH;
    case FoundMath::tensor_op_conversion: return CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    case FoundMath::other: return found;
  }
  return found;
}

FoundMath from_cudnn(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_FMA_MATH: return FoundMath::fma;
    case CUDNN_DEFAULT_MATH: return FoundMath::default_math;
    case CUDNN_TENSOR_OP_MATH: return FoundMath::tensor_op;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return FoundMath::tensor_op_conversion;
  }
  return FoundMath::other;
}

const char* algo_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    default: return "?";
  }
}

const char* algo_name(cudnnConvolutionBwdDataAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: return "FFT_TILING";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: return "WINOGRAD";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    default: return "?";
  }
}

const char* algo_name(cudnnConvolutionBwdFilterAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: return "FFT";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3: return "ALGO_3";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD: return "WINOGRAD";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: return "WINOGRAD_NONFUSED";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING: return "FFT_TILING";
    default: return "?";
  }
}

// FFT and Winograd: their transforms cost accuracy.
bool is_transform(const char* name) {
  const std::string n = name;
  return n.find("FFT") != std::string::npos || n.find("WINOGRAD") != std::string::npos;
}

// cuDNN's perf table (any direction's *AlgoPerf_t) as the plain rows the choice reads.
template <class Perf>
std::vector<FoundAlgorithm> found_rows(const std::vector<Perf>& perf, int returned) {
  std::vector<FoundAlgorithm> rows;
  for (int i = 0; i < returned; ++i) {
    const Perf& r = perf[static_cast<std::size_t>(i)];
    const char* name = algo_name(r.algo);
    rows.push_back({static_cast<int>(r.algo), name, r.status == CUDNN_STATUS_SUCCESS, r.time, r.memory,
                    from_cudnn(r.mathType), is_transform(name)});
  }
  return rows;
}

// The index into `perf` of the algorithm to run, with its math type set on `desc`; throws with the whole
// table when none qualifies.
template <class Perf>
const Perf& choose(CudaBackend& be, cudnnConvolutionDescriptor_t desc, const std::vector<Perf>& perf, int returned,
                   const char* op, const std::string& what) {
  const std::vector<FoundAlgorithm> rows = found_rows(perf, returned);
  const int i = pick_algorithm(be.precision(), rows, kMaxWorkspaceBytes);
  if (i < 0) {
    throw BackendError(std::string(op) + ": cuDNN offers no usable algorithm for " + what + "; " +
                       find_table(be.precision(), rows, kMaxWorkspaceBytes));
  }
  const Perf& r = perf[static_cast<std::size_t>(i)];
  WB_CUDNN_CHECK(cudnnSetConvolutionMathType(desc, to_cudnn(run_math(be.precision(), rows[static_cast<std::size_t>(i)].math),
                                                                   r.mathType)));
  return r;
}

std::string describe(const Shape& x, const Shape& w, const Conv2dParams& p) {
  return "x " + x.to_string() + " w " + w.to_string() + " stride " + std::to_string(p.stride) + " pad " +
         std::to_string(p.pad);
}

ConvEntry& conv_entry(CudaBackend& be, const Shape& xs, const Shape& ws, const Conv2dParams& p, const char* op) {
  const Shape ys = conv2d_output_shape(xs, ws, p, op);
  CacheKey key;
  key.add(kOpConv).add(xs).add(ws).add(p.stride).add(p.pad);
  if (auto* e = be.find(key)) return static_cast<ConvEntry&>(*e);

  auto e = std::make_unique<ConvEntry>();
  const cudnnDataType_t dt = be.precision() == Precision::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  const cudnnTensorFormat_t fmt = be.channels_last() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  WB_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->x));
  WB_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->y));
  WB_CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->w));
  WB_CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->x, fmt, dt, as_int(xs[0], op), as_int(xs[1], op), as_int(xs[2], op),
                                            as_int(xs[3], op)));
  WB_CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->y, fmt, dt, as_int(ys[0], op), as_int(ys[1], op), as_int(ys[2], op),
                                            as_int(ys[3], op)));
  WB_CUDNN_CHECK(cudnnSetFilter4dDescriptor(e->w, dt, fmt, as_int(ws[0], op), as_int(ws[1], op), as_int(ws[2], op),
                                            as_int(ws[3], op)));
  for (cudnnConvolutionDescriptor_t* d : {&e->fwd_desc, &e->data_desc, &e->filter_desc}) {
    WB_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(d));
    // Accumulation in fp32 for every precision (bf16 data: the PSEUDO_BFLOAT16 configuration).
    WB_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(*d, p.pad, p.pad, p.stride, p.stride, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    WB_CUDNN_CHECK(cudnnSetConvolutionMathType(*d, search_math(be.precision())));
  }
  int n = 0, c = 0, h = 0, w = 0;
  WB_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->fwd_desc, e->x, e->w, &n, &c, &h, &w));
  if (!(Shape{n, c, h, w} == ys)) {
    throw BackendError(std::string(op) + ": cuDNN's output " + Shape{n, c, h, w}.to_string() + " differs from " +
                       ys.to_string() + " for " + describe(xs, ws, p));
  }
  e->y_shape = ys;
  return static_cast<ConvEntry&>(*be.insert(key, std::move(e)));
}

void find_forward(CudaBackend& be, ConvEntry& e, const std::string& what) {
  int max_count = 0;
  WB_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(be.cudnn(), &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(std::max(max_count, 1)));
  int returned = 0;
  WB_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(be.cudnn(), e.x, e.w, e.fwd_desc, e.y,
                                                      static_cast<int>(perf.size()), &returned, perf.data()));
  clear_stale_error();
  ++be.algorithm_searches_;
  const auto& r = choose(be, e.fwd_desc, perf, returned, "conv2d_forward", what);
  // The workspace asked again under the math type the algorithm runs with.
  std::size_t ws = 0;
  WB_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(be.cudnn(), e.x, e.w, e.fwd_desc, e.y, r.algo, &ws));
  e.fwd = r.algo;
  e.fwd_ws = std::max(ws, r.memory);
  e.have_fwd = true;
}

void find_data(CudaBackend& be, ConvEntry& e, const std::string& what) {
  int max_count = 0;
  WB_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(be.cudnn(), &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(std::max(max_count, 1)));
  int returned = 0;
  WB_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(be.cudnn(), e.w, e.y, e.data_desc, e.x,
                                                           static_cast<int>(perf.size()), &returned, perf.data()));
  clear_stale_error();
  ++be.algorithm_searches_;
  const auto& r = choose(be, e.data_desc, perf, returned, "conv2d_backward_data", what);
  std::size_t ws = 0;
  WB_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(be.cudnn(), e.w, e.y, e.data_desc, e.x, r.algo, &ws));
  e.data = r.algo;
  e.data_ws = std::max(ws, r.memory);
  e.have_data = true;
}

void find_filter(CudaBackend& be, ConvEntry& e, const std::string& what) {
  int max_count = 0;
  WB_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(be.cudnn(), &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(std::max(max_count, 1)));
  int returned = 0;
  WB_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(be.cudnn(), e.x, e.y, e.filter_desc, e.w,
                                                             static_cast<int>(perf.size()), &returned, perf.data()));
  clear_stale_error();
  ++be.algorithm_searches_;
  const auto& r = choose(be, e.filter_desc, perf, returned, "conv2d_backward_weights", what);
  std::size_t ws = 0;
  WB_CUDNN_CHECK(
      cudnnGetConvolutionBackwardFilterWorkspaceSize(be.cudnn(), e.x, e.y, e.filter_desc, e.w, r.algo, &ws));
  e.filter = r.algo;
  e.filter_ws = std::max(ws, r.memory);
  e.have_filter = true;
}

kernels::Dims4 dims(const Shape& s) { return {s[0], s[1], s[2], s[3]}; }

}  // namespace

void CudaBackend::conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const Conv2dParams& p) {
  activate();
  check_f32(x, 4, "conv2d_forward", "x");
  check_f32(w, 4, "conv2d_forward", "w");
  ConvEntry& e = conv_entry(*this, x.shape(), w.shape(), p, "conv2d_forward");
  if (!e.have_fwd) find_forward(*this, e, describe(x.shape(), w.shape(), p));
  const bool bf16 = precision_ == Precision::bf16;
  const Layout layout = channels_last_ ? Layout::nhwc : Layout::nchw;
  const void* xin = as_form(x, layout, bf16, kScratchIn);
  const void* win = weights_as(w, layout, bf16, kWeightConv);
  ensure(y, e.y_shape, act_layout(e.y_shape));                       // (N, O, OH, OW)
  void* yout = bf16 ? scratch(kScratchOut, static_cast<std::size_t>(e.y_shape.numel()) * 2) : y.data();
  void* ws = workspace(e.fwd_ws);
  const float one = 1.0f, zero = 0.0f;
  WB_CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, e.x, xin, e.w, win, e.fwd_desc, e.fwd, ws, e.fwd_ws, &zero,
                                         e.y, yout));
  if (bf16) {
    WB_CUDA_CHECK(kernels::convert(yout, true, channels_last_, y.data(), false, layout_of(y) == Layout::nhwc,
                                   dims(e.y_shape), stream_));
  }
}

void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Shape& x_shape,
                                       const Conv2dParams& p) {
  activate();
  check_f32(dy, 4, "conv2d_backward_data", "dy");
  check_f32(w, 4, "conv2d_backward_data", "w");
  ConvEntry& e = conv_entry(*this, x_shape, w.shape(), p, "conv2d_backward_data");
  if (!(dy.shape() == e.y_shape)) {
    throw BackendError("conv2d_backward_data: dy must be " + e.y_shape.to_string() + " for " +
                       describe(x_shape, w.shape(), p) + ", got " + dy.shape().to_string());
  }
  if (!e.have_data) find_data(*this, e, describe(x_shape, w.shape(), p));
  const bool bf16 = precision_ == Precision::bf16;
  const Layout layout = channels_last_ ? Layout::nhwc : Layout::nchw;
  const void* dyin = as_form(dy, layout, bf16, kScratchIn);
  const void* win = weights_as(w, layout, bf16, kWeightConv);
  ensure(dx, x_shape, act_layout(x_shape));                          // (N, C, H, W)
  void* dxout = bf16 ? scratch(kScratchOut, static_cast<std::size_t>(x_shape.numel()) * 2) : dx.data();
  void* ws = workspace(e.data_ws);
  const float one = 1.0f, zero = 0.0f;
  WB_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, e.w, win, e.y, dyin, e.data_desc, e.data, ws, e.data_ws,
                                              &zero, e.x, dxout));
  if (bf16) {
    WB_CUDA_CHECK(kernels::convert(dxout, true, channels_last_, dx.data(), false, layout_of(dx) == Layout::nhwc,
                                   dims(x_shape), stream_));
  }
}

void CudaBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw,
                                          const Conv2dParams& p) {
  activate();
  check_conv2d_backward_weights(x, dy, dw, this);
  ConvEntry& e = conv_entry(*this, x.shape(), dw.shape(), p, "conv2d_backward_weights");
  if (!(dy.shape() == e.y_shape)) {
    throw BackendError("conv2d_backward_weights: dy must be " + e.y_shape.to_string() + " for " +
                       describe(x.shape(), dw.shape(), p) + ", got " + dy.shape().to_string());
  }
  if (!e.have_filter) find_filter(*this, e, describe(x.shape(), dw.shape(), p));
  const bool bf16 = precision_ == Precision::bf16;
  const Layout layout = channels_last_ ? Layout::nhwc : Layout::nchw;
  // cuDNN writes plain OIHW fp32 itself, into an aligned slice (see as_form).
  const bool direct = !bf16 && !channels_last_ && reinterpret_cast<std::uintptr_t>(dw.data()) % 16 == 0;
  const void* xin = as_form(x, layout, bf16, kScratchIn);
  const void* dyin = as_form(dy, layout, bf16, kScratchIn2);
  void* dwout = direct ? dw.data() : scratch(kScratchOut, static_cast<std::size_t>(dw.numel()) * (bf16 ? 2 : 4));
  void* ws = workspace(e.filter_ws);
  const float one = 1.0f, zero = 0.0f;
  WB_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, e.x, xin, e.y, dyin, e.filter_desc, e.filter, ws,
                                                e.filter_ws, &zero, e.w, dwout));
  if (!direct) {
    // (O, K, K, I) or bf16 back to the plain OIHW fp32 gradient slice.
    WB_CUDA_CHECK(kernels::convert(dwout, bf16, channels_last_, dw.data(), false, false, dims(dw.shape()), stream_));
  }
}

}  // namespace wb::backend::cuda
