#pragma once
// The compute interface the model is written against: a handful of ops, each forward next to its
// backward. A backend owns the storage of every tensor it makes and chooses their layouts; callers see
// plain row-major data only through to_host / from_host.
//
// Output convention: an output passed as `Tensor&` is (re)allocated by the backend when it is undefined
// or not in the shape/layout the op produces, and reused as is otherwise. Callers keep their output
// tensors across steps, so after the first step no op allocates. An output passed as `const Tensor&`
// (gradient slices, running statistics) must already exist, plain, and is written in place.
//
// Parameters, gradients and momentum live in one plain buffer each; ops receive plain views of those
// buffers in the canonical torchvision layout (OIHW conv weights, [out, in] linear weights). A backend
// that prefers another weight layout converts internally and may cache the converted copy until the
// next write to parameter memory through the backend (sgd_update, from_host, copy, fill); code that
// writes parameter memory directly (an MPI broadcast into the buffer) calls params_written() afterwards.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "trainer/backend/tensor.hpp"

namespace wb::backend {

// Bad shapes, dtypes or arguments given to a backend call; the message names the op and what it expected.
class BackendError : public std::runtime_error {
 public:
  explicit BackendError(const std::string& what) : std::runtime_error(what) {}
};

// Square kernel taken from the weight's shape; dilation 1, one group, no bias (ResNet convs have none).
struct Conv2dParams {
  int stride = 1;
  int pad = 0;
};

struct Pool2dParams {
  int kernel = 3;
  int stride = 2;
  int pad = 1;
};

struct BatchNormParams {
  float eps = 1e-5f;
  float momentum = 0.1f;   // torch's convention: running = (1 - momentum) * running + momentum * batch
  bool fuse_relu = false;  // y = relu(bn(x)); the backward then applies the relu mask itself
};

// What batch-norm training forward saves for its backward. Content is backend-defined (the CPU backend
// keeps the batch mean, the biased batch variance and, with fuse_relu, the relu mask workspace).
struct BatchNormState {
  Tensor mean;
  Tensor var;
  Tensor workspace;
};

// Label smoothing conventions for softmax cross-entropy with smoothing s over K classes:
//   mindspore: target = one-hot with on_value 1 - s and off_value s / (K - 1)  (CrossEntropySmooth)
//   torch:     target = (1 - s) * one-hot + s / K           (nn.CrossEntropyLoss(label_smoothing=s))
enum class LossConvention { mindspore, torch };

struct LossParams {
  LossConvention convention = LossConvention::torch;
  float smoothing = 0.0f;
};

// One parameter tensor's slice of the contiguous buffers and whether weight decay applies to it.
struct ParamSegment {
  std::size_t offset = 0;
  std::size_t numel = 0;
  bool decay = false;
};

// torch.optim.SGD semantics (dampening 0): g' = g + wd * p (decay segments only); buf = m * buf + g'
// (buf = g' when first_step); g' = nesterov ? g' + m * buf : buf; p -= lr * g'. momentum 0 uses g'.
struct SgdParams {
  float lr = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- memory -------------------------------------------------------------------------------------
  // A plain, uninitialised tensor.
  virtual Tensor empty(const Shape& shape, DType dtype) = 0;
  // A plain tensor of `shape` that aliases base's storage from element `offset` on (base must be plain).
  virtual Tensor view(const Tensor& base, std::size_t offset, const Shape& shape) = 0;
  // Plain row-major host data <-> tensor, whatever the tensor's layout. Sizes must equal numel().
  virtual void from_host(const Tensor& dst, std::span<const float> src) = 0;
  virtual void from_host(const Tensor& dst, std::span<const std::int32_t> src) = 0;
  virtual void to_host(const Tensor& src, std::span<float> dst) = 0;
  virtual void to_host(const Tensor& src, std::span<std::int32_t> dst) = 0;
  // dst must exist with src's shape and dtype; the layout is converted when they differ.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, float value) = 0;
  // dst = scale * src (assign) or dst += scale * src, both plain f32 of the same numel: micro-batch
  // gradients accumulated into the step's gradient buffer (pipeline_step.cpp).
  virtual void accumulate(const Tensor& src, float scale, const Tensor& dst, bool assign) = 0;
  // Waits until every op issued so far has finished (a no-op on a synchronous backend).
  virtual void synchronize() = 0;
  // Parameter memory was written behind the backend's back: drop converted copies of weights.
  virtual void params_written() {}
  // Optional: the queue every op is issued on, as an opaque handle (a cudaStream_t on the CUDA
  // backend), so that device collectives can be ordered after it; null on a synchronous backend.
  virtual void* native_stream() { return nullptr; }
  // Whether a tensor dropped and allocated again costs next to nothing: the model then frees each
  // activation and activation gradient once backward has consumed it, instead of keeping one of each
  // per layer for the whole run. True on the CUDA backend (its caching allocator, ordered on the op
  // queue) and the CPU backend (its block cache, cpu/blocks.hpp, hands the same blocks back every step;
  // measured: the same step time, 0.91x PyTorch's peak on the demo config instead of 1.61x).
  virtual bool cheap_reallocation() const { return false; }

