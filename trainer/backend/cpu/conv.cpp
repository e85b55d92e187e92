// Convolution: forward, backward-data, backward-weights on oneDNN's direct convolution. Layouts are
// left to oneDNN ("any"); inputs in another layout are converted into a slot of a shared pool, weights
// through the per-update weight cache, and blocked weight gradients back to plain OIHW.
#include <string>

#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::backend::cpu {

using dnnl::memory;
using tag = memory::format_tag;

namespace {

struct ConvGeometry {
  memory::dims src, wei, dst, strides, pad;
};

ConvGeometry geometry(const Shape& x, const Shape& w, const Conv2dParams& p, const char* op) {
  const Shape y = conv2d_output_shape(x, w, p, op);
  return {{x[0], x[1], x[2], x[3]}, {w[0], w[1], w[2], w[3]}, {y[0], y[1], y[2], y[3]}, {p.stride, p.stride},
          {p.pad, p.pad}};
}

memory::desc any(const memory::dims& d) { return memory::desc(d, memory::data_type::f32, tag::any); }

dnnl::convolution_forward::desc fwd_desc(const ConvGeometry& g) {
  return dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                         any(g.src), any(g.wei), any(g.dst), g.strides, g.pad, g.pad);
}

struct ConvFwd final : Entry {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  memory::desc src, wei, dst;
  Shape y_shape;
  Slot src_slot;
};

struct ConvBwdData final : Entry {
  dnnl::convolution_backward_data::primitive_desc pd;
  dnnl::convolution_backward_data prim;
  memory::desc dsrc, wei, ddst;
  Slot ddst_slot;
};

struct ConvBwdWeights final : Entry {
  dnnl::convolution_backward_weights::primitive_desc pd;
  dnnl::convolution_backward_weights prim;
  memory::desc src, dwei, ddst;
  bool direct = false;  // the primitive writes plain OIHW itself
  Slot src_slot, ddst_slot, dwei_slot;  // dwei_slot: blocked gradient, converted into the plain slice
  dnnl::reorder to_plain;
};

// A convolution with a 1x1 output (layer4's 3x3 convolutions on 32x32 images): its weight gradient is
// dy^T times the one input window, unrolled (N, C*K*K) with zeros for padding, which is the plain OIHW
// gradient itself. oneDNN would run its im2col GEMM for it, about 20x slower, with a scratchpad of four
// weight copies per thread; this is one inner product straight into the gradient.
struct ConvBwdWeightsOneOutput final : Entry {
  dnnl::inner_product_backward_weights::primitive_desc pd;
  dnnl::inner_product_backward_weights prim;
  memory::desc x_plain, dy_plain;  // (N, C, H, W) and (N, O, 1, 1) plain
  memory src, ddst, dwei;          // (N, C*K*K) window, (N, O) view of dy, (O, C*K*K) view of dw
  Slot x_slot, ddst_slot, window_slot;
};

bool one_output(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const Shape y = conv2d_output_shape(x, w, p, "conv2d_backward_weights");
  return y[2] == 1 && y[3] == 1 && w[2] > 1;
}

