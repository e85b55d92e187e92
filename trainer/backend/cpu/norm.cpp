// Batch normalisation on oneDNN, in the input's own (usually blocked) layout. oneDNN returns the biased
// batch variance; the running variance gets the unbiased one (n / (n - 1)) as torch's does.
#include <cstring>

#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::backend::cpu {

using dnnl::memory;
using nf = dnnl::normalization_flags;

namespace {

struct BnFwd final : Entry {
  dnnl::batch_normalization_forward::primitive_desc pd;
  dnnl::batch_normalization_forward prim;
  memory::desc dst, stat, ws;
  Shape stat_shape, ws_shape;
};

struct BnBwd final : Entry {
  dnnl::batch_normalization_backward::primitive_desc pd;
  dnnl::batch_normalization_backward prim;
  memory::desc data, dsrc;
  Slot ddst_slot;
};

nf flags(bool fuse_relu, bool global_stats) {
  nf f = nf::use_scale | nf::use_shift;
  if (fuse_relu) f = f | nf::fuse_norm_relu;
  if (global_stats) f = f | nf::use_global_stats;
  return f;
}

std::int64_t float_bits(float f) {
  std::int32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

}  // namespace

void CpuBackend::batchnorm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                         const Tensor& running_mean, const Tensor& running_var,
                                         BatchNormState& state, const BatchNormParams& p) {
  apply_threads();
  const std::int64_t c =
      check_batchnorm_forward(x, gamma, beta, running_mean, running_var, "batchnorm_forward_train", nullptr);
  const Shape& xs = x.shape();
  check_batchnorm_batch(xs, "batchnorm_forward_train");
  const std::int64_t n = xs[0] * xs[2] * xs[3];
  CacheKey key;
  key.add(kOpBnTrain).add(xs).add(impl(x).layout_id).add(p.fuse_relu).add(float_bits(p.eps));
  auto* e = static_cast<BnFwd*>(find(key));
  if (!e) {
    auto ne = std::make_unique<BnFwd>();
    dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_training, md(x), p.eps,
                                              flags(p.fuse_relu, false));
    ne->pd = chosen(dnnl::batch_normalization_forward::primitive_desc(d, attr(), engine()));
    ne->prim = dnnl::batch_normalization_forward(ne->pd);
    ne->dst = ne->pd.dst_desc();
    ne->stat = ne->pd.mean_desc();
    ne->stat_shape = Shape{c};
    if (p.fuse_relu) {
      ne->ws = ne->pd.workspace_desc();
      ne->ws_shape = Shape{static_cast<std::int64_t>(ne->ws.get_size())};
    }
    const auto& pd = ne->pd;
    e = static_cast<BnFwd*>(insert(key, std::move(ne), pd));
  }
  ensure(y, xs, e->dst);
  ensure(state.mean, e->stat_shape, e->stat);
  ensure(state.var, e->stat_shape, e->stat);
  if (p.fuse_relu) {
    // Opaque bytes (the relu mask); its shape counts bytes.
    ensure(state.workspace, e->ws_shape, e->ws);
    execute(e->prim, *e,
            {{DNNL_ARG_SRC, impl(x).mem.get()}, {DNNL_ARG_SCALE, impl(gamma).mem.get()},
             {DNNL_ARG_SHIFT, impl(beta).mem.get()}, {DNNL_ARG_DST, impl(y).mem.get()},
             {DNNL_ARG_MEAN, impl(state.mean).mem.get()}, {DNNL_ARG_VARIANCE, impl(state.var).mem.get()},
             {DNNL_ARG_WORKSPACE, impl(state.workspace).mem.get()}});
  } else {
    execute(e->prim, *e,
            {{DNNL_ARG_SRC, impl(x).mem.get()}, {DNNL_ARG_SCALE, impl(gamma).mem.get()},
             {DNNL_ARG_SHIFT, impl(beta).mem.get()}, {DNNL_ARG_DST, impl(y).mem.get()},
             {DNNL_ARG_MEAN, impl(state.mean).mem.get()}, {DNNL_ARG_VARIANCE, impl(state.var).mem.get()}});
  }
  const float m = p.momentum;
  const float unbias = static_cast<float>(static_cast<double>(n) / static_cast<double>(n - 1));
  const float* mean = state.mean.data_as<float>();
  const float* var = state.var.data_as<float>();
  float* rm = running_mean.data_as<float>();
  float* rv = running_var.data_as<float>();
  for (std::int64_t i = 0; i < c; ++i) {
    rm[i] = (1.0f - m) * rm[i] + m * mean[i];
    rv[i] = (1.0f - m) * rv[i] + m * (var[i] * unbias);
  }
}

