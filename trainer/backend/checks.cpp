// Backend-independent argument checks and output shapes (see checks.hpp). The messages are part of the
// backends' behaviour: callers and tests match on them, so both backends produce them from here.
#include "trainer/backend/checks.hpp"

namespace wb::backend {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

void check_channels(const Tensor& t, std::int64_t c, const char* op, const char* what, const Backend* owner) {
  check_f32(t, 1, op, what, owner);
  if (t.shape()[0] != c || !t.is_plain()) {
    throw BackendError(std::string(op) + ": " + what + " must be plain (" + str(c) + "), got " + t.shape().to_string());
  }
}

// x (N,IN) or (N,IN,1,1) and a plain w (OUT,IN) that fits it.
LinearDims check_linear(const Tensor& x, const Tensor& w, const char* op, const Backend* owner) {
  check_f32(x, 0, op, "x", owner);
  check_f32(w, 2, op, "w", owner);
  const Shape& xs = x.shape();
  const bool ok = xs.rank() == 2 || (xs.rank() == 4 && xs[2] == 1 && xs[3] == 1);
  if (!ok) throw BackendError(std::string(op) + ": x must be (N,IN) or (N,IN,1,1), got " + xs.to_string());
  if (w.shape()[1] != xs[1]) {
    throw BackendError(std::string(op) + ": weight " + w.shape().to_string() + " does not fit x " + xs.to_string());
  }
  if (!w.is_plain()) throw BackendError(std::string(op) + ": w must be plain (OUT,IN)");
  return {xs[0], xs[1], w.shape()[0]};
}

}  // namespace

// ---- tensors and memory -----------------------------------------------------------------------------

void check_f32(const Tensor& t, int rank, const char* op, const char* what, const Backend* owner) {
  if (!t.defined()) throw BackendError(std::string(op) + ": " + what + " is undefined");
  if (owner && t.backend() != owner) {
    throw BackendError(std::string(op) + ": " + what + " " + t.shape().to_string() +
                       " belongs to another backend (expected one made by this " + std::string(owner->name()) +
                       " backend)");
  }
  if (t.dtype() != DType::f32) {
    throw BackendError(std::string(op) + ": " + what + " must be f32, got " + dtype_name(t.dtype()));
  }
  if (rank > 0 && t.shape().rank() != rank) {
    throw BackendError(std::string(op) + ": " + what + " must have " + std::to_string(rank) + " dimensions, got " +
                       t.shape().to_string());
  }
}

void check_dtype(const Tensor& t, DType want, std::string_view backend, const char* what) {
  if (t.dtype() != want) {
    throw BackendError(std::string(backend) + " backend " + what + ": tensor is " + dtype_name(t.dtype()) +
                       ", expected " + dtype_name(want));
  }
}

void check_host_transfer(const Tensor& t, DType want, std::size_t host_elements, std::string_view backend,
                         const char* what) {
  check_dtype(t, want, backend, what);
  if (host_elements != static_cast<std::size_t>(t.numel())) {
    throw BackendError(std::string(backend) + " backend " + what + ": host buffer has " +
                       std::to_string(host_elements) + " elements, tensor " + t.shape().to_string() + " has " +
                       str(t.numel()));
  }
}

void check_copy(const Tensor& src, const Tensor& dst, std::string_view backend) {
  if (!(src.shape() == dst.shape()) || src.dtype() != dst.dtype()) {
    throw BackendError(std::string(backend) + " backend copy: source " + src.shape().to_string() + " " +
                       dtype_name(src.dtype()) + " and destination " + dst.shape().to_string() + " " +
                       dtype_name(dst.dtype()) + " differ");
  }
}

void check_accumulate(const Tensor& src, const Tensor& dst, std::string_view backend) {
  if (src.dtype() != DType::f32 || dst.dtype() != DType::f32 || !src.is_plain() || !dst.is_plain() ||
      src.numel() != dst.numel()) {
    throw BackendError(std::string(backend) + " backend accumulate: source " + src.shape().to_string() + " " +
                       dtype_name(src.dtype()) + " and destination " + dst.shape().to_string() + " " +
                       dtype_name(dst.dtype()) + " must be plain f32 of the same size");
  }
}

std::size_t check_view(const TensorImpl& base, std::size_t offset, const Shape& shape, std::string_view backend) {
  if (!base.plain) {
    throw BackendError(std::string(backend) + " backend view: the base tensor " + base.shape.to_string() +
                       " is not plain");
  }
  const std::size_t n = static_cast<std::size_t>(shape.numel());
  if (offset + n > static_cast<std::size_t>(base.shape.numel())) {
    throw BackendError(std::string(backend) + " backend view: elements [" + std::to_string(offset) + ", " +
                       std::to_string(offset + n) + ") exceed the base tensor's " + str(base.shape.numel()));
  }
  return n;
}

