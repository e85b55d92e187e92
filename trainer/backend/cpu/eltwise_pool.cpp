// ReLU, residual add (optionally with the block's ReLU fused as a post-op), max pooling and global
// average pooling, all in the input's own layout.
#include <string>

#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::backend::cpu {

using dnnl::memory;

namespace {

struct ReluFwd final : Entry {
  dnnl::eltwise_forward::primitive_desc pd;
  dnnl::eltwise_forward prim;
  memory::desc dst;
};

struct ReluBwd final : Entry {
  dnnl::eltwise_backward::primitive_desc pd;
  dnnl::eltwise_backward prim;
  memory::desc data, dsrc;
  Slot ddst_slot;
};

struct AddEntry final : Entry {
  dnnl::binary::primitive_desc pd;
  dnnl::binary prim;
  memory::desc b, dst;  // the primitive's own src_1 and dst descriptors
  Slot b_slot;
};

struct PoolFwd final : Entry {
  dnnl::pooling_forward::primitive_desc pd;
  dnnl::pooling_forward prim;
  memory::desc dst, ws;
  Shape y_shape, ws_shape;
};

struct PoolBwd final : Entry {
  dnnl::pooling_backward::primitive_desc pd;
  dnnl::pooling_backward prim;
  memory::desc ddst, dsrc;
  Slot ddst_slot;
};

struct PoolGeometry {
  memory::dims dst, strides, kernel, pad_l, pad_r;
};

PoolGeometry max_geometry(const Shape& x, const Pool2dParams& p) {
  const Shape y = maxpool_output_shape(x, p, "maxpool");
  const std::int64_t oh = y[2], ow = y[3];
  // Right padding such that oneDNN's output size equals torch's floor-mode size exactly.
  std::int64_t rh = (oh - 1) * p.stride + p.kernel - x[2] - p.pad;
  std::int64_t rw = (ow - 1) * p.stride + p.kernel - x[3] - p.pad;
  return {{x[0], x[1], oh, ow}, {p.stride, p.stride}, {p.kernel, p.kernel}, {p.pad, p.pad},
          {std::max<std::int64_t>(rh, 0), std::max<std::int64_t>(rw, 0)}};
}

PoolGeometry gap_geometry(const Shape& x) { return {{x[0], x[1], 1, 1}, {1, 1}, {x[2], x[3]}, {0, 0}, {0, 0}}; }

// True when a blocked layout pads the channel dimension (5 channels in an nChw16c block, say).
bool pads_channels(const memory::desc& m) { return m.data.ndims > 1 && m.data.padded_dims[1] != m.data.dims[1]; }

memory::desc any(const memory::dims& d) { return memory::desc(d, memory::data_type::f32, memory::format_tag::any); }

}  // namespace

void CpuBackend::relu_forward(const Tensor& x, Tensor& y) {
  apply_threads();
  check_f32(x, 0, "relu_forward", "x");
  CacheKey key;
  key.add(kOpReluFwd).add(x.shape()).add(impl(x).layout_id);
  auto* e = static_cast<ReluFwd*>(find(key));
  if (!e) {
    auto n = std::make_unique<ReluFwd>();
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu, md(x), 0.0f);
    n->pd = chosen(dnnl::eltwise_forward::primitive_desc(d, attr(), engine()));
    n->prim = dnnl::eltwise_forward(n->pd);
    n->dst = n->pd.dst_desc();
    const auto& pd = n->pd;
    e = static_cast<ReluFwd*>(insert(key, std::move(n), pd));
  }
  const memory& src = impl(x).mem;  // read before y may be reallocated
  if (y.impl() != x.impl()) ensure(y, x.shape(), e->dst);
  execute(e->prim, *e, {{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_DST, impl(y).mem.get()}});
}