CacheKey conv_key(std::int64_t op, const Shape& x, const Shape& w, const Conv2dParams& p) {
  CacheKey k;
  k.add(op).add(x).add(w).add(p.stride).add(p.pad);
  return k;
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const Conv2dParams& p) {
  apply_threads();
  check_f32(x, 4, "conv2d_forward", "x");
  check_f32(w, 4, "conv2d_forward", "w");
  CacheKey key = conv_key(kOpConvFwd, x.shape(), w.shape(), p);
  auto* e = static_cast<ConvFwd*>(find(key));
  if (!e) {
    auto g = geometry(x.shape(), w.shape(), p, "conv2d_forward");
    auto n = std::make_unique<ConvFwd>();
    n->pd = chosen(dnnl::convolution_forward::primitive_desc(fwd_desc(g), attr(), engine()));
    n->prim = dnnl::convolution_forward(n->pd);
    n->src = n->pd.src_desc();
    n->wei = n->pd.weights_desc();
    n->dst = n->pd.dst_desc();
    n->y_shape = Shape(g.dst);
    const auto& pd = n->pd;
    e = static_cast<ConvFwd*>(insert(key, std::move(n), pd));
  }
  if (!w.is_plain()) throw BackendError("conv2d_forward: w must be plain OIHW");
  const memory& src = as_layout(x, e->src, e->src_slot, SlotPool::src);
  const memory& wei = weights_as(w, e->wei, 0);
  ensure(y, e->y_shape, e->dst);
  execute(e->prim, *e, {{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DST, impl(y).mem.get()}});
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Shape& x_shape,
                                      const Conv2dParams& p) {
  apply_threads();
  check_f32(dy, 4, "conv2d_backward_data", "dy");
  check_f32(w, 4, "conv2d_backward_data", "w");
  CacheKey key = conv_key(kOpConvBwdData, x_shape, w.shape(), p);
  auto* e = static_cast<ConvBwdData*>(find(key));
  if (!e) {
    auto g = geometry(x_shape, w.shape(), p, "conv2d_backward_data");
    if (!(Shape(g.dst) == dy.shape())) {
      throw BackendError("conv2d_backward_data: dy is " + dy.shape().to_string() + ", the convolution of " +
                         x_shape.to_string() + " makes " + Shape(g.dst).to_string());
    }
    auto n = std::make_unique<ConvBwdData>();
    auto hint = chosen(dnnl::convolution_forward::primitive_desc(fwd_desc(g), attr(), engine()));
    dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, any(g.src), any(g.wei), any(g.dst),
                                            g.strides, g.pad, g.pad);
    n->pd = chosen(dnnl::convolution_backward_data::primitive_desc(d, attr(), engine(), hint));
    n->prim = dnnl::convolution_backward_data(n->pd);
    n->dsrc = n->pd.diff_src_desc();
    n->wei = n->pd.weights_desc();
    n->ddst = n->pd.diff_dst_desc();
    const auto& pd = n->pd;
    e = static_cast<ConvBwdData*>(insert(key, std::move(n), pd));
  }
  if (!(dy.shape() == Shape{x_shape[0], w.shape()[0], dy.shape()[2], dy.shape()[3]})) {
    throw BackendError("conv2d_backward_data: dy " + dy.shape().to_string() + " does not match w " +
                       w.shape().to_string());
  }
  const memory& ddst = as_layout(dy, e->ddst, e->ddst_slot, SlotPool::diff_dst);
  const memory& wei = weights_as(w, e->wei, 1);
  ensure(dx, x_shape, e->dsrc);
  execute(e->prim, *e,
          {{DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DIFF_SRC, impl(dx).mem.get()}});
}

void CpuBackend::conv2d_backward_weights_one_output(const Tensor& x, const Tensor& dy, const Tensor& dw,
                                                    const Conv2dParams& p) {
  const Shape& xs = x.shape();
  const Shape& ws = dw.shape();
  const std::int64_t n = xs[0], c = ws[1], o = ws[0], k = ws[2], h = xs[2], wd = xs[3], ckk = c * k * k;
  CacheKey key = conv_key(kOpConvBwdWeights, xs, ws, p);
  auto* e = static_cast<ConvBwdWeightsOneOutput*>(find(key));
  if (!e) {
    if (!(dy.shape() == Shape{n, o, 1, 1})) {
      throw BackendError("conv2d_backward_weights: dy is " + dy.shape().to_string() + ", the convolution of " +
                         xs.to_string() + " makes " + Shape{n, o, 1, 1}.to_string());
    }
    auto f32 = [](const memory::dims& d) { return memory::desc(d, memory::data_type::f32, tag::ab); };
    auto e_new = std::make_unique<ConvBwdWeightsOneOutput>();
    auto hint = chosen(dnnl::inner_product_forward::primitive_desc(
        dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, f32({n, ckk}), f32({o, ckk}),
                                          f32({n, o})),
        attr(), engine()));
    e_new->pd = chosen(dnnl::inner_product_backward_weights::primitive_desc(
        dnnl::inner_product_backward_weights::desc(f32({n, ckk}), f32({o, ckk}), f32({n, o})), attr(), engine(), hint));
    e_new->prim = dnnl::inner_product_backward_weights(e_new->pd);
    e_new->x_plain = plain_md(xs);
    e_new->dy_plain = plain_md(dy.shape());
    e_new->window_slot = make_slot(f32({n, ckk}), SlotPool::window);
    e_new->src = memory(f32({n, ckk}), engine(), nullptr);
    e_new->ddst = memory(f32({n, o}), engine(), nullptr);
    e_new->dwei = memory(f32({o, ckk}), engine(), nullptr);
    const auto& pd = e_new->pd;
    e = static_cast<ConvBwdWeightsOneOutput*>(insert(key, std::move(e_new), pd));
  }
  // The window of output (0, 0): rows -pad .. K-1-pad of the input, zero outside it.
  const auto* in = static_cast<const float*>(as_layout(x, e->x_plain, e->x_slot, SlotPool::src).get_data_handle());
  auto* win = static_cast<float*>(bind(e->window_slot).get_data_handle());
  for (std::int64_t i = 0; i < n * c; ++i) {
    for (std::int64_t kh = 0; kh < k; ++kh) {
      const std::int64_t r = kh - p.pad;
      for (std::int64_t kw = 0; kw < k; ++kw) {
        const std::int64_t col = kw - p.pad;
        win[(i * k + kh) * k + kw] = r >= 0 && r < h && col >= 0 && col < wd ? in[(i * h + r) * wd + col] : 0.0f;
      }
    }
  }
  e->src.set_data_handle(win);
  // (N, O, 1, 1) plain has the same bytes as (N, O) plain; (O, C, K, K) plain as (O, C*K*K).
  e->ddst.set_data_handle(as_layout(dy, e->dy_plain, e->ddst_slot, SlotPool::diff_dst).get_data_handle());
  e->dwei.set_data_handle(dw.data());
  execute(e->prim, *e, {{DNNL_ARG_SRC, e->src.get()}, {DNNL_ARG_DIFF_DST, e->ddst.get()}, {DNNL_ARG_DIFF_WEIGHTS, e->dwei.get()}});
}

