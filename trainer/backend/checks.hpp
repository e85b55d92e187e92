#pragma once
// Argument checks and shape arithmetic that every backend applies the same way before it reaches its
// own memory descriptors: so that the CPU reference and the CUDA backend reject the same calls with the
// same message and agree on every output shape. Each check throws BackendError naming the op and what
// it expected.
//
// `owner`: a backend that passes itself also rejects tensors made by another backend (with a message
// naming it); nullptr leaves that to the backend's own impl lookup. `backend`: the name that begins the
// messages of the memory calls ("cpu backend view: ...").

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "trainer/backend/backend.hpp"

namespace wb::backend {

// ---- tensors and memory -----------------------------------------------------------------------------

// An f32 tensor with `rank` dimensions (0: any rank). With `owner`, made by that backend.
void check_f32(const Tensor& t, int rank, const char* op, const char* what, const Backend* owner = nullptr);

// t's implementation as the backend's own type; throws when t is undefined or another backend's.
template <class Impl>
Impl& impl_as(const Tensor& t, std::string_view backend) {
  if (!t.defined()) throw BackendError(std::string(backend) + " backend: an input tensor is undefined");
  auto* p = dynamic_cast<Impl*>(t.impl());
  if (!p) {
    throw BackendError(std::string(backend) + " backend: tensor " + t.shape().to_string() +
                       " belongs to another backend");
  }
  return *p;
}

// Backend::from_host, to_host, fill: the tensor's element type.
void check_dtype(const Tensor& t, DType want, std::string_view backend, const char* what);
// Backend::from_host, to_host: the element type and a host buffer of exactly t.numel() elements.
void check_host_transfer(const Tensor& t, DType want, std::size_t host_elements, std::string_view backend,
                         const char* what);
// Backend::copy: source and destination of one shape and dtype.
void check_copy(const Tensor& src, const Tensor& dst, std::string_view backend);
// accumulate: both plain f32 with the same number of elements.
void check_accumulate(const Tensor& src, const Tensor& dst, std::string_view backend);
// Backend::view: a plain base holding elements [offset, offset + shape.numel()); returns that count.
std::size_t check_view(const TensorImpl& base, std::size_t offset, const Shape& shape, std::string_view backend);

// A plain view of `base` (the backend's own impl type, with a `storage` handle that keeps the block
// alive) from element `offset` on, owned by `owner`. Backends add their layout description.
template <class Impl>
std::shared_ptr<Impl> make_view_impl(const Impl& base, std::size_t offset, const Shape& shape, const Backend& owner) {
  const std::size_t n = check_view(base, offset, shape, owner.name());
  auto t = std::make_shared<Impl>();
  t->shape = shape;
  t->dtype = base.dtype;
  t->owner = &owner;
  t->storage = base.storage;
  t->data = static_cast<char*>(base.data) + offset * dtype_size(base.dtype);
  t->bytes = n * dtype_size(base.dtype);
  t->plain = true;
  return t;
}

// ---- shapes -----------------------------------------------------------------------------------------

// (N, O, OH, OW) of the convolution of x (N,C,H,W) with w (O,C,K,K): square kernel, floor output size.
Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p, const char* op);
// (N, C, OH, OW) of max pooling x (N,C,H,W) with implicit padding and floor output size (torch's).
Shape maxpool_output_shape(const Shape& x, const Pool2dParams& p, const char* op);

// ---- op arguments -----------------------------------------------------------------------------------

// conv2d_backward_weights: f32 x, dy (4-D) and a plain f32 dw (OIHW) to write the gradient into.
void check_conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Backend* owner);

// relu_backward: f32 y and dy of one shape.
void check_relu_backward(const Tensor& y, const Tensor& dy, const Backend* owner);
// add: f32 a and b of one shape.
void check_add(const Tensor& a, const Tensor& b, const Backend* owner);
// global_avgpool_backward: f32 x (N,C,H,W) and dy (N,C,1,1).
void check_global_avgpool_backward(const Tensor& x, const Tensor& dy, const Backend* owner);

// Batch norm forward: f32 x (N,C,H,W) and plain f32 (C) gamma, beta, running_mean, running_var; returns C.
std::int64_t check_batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                     const Tensor& running_mean, const Tensor& running_var, const char* op,
                                     const Backend* owner);
// Training statistics need at least two values per channel (the unbiased variance divides by n - 1).
void check_batchnorm_batch(const Shape& x, const char* op);
// batchnorm_backward: f32 x and dy (N,C,H,W) alike and plain f32 (C) gamma, beta, dgamma, dbeta; returns C.
std::int64_t check_batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& dgamma, const Tensor& dbeta, const Backend* owner);

// The classifier's sizes: x (N,IN) or (N,IN,1,1), w (OUT,IN).
struct LinearDims {
  std::int64_t n = 0, in = 0, out = 0;
};
// linear_forward: f32 x, plain w (OUT,IN) that fits x, plain bias (OUT).
LinearDims check_linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Backend* owner);
// linear_backward: as the forward, with dy (N,OUT), plain dw like w and plain db (OUT).
LinearDims check_linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw,
                                 const Tensor& db, const Backend* owner);

// Per-class target values of softmax cross-entropy with label smoothing (see LossConvention).
struct LossTargets {
  float on = 1.0f;   // the labelled class
  float off = 0.0f;  // every other class
};
LossTargets loss_targets(const LossParams& p, std::int64_t classes, const char* op);
// Plain f32 logits (or probabilities) (N,K).
void check_logits(const Tensor& logits, const char* op, const Backend* owner);
// i32 labels (n); with `owner`, made by it.
void check_labels(const Tensor& labels, std::int64_t n, const char* op, const Backend* owner);
// Every label in [0, classes); the message names the first that is not and its batch index.
void check_label_range(std::span<const std::int32_t> labels, std::int64_t classes, const char* op);

// sgd_update: plain f32 params, grads and momentum of one size; returns it.
std::size_t check_sgd_buffers(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                              const Backend* owner);
// Every segment inside the `total`-element buffers.
void check_sgd_segments(std::span<const ParamSegment> segments, std::size_t total);

}  // namespace wb::backend