void CpuBackend::relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  apply_threads();
  check_relu_backward(y, dy, nullptr);
  CacheKey key;
  key.add(kOpReluBwd).add(y.shape()).add(impl(y).layout_id);
  auto* e = static_cast<ReluBwd*>(find(key));
  if (!e) {
    auto n = std::make_unique<ReluBwd>();
    auto alg = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
    auto hint = chosen(dnnl::eltwise_forward::primitive_desc(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, md(y), 0.0f), attr(), engine()));
    dnnl::eltwise_backward::desc d(alg, md(y), md(y), 0.0f);
    n->pd = chosen(dnnl::eltwise_backward::primitive_desc(d, attr(), engine(), hint));
    n->prim = dnnl::eltwise_backward(n->pd);
    n->data = n->pd.diff_dst_desc();
    n->dsrc = n->pd.diff_src_desc();
    const auto& pd = n->pd;
    e = static_cast<ReluBwd*>(insert(key, std::move(n), pd));
  }
  const memory& ddst = as_layout(dy, e->data, e->ddst_slot, SlotPool::diff_dst);
  bool in_place = dx.impl() == dy.impl() && &ddst == &impl(dy).mem;
  if (!in_place) ensure(dx, y.shape(), e->dsrc);
  execute(e->prim, *e,
          {{DNNL_ARG_DST, impl(y).mem.get()}, {DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_DIFF_SRC, impl(dx).mem.get()}});
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  apply_threads();
  check_add(a, b, nullptr);
  // oneDNN 2.6's AVX2 and SSE4.1 binary kernels apply an eltwise post-op wrongly, and store a vector
  // past the end of dst, when a blocked layout pads the channels (measured: nChw16c with 5, 9 or 13
  // channels; rel-L2 0.47 from PyTorch). There the ReLU runs as its own primitive after the add.
  const bool fuse = relu && !pads_channels(md(a));
  CacheKey key;
  key.add(kOpAdd).add(a.shape()).add(impl(a).layout_id).add(fuse);
  auto* e = static_cast<AddEntry*>(find(key));
  if (!e) {
    auto n = std::make_unique<AddEntry>();
    dnnl::binary::desc d(dnnl::algorithm::binary_add, md(a), md(a), md(a));
    n->pd = chosen(dnnl::binary::primitive_desc(d, attr(fuse), engine()));
    n->prim = dnnl::binary(n->pd);
    n->b = n->pd.src_desc(1);
    n->dst = n->pd.dst_desc();
    const auto& pd = n->pd;
    e = static_cast<AddEntry*>(insert(key, std::move(n), pd));
  }
  const memory& src0 = impl(a).mem;
  const memory& src1 = as_layout(b, e->b, e->b_slot, SlotPool::src);
  if (y.impl() != a.impl()) {
    if (y.impl() == b.impl() && &src1 == &impl(b).mem) {
      // y aliases b in the same layout: in place on b is fine for an elementwise op.
    } else {
      ensure(y, a.shape(), e->dst);
    }
  }
  execute(e->prim, *e, {{DNNL_ARG_SRC_0, src0.get()}, {DNNL_ARG_SRC_1, src1.get()}, {DNNL_ARG_DST, impl(y).mem.get()}});
  if (relu && !fuse) relu_forward(y, y);
}

void CpuBackend::maxpool_forward(const Tensor& x, Tensor& y, Tensor& workspace, const Pool2dParams& p) {
  apply_threads();
  check_f32(x, 4, "maxpool_forward", "x");
  CacheKey key;
  key.add(kOpMaxFwd).add(x.shape()).add(impl(x).layout_id).add(p.kernel).add(p.stride).add(p.pad);
  auto* e = static_cast<PoolFwd*>(find(key));
  if (!e) {
    auto g = max_geometry(x.shape(), p);
    auto n = std::make_unique<PoolFwd>();
    dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, md(x), any(g.dst),
                                  g.strides, g.kernel, g.pad_l, g.pad_r);
    n->pd = chosen(dnnl::pooling_forward::primitive_desc(d, attr(), engine()));
    n->prim = dnnl::pooling_forward(n->pd);
    n->dst = n->pd.dst_desc();
    n->ws = n->pd.workspace_desc();
    n->y_shape = Shape(g.dst);
    n->ws_shape = Shape{static_cast<std::int64_t>(n->ws.get_size())};
    const auto& pd = n->pd;
    e = static_cast<PoolFwd*>(insert(key, std::move(n), pd));
  }
  ensure(y, e->y_shape, e->dst);
  ensure(workspace, e->ws_shape, e->ws);  // opaque argmax bytes; the shape counts bytes
  execute(e->prim, *e,
          {{DNNL_ARG_SRC, impl(x).mem.get()}, {DNNL_ARG_DST, impl(y).mem.get()},
           {DNNL_ARG_WORKSPACE, impl(workspace).mem.get()}});
}