void CpuBackend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Tensor& dw,
                                         const Conv2dParams& p) {
  apply_threads();
  check_conv2d_backward_weights(x, dy, dw, nullptr);
  if (one_output(x.shape(), dw.shape(), p)) {
    conv2d_backward_weights_one_output(x, dy, dw, p);
    return;
  }
  CacheKey key = conv_key(kOpConvBwdWeights, x.shape(), dw.shape(), p);
  auto* e = static_cast<ConvBwdWeights*>(find(key));
  if (!e) {
    auto g = geometry(x.shape(), dw.shape(), p, "conv2d_backward_weights");
    if (!(Shape(g.dst) == dy.shape())) {
      throw BackendError("conv2d_backward_weights: dy is " + dy.shape().to_string() + ", the convolution of " +
                         x.shape().to_string() + " makes " + Shape(g.dst).to_string());
    }
    auto n = std::make_unique<ConvBwdWeights>();
    auto hint = chosen(dnnl::convolution_forward::primitive_desc(fwd_desc(g), attr(), engine()));
    dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, any(g.src), any(g.wei),
                                               any(g.dst), g.strides, g.pad, g.pad);
    n->pd = chosen(dnnl::convolution_backward_weights::primitive_desc(d, attr(), engine(), hint));
    n->prim = dnnl::convolution_backward_weights(n->pd);
    n->src = n->pd.src_desc();
    n->dwei = n->pd.diff_weights_desc();
    n->ddst = n->pd.diff_dst_desc();
    n->direct = n->dwei == md(dw);
    if (!n->direct) {
      n->dwei_slot = make_slot(n->dwei, SlotPool::diff_weights);
      n->to_plain = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), n->dwei, engine(), md(dw)));
    }
    const auto& pd = n->pd;
    e = static_cast<ConvBwdWeights*>(insert(key, std::move(n), pd));
  }
  const memory& src = as_layout(x, e->src, e->src_slot, SlotPool::src);
  const memory& ddst = as_layout(dy, e->ddst, e->ddst_slot, SlotPool::diff_dst);
  const memory& out = e->direct ? impl(dw).mem : bind(e->dwei_slot);
  execute(e->prim, *e,
          {{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_DIFF_WEIGHTS, out.get()}});
  if (!e->direct) {
    std::int64_t t0 = now_ns();
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, bind(e->dwei_slot).get()}, {DNNL_ARG_TO, impl(dw).mem.get()}};
    reorder_raw(e->to_plain, args);
    stats_.weight_reorder_ns += now_ns() - t0;
    ++stats_.weight_reorders;
  }
}

}  // namespace wb::backend::cpu