  // ---- convolution: x (N,C,H,W), w (O,C,K,K) plain OIHW, y (N,O,OH,OW) ------------------------------
  virtual void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const Conv2dParams& p) = 0;
  // dx gets x_shape.
  virtual void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Shape& x_shape,
                                    const Conv2dParams& p) = 0;
  // dw: plain OIHW, overwritten (not accumulated).
  virtual void conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw,
                                       const Conv2dParams& p) = 0;

  // ---- batch norm over (N, H, W) per channel; gamma, beta, running stats plain (C) ------------------
  // Normalises with the batch statistics and updates running_mean / running_var in place, the latter
  // with the unbiased variance n / (n - 1), as torch does.
  virtual void batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       BatchNormState& state, const BatchNormParams& p) = 0;
  virtual void batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      const BatchNormParams& p) = 0;
  // dgamma, dbeta: plain (C), overwritten. p.fuse_relu must match the forward call. beta does not enter
  // the gradients; oneDNN's primitive takes it as an argument all the same.
  virtual void batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                  const BatchNormState& state, Tensor& dx, const Tensor& dgamma,
                                  const Tensor& dbeta, const BatchNormParams& p) = 0;

  // ---- synchronised batch norm (SyncBatchNorm): one batch spread over several processes ---------------
  // The caller sums the partial results over the processes between the calls, as PyTorch's SyncBatchNorm
  // does: forward = batchnorm_sums, allreduce, batchnorm_forward_with_stats; backward =
  // batchnorm_backward_reduce, allreduce, batchnorm_backward_elemt. The sums are host doubles. A backend
  // without them throws BackendError naming itself.
  //
  // This process's per-channel sums over (N, H, W), accumulated in double: sums has 2C entries,
  // sums[c] = sum of x, sums[C + c] = sum of x^2.
  virtual void batchnorm_sums(const Tensor& x, std::span<double> sums);
  // Normalises x with the whole batch's mean and biased variance (C each; `count` values per channel
  // over every process), keeps them in `state` for the backward, and updates the running statistics
  // with the unbiased variance count / (count - 1), as torch's SyncBatchNorm does.
  virtual void batchnorm_forward_with_stats(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                            const Tensor& running_mean, const Tensor& running_var,
                                            std::span<const double> mean, std::span<const double> var,
                                            std::int64_t count, BatchNormState& state, const BatchNormParams& p);
  // The local half of the backward: dgamma, dbeta of this process's part of the batch (the data-parallel
  // allreduce averages them like any gradient) and sums (2C): sums[c] = sum of dy, sums[C + c] = sum of
  // dy * (x - mean), with dy after the relu mask when fused. dx holds an intermediate value until
  // batchnorm_backward_elemt completes it.
  virtual void batchnorm_backward_reduce(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                         const BatchNormState& state, Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta, std::span<double> sums, const BatchNormParams& p);
  // Completes dx from the sums over every process (2C, as batchnorm_backward_reduce gives them) and the
  // whole batch's count per channel.
  virtual void batchnorm_backward_elemt(const Tensor& x, const Tensor& gamma, const BatchNormState& state, Tensor& dx,
                                        std::span<const double> sums, std::int64_t count, const BatchNormParams& p);

  // ---- elementwise --------------------------------------------------------------------------------
  // y may be the same tensor as x (in place).
  virtual void relu_forward(const Tensor& x, Tensor& y) = 0;
  // From the relu's output y: dx = dy * (y > 0). dx may be the same tensor as dy.
  virtual void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;
  // y = a + b, or relu(a + b) with relu set; y may be the same tensor as a.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y, bool relu) = 0;

  // ---- pooling ------------------------------------------------------------------------------------
  // Max pooling with implicit -inf padding and floor output size; workspace records the argmax.
  virtual void maxpool_forward(const Tensor& x, Tensor& y, Tensor& workspace, const Pool2dParams& p) = 0;
  // x, y: the forward's input and output (a backend may read them; the CPU one takes x's layout for dx).
  virtual void maxpool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace,
                                Tensor& dx, const Pool2dParams& p) = 0;
  // y (N,C,1,1) = mean over H, W.
  virtual void global_avgpool_forward(const Tensor& x, Tensor& y) = 0;
  // x: the forward's input; dx gets its shape.
  virtual void global_avgpool_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;

  // ---- linear: y (N,OUT) = x W^T + b with x (N,IN) or (N,IN,1,1), W plain (OUT,IN), b plain (OUT) -----
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) = 0;
  // dx gets x's shape; dw, db overwritten.
  virtual void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                               const Tensor& dw, const Tensor& db) = 0;

  // ---- loss: logits (N,K) f32, labels (N) i32 in [0, K) ----------------------------------------------
  // loss (1) = mean over the batch of -sum_k target_k * log_softmax(logits)_k; probs (N,K) keeps the
  // softmax for the backward.
  virtual void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const LossParams& p,
                                             Tensor& loss, Tensor& probs) = 0;
  // dlogits = (probs - target) / N.
  virtual void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const LossParams& p,
                                              Tensor& dlogits) = 0;

  // ---- optimizer: one fused momentum-SGD update over the contiguous buffers -------------------------
  virtual void sgd_update(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                          std::span<const ParamSegment> segments, const SgdParams& p) = 0;
};