// ---- shapes -----------------------------------------------------------------------------------------

Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p, const char* op) {
  if (x.rank() != 4 || w.rank() != 4) {
    throw BackendError(std::string(op) + ": expected x (N,C,H,W) and w (O,C,K,K), got x " + x.to_string() + " w " +
                       w.to_string());
  }
  if (w[1] != x[1] || w[2] != w[3]) {
    throw BackendError(std::string(op) + ": weight " + w.to_string() + " does not fit input " + x.to_string() +
                       " (need w[1] == C and a square kernel)");
  }
  if (p.stride < 1 || p.pad < 0) {
    throw BackendError(std::string(op) + ": stride must be >= 1 and pad >= 0, got stride " + std::to_string(p.stride) +
                       " pad " + std::to_string(p.pad));
  }
  if (x[2] + 2 * p.pad < w[2] || x[3] + 2 * p.pad < w[3]) {
    throw BackendError(std::string(op) + ": kernel " + str(w[2]) + " is larger than the padded input " +
                       x.to_string());
  }
  return Shape{x[0], w[0], (x[2] + 2 * p.pad - w[2]) / p.stride + 1, (x[3] + 2 * p.pad - w[3]) / p.stride + 1};
}

Shape maxpool_output_shape(const Shape& x, const Pool2dParams& p, const char* op) {
  if (p.kernel < 1 || p.stride < 1 || p.pad < 0 || 2 * p.pad > p.kernel) {
    throw BackendError(std::string(op) + ": need kernel >= 1, stride >= 1, 0 <= pad <= kernel / 2; got kernel " +
                       std::to_string(p.kernel) + " stride " + std::to_string(p.stride) + " pad " +
                       std::to_string(p.pad));
  }
  if (x[2] + 2 * p.pad < p.kernel || x[3] + 2 * p.pad < p.kernel) {
    throw BackendError(std::string(op) + ": kernel " + std::to_string(p.kernel) + " is larger than the padded input " +
                       x.to_string());
  }
  return Shape{x[0], x[1], (x[2] + 2 * p.pad - p.kernel) / p.stride + 1, (x[3] + 2 * p.pad - p.kernel) / p.stride + 1};
}

// ---- op arguments -----------------------------------------------------------------------------------

void check_conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw, const Backend* owner) {
  check_f32(x, 4, "conv2d_backward_weights", "x", owner);
  check_f32(dy, 4, "conv2d_backward_weights", "dy", owner);
  check_f32(dw, 4, "conv2d_backward_weights", "dw", owner);
  if (!dw.is_plain()) throw BackendError("conv2d_backward_weights: dw must be plain OIHW");
}

void check_relu_backward(const Tensor& y, const Tensor& dy, const Backend* owner) {
  check_f32(y, 0, "relu_backward", "y", owner);
  check_f32(dy, 0, "relu_backward", "dy", owner);
  if (!(y.shape() == dy.shape())) {
    throw BackendError("relu_backward: dy " + dy.shape().to_string() + " differs from y " + y.shape().to_string());
  }
}

void check_add(const Tensor& a, const Tensor& b, const Backend* owner) {
  check_f32(a, 0, "add", "a", owner);
  check_f32(b, 0, "add", "b", owner);
  if (!(a.shape() == b.shape())) {
    throw BackendError("add: shapes differ, a " + a.shape().to_string() + " b " + b.shape().to_string());
  }
}

void check_global_avgpool_backward(const Tensor& x, const Tensor& dy, const Backend* owner) {
  check_f32(x, 4, "global_avgpool_backward", "x", owner);
  check_f32(dy, 4, "global_avgpool_backward", "dy", owner);
  const Shape& xs = x.shape();
  if (!(dy.shape() == Shape{xs[0], xs[1], 1, 1})) {
    throw BackendError("global_avgpool_backward: dy must be (N,C,1,1) for x " + xs.to_string() + ", got " +
                       dy.shape().to_string());
  }
}

std::int64_t check_batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                     const Tensor& running_mean, const Tensor& running_var, const char* op,
                                     const Backend* owner) {
  check_f32(x, 4, op, "x", owner);
  const std::int64_t c = x.shape()[1];
  check_channels(gamma, c, op, "gamma", owner);
  check_channels(beta, c, op, "beta", owner);
  check_channels(running_mean, c, op, "running_mean", owner);
  check_channels(running_var, c, op, "running_var", owner);
  return c;
}

void check_batchnorm_batch(const Shape& x, const char* op) {
  if (x[0] * x[2] * x[3] < 2) {
    throw BackendError(std::string(op) + ": need more than one value per channel, got input " + x.to_string());
  }
}