void CpuBackend::maxpool_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& workspace,
                                  Tensor& dx, const Pool2dParams& p) {
  apply_threads();
  check_f32(x, 4, "maxpool_backward", "x");
  check_f32(dy, 4, "maxpool_backward", "dy");
  if (!(dy.shape() == y.shape())) {
    throw BackendError("maxpool_backward: dy " + dy.shape().to_string() + " differs from y " + y.shape().to_string());
  }
  CacheKey key;
  key.add(kOpMaxBwd).add(x.shape()).add(impl(x).layout_id).add(p.kernel).add(p.stride).add(p.pad);
  auto* e = static_cast<PoolBwd*>(find(key));
  if (!e) {
    auto g = max_geometry(x.shape(), p);
    auto n = std::make_unique<PoolBwd>();
    auto hint = chosen(dnnl::pooling_forward::primitive_desc(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, md(x),
                                    any(g.dst), g.strides, g.kernel, g.pad_l, g.pad_r),
        attr(), engine()));
    dnnl::pooling_backward::desc d(dnnl::algorithm::pooling_max, md(x), hint.dst_desc(), g.strides, g.kernel, g.pad_l,
                                   g.pad_r);
    n->pd = chosen(dnnl::pooling_backward::primitive_desc(d, attr(), engine(), hint));
    n->prim = dnnl::pooling_backward(n->pd);
    n->ddst = n->pd.diff_dst_desc();
    n->dsrc = n->pd.diff_src_desc();
    const auto& pd = n->pd;
    e = static_cast<PoolBwd*>(insert(key, std::move(n), pd));
  }
  const memory& ddst = as_layout(dy, e->ddst, e->ddst_slot, SlotPool::diff_dst);
  ensure(dx, x.shape(), e->dsrc);
  execute(e->prim, *e,
          {{DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_WORKSPACE, impl(workspace).mem.get()},
           {DNNL_ARG_DIFF_SRC, impl(dx).mem.get()}});
}

void CpuBackend::global_avgpool_forward(const Tensor& x, Tensor& y) {
  apply_threads();
  check_f32(x, 4, "global_avgpool_forward", "x");
  CacheKey key;
  key.add(kOpGapFwd).add(x.shape()).add(impl(x).layout_id);
  auto* e = static_cast<PoolFwd*>(find(key));
  if (!e) {
    auto g = gap_geometry(x.shape());
    auto n = std::make_unique<PoolFwd>();
    dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_avg_exclude_padding,
                                  md(x), any(g.dst), g.strides, g.kernel, g.pad_l, g.pad_r);
    n->pd = chosen(dnnl::pooling_forward::primitive_desc(d, attr(), engine()));
    n->prim = dnnl::pooling_forward(n->pd);
    n->dst = n->pd.dst_desc();
    n->y_shape = Shape(g.dst);
    const auto& pd = n->pd;
    e = static_cast<PoolFwd*>(insert(key, std::move(n), pd));
  }
  ensure(y, e->y_shape, e->dst);
  execute(e->prim, *e, {{DNNL_ARG_SRC, impl(x).mem.get()}, {DNNL_ARG_DST, impl(y).mem.get()}});
}

void CpuBackend::global_avgpool_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  apply_threads();
  check_global_avgpool_backward(x, dy, nullptr);
  const Shape& xs = x.shape();
  CacheKey key;
  key.add(kOpGapBwd).add(xs).add(impl(x).layout_id);
  auto* e = static_cast<PoolBwd*>(find(key));
  if (!e) {
    auto g = gap_geometry(xs);
    auto n = std::make_unique<PoolBwd>();
    auto alg = dnnl::algorithm::pooling_avg_exclude_padding;
    auto hint = chosen(dnnl::pooling_forward::primitive_desc(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, md(x), any(g.dst), g.strides, g.kernel,
                                    g.pad_l, g.pad_r),
        attr(), engine()));
    dnnl::pooling_backward::desc d(alg, md(x), hint.dst_desc(), g.strides, g.kernel, g.pad_l, g.pad_r);
    n->pd = chosen(dnnl::pooling_backward::primitive_desc(d, attr(), engine(), hint));
    n->prim = dnnl::pooling_backward(n->pd);
    n->ddst = n->pd.diff_dst_desc();
    n->dsrc = n->pd.diff_src_desc();
    const auto& pd = n->pd;
    e = static_cast<PoolBwd*>(insert(key, std::move(n), pd));
  }
  const memory& ddst = as_layout(dy, e->ddst, e->ddst_slot, SlotPool::diff_dst);
  ensure(dx, xs, e->dsrc);
  execute(e->prim, *e, {{DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_DIFF_SRC, impl(dx).mem.get()}});
}

}  // namespace wb::backend::cpu