struct CpuOptions {
  int threads = 0;  // OpenMP threads for every op; 0 keeps the OpenMP default
  // oneDNN's reference implementations (plain loops, "ref:any") instead of its fastest: the same
  // arithmetic summed in another order, slowly. wb estimate-noise replays a step with them.
  bool reference_kernels = false;
};

// The oneDNN backend (trainer/backend/cpu/).
std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& options = {});

// Arithmetic of the CUDA backend's convolutions and classifier. fp32: FMA-only kernels, no TF32 (the
// accuracy mode, comparable with the CPU backend). tf32: TF32 tensor cores for conv and linear. bf16:
// conv and linear compute on bf16 copies of their inputs and weights with fp32 accumulation; activations,
// parameters (the fp32 master copy), batch-norm statistics and the loss stay fp32.
enum class Precision { fp32, tf32, bf16 };

struct CudaOptions {
  int device = 0;
  Precision precision = Precision::fp32;
  bool channels_last = false;  // activations NHWC inside the backend (is_plain() false); weights stay OIHW
};

// Number of usable CUDA devices: 0 when built without CUDA or when no driver or device is present.
// Never throws.
int cuda_device_count();
// Whether this build has the CUDA backend (make_cuda_backend can succeed where a device exists).
bool have_cuda_backend();

// What a run file records of a CUDA device (cudaDeviceProp).
struct CudaDeviceInfo {
  std::string name;               // "NVIDIA H100 80GB HBM3"
  std::int64_t memory_bytes = 0;  // totalGlobalMem
  int compute_major = 0;          // 9 on Hopper
};

// CUDA device `device`'s properties. Throws BackendError when it cannot be queried, or in a build
// without CUDA.
CudaDeviceInfo cuda_device_info(int device);

// The cuDNN + cuBLAS backend (trainer/backend/cuda/). Throws BackendError "built without CUDA",
// "no CUDA device" or "device N out of range".
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options = {});

}  // namespace wb::backend