std::int64_t check_batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& dgamma, const Tensor& dbeta, const Backend* owner) {
  const char* op = "batchnorm_backward";
  check_f32(x, 4, op, "x", owner);
  check_f32(dy, 4, op, "dy", owner);
  const Shape& xs = x.shape();
  if (!(dy.shape() == xs)) {
    throw BackendError(std::string(op) + ": dy " + dy.shape().to_string() + " differs from x " + xs.to_string());
  }
  const std::int64_t c = xs[1];
  check_channels(gamma, c, op, "gamma", owner);
  check_channels(beta, c, op, "beta", owner);
  check_channels(dgamma, c, op, "dgamma", owner);
  check_channels(dbeta, c, op, "dbeta", owner);
  return c;
}

LinearDims check_linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Backend* owner) {
  const LinearDims d = check_linear(x, w, "linear_forward", owner);
  check_f32(b, 1, "linear_forward", "b", owner);
  if (b.shape()[0] != d.out || !b.is_plain()) {
    throw BackendError("linear_forward: bias must be plain (" + str(d.out) + "), got " + b.shape().to_string());
  }
  return d;
}

LinearDims check_linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dw,
                                 const Tensor& db, const Backend* owner) {
  const LinearDims d = check_linear(x, w, "linear_backward", owner);
  check_f32(dy, 2, "linear_backward", "dy", owner);
  check_f32(dw, 2, "linear_backward", "dw", owner);
  check_f32(db, 1, "linear_backward", "db", owner);
  if (!(dy.shape() == Shape{d.n, d.out}) || !(dw.shape() == w.shape()) || db.shape()[0] != d.out || !dw.is_plain() ||
      !db.is_plain()) {
    throw BackendError("linear_backward: expected dy (" + str(d.n) + ", " + str(d.out) +
                       "), plain dw like w and plain db (" + str(d.out) + "); got dy " + dy.shape().to_string() +
                       " dw " + dw.shape().to_string() + " db " + db.shape().to_string());
  }
  return d;
}

LossTargets loss_targets(const LossParams& p, std::int64_t classes, const char* op) {
  if (!(p.smoothing >= 0.0f && p.smoothing < 1.0f)) {
    throw BackendError(std::string(op) + ": label smoothing must be in [0, 1), got " + std::to_string(p.smoothing));
  }
  if (p.convention == LossConvention::mindspore) {
    if (classes < 2 && p.smoothing > 0.0f) {
      throw BackendError(std::string(op) + ": mindspore smoothing needs >= 2 classes");
    }
    const float off = classes > 1 ? p.smoothing / static_cast<float>(classes - 1) : 0.0f;
    return {1.0f - p.smoothing, off};
  }
  const float off = p.smoothing / static_cast<float>(classes);
  return {1.0f - p.smoothing + off, off};
}

void check_logits(const Tensor& logits, const char* op, const Backend* owner) {
  check_f32(logits, 2, op, "logits", owner);
  if (!logits.is_plain()) throw BackendError(std::string(op) + ": logits must be plain (N,K)");
}

void check_labels(const Tensor& labels, std::int64_t n, const char* op, const Backend* owner) {
  if (!labels.defined() || labels.dtype() != DType::i32 || labels.shape().rank() != 1 || labels.shape()[0] != n ||
      (owner && labels.backend() != owner)) {
    throw BackendError(std::string(op) + ": labels must be i32 (" + str(n) + ")" + (owner ? " on this backend" : ""));
  }
}

void check_label_range(std::span<const std::int32_t> labels, std::int64_t classes, const char* op) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= classes) {
      throw BackendError(std::string(op) + ": label " + std::to_string(labels[i]) + " at batch index " +
                         std::to_string(i) + " is outside [0, " + str(classes) + ")");
    }
  }
}

std::size_t check_sgd_buffers(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                              const Backend* owner) {
  for (const Tensor* t : {&params, &grads, &momentum}) {
    check_f32(*t, 0, "sgd_update", "buffer", owner);
    if (!t->is_plain()) throw BackendError("sgd_update: buffers must be plain");
  }
  const std::size_t total = static_cast<std::size_t>(params.numel());
  if (static_cast<std::size_t>(grads.numel()) != total || static_cast<std::size_t>(momentum.numel()) != total) {
    throw BackendError("sgd_update: params, grads and momentum differ in size (" + std::to_string(total) + ", " +
                       str(grads.numel()) + ", " + str(momentum.numel()) + ")");
  }
  return total;
}

void check_sgd_segments(std::span<const ParamSegment> segments, std::size_t total) {
  for (const auto& s : segments) {
    if (s.offset + s.numel > total) {
      throw BackendError("sgd_update: segment [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.numel) +
                         ") is outside the " + std::to_string(total) + "-element buffers");
    }
  }
}

}  // namespace wb::backend
