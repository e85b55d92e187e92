// The classifier (oneDNN inner product on plain data, torch's [out, in] weight layout) and softmax
// cross-entropy with label smoothing (plain C++, the batch is small).
#include <cmath>

#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::backend::cpu {

using dnnl::memory;
using tag = memory::format_tag;

namespace {

struct LinFwd final : Entry {
  dnnl::inner_product_forward::primitive_desc pd;
  dnnl::inner_product_forward prim;
  memory::desc x_plain;  // x's logical shape, plain
  Slot x_slot;
  memory src;            // (N, IN) view of the plain input
  Shape y_shape;
};

struct LinBwdData final : Entry {
  dnnl::inner_product_backward_data::primitive_desc pd;
  dnnl::inner_product_backward_data prim;
  memory::desc x_plain;
  Slot dy_slot;
  memory dsrc;  // (N, IN) view of dx
};

struct LinBwdWeights final : Entry {
  dnnl::inner_product_backward_weights::primitive_desc pd;
  dnnl::inner_product_backward_weights prim;
  Slot x_slot;
  memory src;  // (N, IN) view of the plain input
};

memory::desc f32(const memory::dims& d, tag t) { return memory::desc(d, memory::data_type::f32, t); }

}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  apply_threads();
  const auto [n, in, out] = check_linear_forward(x, w, b, nullptr);
  CacheKey key;
  key.add(kOpLinFwd).add(x.shape()).add(out);
  auto* e = static_cast<LinFwd*>(find(key));
  if (!e) {
    auto ne = std::make_unique<LinFwd>();
    dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_training, f32({n, in}, tag::ab), f32({out, in}, tag::ab),
                                        f32({out}, tag::a), f32({n, out}, tag::ab));
    ne->pd = chosen(dnnl::inner_product_forward::primitive_desc(d, attr(), engine()));
    ne->prim = dnnl::inner_product_forward(ne->pd);
    ne->x_plain = plain_md(x.shape());
    ne->src = memory(f32({n, in}, tag::ab), engine(), nullptr);
    ne->y_shape = Shape{n, out};
    const auto& pd = ne->pd;
    e = static_cast<LinFwd*>(insert(key, std::move(ne), pd));
  }
  // (N, IN, 1, 1) plain has the same bytes as (N, IN) plain.
  const memory& xp = as_layout(x, e->x_plain, e->x_slot, SlotPool::src);
  e->src.set_data_handle(xp.get_data_handle());
  ensure(y, e->y_shape, plain_md(e->y_shape));
  execute(e->prim, *e,
          {{DNNL_ARG_SRC, e->src.get()}, {DNNL_ARG_WEIGHTS, impl(w).mem.get()}, {DNNL_ARG_BIAS, impl(b).mem.get()},
           {DNNL_ARG_DST, impl(y).mem.get()}});
}

void CpuBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, const Tensor& dw,
                                 const Tensor& db) {
  apply_threads();
  const auto [n, in, out] = check_linear_backward(x, w, dy, dw, db, nullptr);
  auto src = f32({n, in}, tag::ab), wei = f32({out, in}, tag::ab), bias = f32({out}, tag::a),
       dst = f32({n, out}, tag::ab);
  CacheKey key;
  key.add(kOpLinBwd).add(x.shape()).add(out);
  auto* ed = static_cast<LinBwdData*>(find(key));
  CacheKey wkey;
  wkey.add(kOpLinBwdWeights).add(x.shape()).add(out);
  auto* ew = static_cast<LinBwdWeights*>(find(wkey));
  if (!ed || !ew) {
    auto hint = chosen(dnnl::inner_product_forward::primitive_desc(
        dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, src, wei, bias, dst), attr(), engine()));
    auto nd = std::make_unique<LinBwdData>();
    nd->pd = chosen(dnnl::inner_product_backward_data::primitive_desc(dnnl::inner_product_backward_data::desc(src, wei, dst),
                                                               attr(), engine(), hint));
    nd->prim = dnnl::inner_product_backward_data(nd->pd);
    nd->x_plain = plain_md(x.shape());
    nd->dsrc = memory(src, engine(), nullptr);
    const auto& dpd = nd->pd;
    ed = static_cast<LinBwdData*>(insert(key, std::move(nd), dpd));
    auto nw = std::make_unique<LinBwdWeights>();
    nw->pd = chosen(dnnl::inner_product_backward_weights::primitive_desc(
        dnnl::inner_product_backward_weights::desc(src, wei, bias, dst), attr(), engine(), hint));
    nw->prim = dnnl::inner_product_backward_weights(nw->pd);
    nw->src = memory(src, engine(), nullptr);
    const auto& wpd = nw->pd;
    ew = static_cast<LinBwdWeights*>(insert(wkey, std::move(nw), wpd));
  }
  const memory& dyp = as_layout(dy, plain_md(dy.shape()), ed->dy_slot, SlotPool::diff_dst);
  const memory& xp = as_layout(x, ed->x_plain, ew->x_slot, SlotPool::src);
  ew->src.set_data_handle(xp.get_data_handle());
  execute(ew->prim, *ew,
          {{DNNL_ARG_SRC, ew->src.get()}, {DNNL_ARG_DIFF_DST, dyp.get()}, {DNNL_ARG_DIFF_WEIGHTS, impl(dw).mem.get()},
           {DNNL_ARG_DIFF_BIAS, impl(db).mem.get()}});
  ensure(dx, x.shape(), ed->x_plain);
  ed->dsrc.set_data_handle(dx.data());
  execute(ed->prim, *ed,
          {{DNNL_ARG_DIFF_DST, dyp.get()}, {DNNL_ARG_WEIGHTS, impl(w).mem.get()}, {DNNL_ARG_DIFF_SRC, ed->dsrc.get()}});
}

// ---- softmax cross-entropy ------------------------------------------------------------------------

namespace {

void check_loss_inputs(const Tensor& logits, const Tensor& labels, const char* op) {
  check_logits(logits, op, nullptr);
  check_labels(labels, logits.shape()[0], op, nullptr);
  check_label_range({labels.data_as<std::int32_t>(), static_cast<std::size_t>(labels.shape()[0])}, logits.shape()[1],
                    op);
}

}  // namespace

void CpuBackend::softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const LossParams& p,
                                               Tensor& loss, Tensor& probs) {
  check_loss_inputs(logits, labels, "softmax_cross_entropy_forward");
  const std::int64_t n = logits.shape()[0], k = logits.shape()[1];
  const LossTargets t = loss_targets(p, k, "softmax_cross_entropy_forward");
  ensure(loss, Shape{1}, plain_md(Shape{1}));
  ensure(probs, logits.shape(), plain_md(logits.shape()));
  const float* z = logits.data_as<float>();
  const std::int32_t* y = labels.data_as<std::int32_t>();
  float* pr = probs.data_as<float>();
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* zi = z + i * k;
    float* pi = pr + i * k;
    double mx = zi[0];
    for (std::int64_t j = 1; j < k; ++j) mx = std::max(mx, static_cast<double>(zi[j]));
    double sum = 0.0;
    for (std::int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(zi[j]) - mx);
    const double log_sum = std::log(sum);
    double row = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      double logp = static_cast<double>(zi[j]) - mx - log_sum;
      pi[j] = static_cast<float>(std::exp(logp));
      row -= (j == y[i] ? t.on : t.off) * logp;
    }
    total += row;
  }
  loss.data_as<float>()[0] = static_cast<float>(total / static_cast<double>(n));
}

void CpuBackend::softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, const LossParams& p,
                                                Tensor& dlogits) {
  check_loss_inputs(probs, labels, "softmax_cross_entropy_backward");
  const std::int64_t n = probs.shape()[0], k = probs.shape()[1];
  const LossTargets t = loss_targets(p, k, "softmax_cross_entropy_backward");
  ensure(dlogits, probs.shape(), plain_md(probs.shape()));
  const float* pr = probs.data_as<float>();
  const std::int32_t* y = labels.data_as<std::int32_t>();
  float* d = dlogits.data_as<float>();
  // Both conventions' targets sum to 1 over the classes, so d/dz of -sum t log softmax(z) is p - t.
  const float inv_n = 1.0f / static_cast<float>(n);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < k; ++j) {
      d[i * k + j] = (pr[i * k + j] - (j == y[i] ? t.on : t.off)) * inv_n;
    }
  }
}

}  // namespace wb::backend::cpu