void CpuBackend::batchnorm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                        const Tensor& running_mean, const Tensor& running_var,
                                        const BatchNormParams& p) {
  apply_threads();
  check_batchnorm_forward(x, gamma, beta, running_mean, running_var, "batchnorm_forward_eval", nullptr);
  const Shape& xs = x.shape();
  CacheKey key;
  key.add(kOpBnEval).add(xs).add(impl(x).layout_id).add(p.fuse_relu).add(float_bits(p.eps));
  auto* e = static_cast<BnFwd*>(find(key));
  if (!e) {
    auto ne = std::make_unique<BnFwd>();
    dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, md(x), p.eps,
                                              flags(p.fuse_relu, true));
    ne->pd = chosen(dnnl::batch_normalization_forward::primitive_desc(d, attr(), engine()));
    ne->prim = dnnl::batch_normalization_forward(ne->pd);
    ne->dst = ne->pd.dst_desc();
    const auto& pd = ne->pd;
    e = static_cast<BnFwd*>(insert(key, std::move(ne), pd));
  }
  ensure(y, xs, e->dst);
  execute(e->prim, *e,
          {{DNNL_ARG_SRC, impl(x).mem.get()}, {DNNL_ARG_SCALE, impl(gamma).mem.get()},
           {DNNL_ARG_SHIFT, impl(beta).mem.get()}, {DNNL_ARG_DST, impl(y).mem.get()},
           {DNNL_ARG_MEAN, impl(running_mean).mem.get()}, {DNNL_ARG_VARIANCE, impl(running_var).mem.get()}});
}

void CpuBackend::batchnorm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                    const BatchNormState& state, Tensor& dx, const Tensor& dgamma,
                                    const Tensor& dbeta, const BatchNormParams& p) {
  apply_threads();
  check_batchnorm_backward(x, dy, gamma, beta, dgamma, dbeta, nullptr);
  const Shape& xs = x.shape();
  if (!state.mean.defined() || !state.var.defined() || (p.fuse_relu && !state.workspace.defined())) {
    throw BackendError("batchnorm_backward: the state of a training forward (with the same fuse_relu) is missing");
  }
  CacheKey key;
  key.add(kOpBnBwd).add(xs).add(impl(x).layout_id).add(p.fuse_relu).add(float_bits(p.eps));
  auto* e = static_cast<BnBwd*>(find(key));
  if (!e) {
    auto ne = std::make_unique<BnBwd>();
    nf f = flags(p.fuse_relu, false);
    auto hint = chosen(dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, md(x), p.eps, f), attr(),
        engine()));
    dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, md(x), md(x), p.eps, f);
    ne->pd = chosen(dnnl::batch_normalization_backward::primitive_desc(d, attr(), engine(), hint));
    ne->prim = dnnl::batch_normalization_backward(ne->pd);
    ne->data = ne->pd.diff_dst_desc();
    ne->dsrc = ne->pd.diff_src_desc();
    const auto& pd = ne->pd;
    e = static_cast<BnBwd*>(insert(key, std::move(ne), pd));
  }
  const memory& ddst = as_layout(dy, e->data, e->ddst_slot, SlotPool::diff_dst);
  ensure(dx, xs, e->dsrc);
  if (p.fuse_relu) {
    execute(e->prim, *e,
            {{DNNL_ARG_SRC, impl(x).mem.get()}, {DNNL_ARG_MEAN, impl(state.mean).mem.get()},
             {DNNL_ARG_VARIANCE, impl(state.var).mem.get()}, {DNNL_ARG_SCALE, impl(gamma).mem.get()},
             {DNNL_ARG_SHIFT, impl(beta).mem.get()}, {DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_DIFF_SRC, impl(dx).mem.get()},
             {DNNL_ARG_DIFF_SCALE, impl(dgamma).mem.get()}, {DNNL_ARG_DIFF_SHIFT, impl(dbeta).mem.get()},
             {DNNL_ARG_WORKSPACE, impl(state.workspace).mem.get()}});
  } else {
    execute(e->prim, *e,
            {{DNNL_ARG_SRC, impl(x).mem.get()}, {DNNL_ARG_MEAN, impl(state.mean).mem.get()},
             {DNNL_ARG_VARIANCE, impl(state.var).mem.get()}, {DNNL_ARG_SCALE, impl(gamma).mem.get()},
             {DNNL_ARG_SHIFT, impl(beta).mem.get()}, {DNNL_ARG_DIFF_DST, ddst.get()}, {DNNL_ARG_DIFF_SRC, impl(dx).mem.get()},
             {DNNL_ARG_DIFF_SCALE, impl(dgamma).mem.get()}, {DNNL_ARG_DIFF_SHIFT, impl(dbeta).mem.get()}});
  }
}

}  // namespace wb::backend::cpu
