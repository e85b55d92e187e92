// Synchronised batch norm on the CPU backend. oneDNN's batch-norm primitive takes the statistics as
// inputs (use_global_stats), so the normalisation and the local half of the backward are oneDNN's;
// what it cannot do is here, in the tensors' own layouts (plain, channels-last, or with one inner block
// of channels such as nChw16c):
//   - the per-channel sums of x and x^2, accumulated in double so that the variance E[x^2] - mean^2
//     taken from the sums over all processes keeps fp32 accuracy;
//   - the completion of dx. With the statistics given, oneDNN's backward returns dx0 = gamma * invstd *
//     dy, diff_scale = sum(dy * (x - mean)) * invstd and diff_shift = sum(dy): this process's sums.
//     Over the whole batch of `count` values, torch's batch_norm_backward_elemt computes
//       dx = gamma * invstd * (dy - sum_dy / count - (x - mean) * invstd^2 * sum_dy_xmu / count),
//     so dx = dx0 + a_c + b_c * x with b_c = -gamma invstd^3 sum_dy_xmu / count and
//     a_c = -gamma invstd sum_dy / count - b_c * mean, both per channel in double.
#include <cmath>
#include <cstring>
#include <vector>

#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::backend::cpu {

using dnnl::memory;
using nf = dnnl::normalization_flags;

namespace {

struct SyncBnFwd final : Entry {
  dnnl::batch_normalization_forward::primitive_desc pd;
  dnnl::batch_normalization_forward prim;
  memory::desc dst, stat, ws;
  Shape stat_shape, ws_shape;
};

struct SyncBnBwd final : Entry {
  dnnl::batch_normalization_backward::primitive_desc pd;
  dnnl::batch_normalization_backward prim;
  memory::desc data, dsrc;
  Slot ddst_slot;
};

constexpr std::int64_t kOpSyncBnFwd = 101, kOpSyncBnBwd = 102;

nf global_flags(bool fuse_relu) {
  nf f = nf::use_scale | nf::use_shift | nf::use_global_stats;
  if (fuse_relu) f = f | nf::fuse_norm_relu;
  return f;
}

std::int64_t float_bits(float f) {
  std::int32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Where element (n, c, h, w) of a 4-d tensor lives: n*sn + (c / block)*sc + (c % block) + h*sh + w*sw.
struct ChannelLayout {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t sn = 0, sc = 0, sh = 0, sw = 0;
  std::int64_t block = 1;
  std::int64_t blocks() const { return (c + block - 1) / block; }
};

ChannelLayout channel_layout(const memory::desc& md, const Shape& s, const char* op) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.ndims != 4) {
    throw BackendError(std::string(op) + ": expected a 4-d blocked tensor");
  }
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  ChannelLayout l;
  l.n = s[0];
  l.c = s[1];
  l.h = s[2];
  l.w = s[3];
  if (b.inner_nblks == 1 && b.inner_idxs[0] == 1) {
    l.block = b.inner_blks[0];
  } else if (b.inner_nblks != 0) {
    throw BackendError(std::string(op) + ": a layout with blocks other than one channel block is not supported");
  }
  l.sn = b.strides[0];
  l.sc = b.strides[1];
  l.sh = b.strides[2];
  l.sw = b.strides[3];
  if (d.offset0 != 0) throw BackendError(std::string(op) + ": a tensor with an offset is not supported");
  return l;
}

}  // namespace

void CpuBackend::batchnorm_sums(const Tensor& x, std::span<double> sums) {
  apply_threads();
  if (!x.defined() || x.dtype() != DType::f32 || x.shape().rank() != 4) {
    throw BackendError("batchnorm_sums: x must be f32 (N,C,H,W)");
  }
  const ChannelLayout l = channel_layout(md(x), x.shape(), "batchnorm_sums");
  if (sums.size() != static_cast<std::size_t>(2 * l.c)) {
    throw BackendError("batchnorm_sums: sums must hold 2C = " + std::to_string(2 * l.c) + " values, got " +
                       std::to_string(sums.size()));
  }
  const float* src = x.data_as<float>();
  double* out = sums.data();
  const std::int64_t nblocks = l.blocks();
#pragma omp parallel for schedule(static)
  for (std::int64_t cb = 0; cb < nblocks; ++cb) {
    const std::int64_t c0 = cb * l.block, width = std::min(l.block, l.c - c0);
    std::vector<double> s1(static_cast<std::size_t>(width), 0.0), s2(static_cast<std::size_t>(width), 0.0);
    // One channel block at a time; with block 1 the channel stride walks the channels.
    for (std::int64_t n = 0; n < l.n; ++n) {
      for (std::int64_t h = 0; h < l.h; ++h) {
        for (std::int64_t w = 0; w < l.w; ++w) {
          const float* p = src + n * l.sn + (l.block == 1 ? c0 * l.sc : cb * l.sc) + h * l.sh + w * l.sw;
          for (std::int64_t k = 0; k < width; ++k) {
            const double v = p[k];
            s1[static_cast<std::size_t>(k)] += v;
            s2[static_cast<std::size_t>(k)] += v * v;
          }
        }
      }
    }
    for (std::int64_t k = 0; k < width; ++k) {
      out[c0 + k] = s1[static_cast<std::size_t>(k)];
      out[l.c + c0 + k] = s2[static_cast<std::size_t>(k)];
    }
  }
}

void CpuBackend::batchnorm_forward_with_stats(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              std::span<const double> mean, std::span<const double> var,
                                              std::int64_t count, BatchNormState& state, const BatchNormParams& p) {
  apply_threads();
  const std::int64_t c = check_batchnorm_forward(x, gamma, beta, running_mean, running_var,
                                                 "batchnorm_forward_with_stats", nullptr);
  if (mean.size() != static_cast<std::size_t>(c) || var.size() != static_cast<std::size_t>(c)) {
    throw BackendError("batchnorm_forward_with_stats: mean and var must hold C = " + std::to_string(c) + " values");
  }
  if (count < 2) {
    throw BackendError("batchnorm_forward_with_stats: the unbiased variance needs at least 2 values per channel "
                       "over all processes, got " + std::to_string(count));
  }
  const Shape& xs = x.shape();
  CacheKey key;
  key.add(kOpSyncBnFwd).add(xs).add(impl(x).layout_id).add(p.fuse_relu).add(float_bits(p.eps));
  auto* e = static_cast<SyncBnFwd*>(find(key));
  if (!e) {
    auto ne = std::make_unique<SyncBnFwd>();
    dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_training, md(x), p.eps,
                                              global_flags(p.fuse_relu));
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
    e = static_cast<SyncBnFwd*>(insert(key, std::move(ne), pd));
  }
  ensure(y, xs, e->dst);
  ensure(state.mean, e->stat_shape, e->stat);
  ensure(state.var, e->stat_shape, e->stat);
  float* sm = state.mean.data_as<float>();
  float* sv = state.var.data_as<float>();
  for (std::int64_t i = 0; i < c; ++i) {
    sm[i] = static_cast<float>(mean[static_cast<std::size_t>(i)]);
    sv[i] = static_cast<float>(var[static_cast<std::size_t>(i)]);
  }
  if (p.fuse_relu) {
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
  // As batchnorm_forward_train, in fp32 like torch's running buffers.
  const float m = p.momentum;
  const float unbias = static_cast<float>(static_cast<double>(count) / static_cast<double>(count - 1));
  float* rm = running_mean.data_as<float>();
  float* rv = running_var.data_as<float>();
  for (std::int64_t i = 0; i < c; ++i) {
    rm[i] = (1.0f - m) * rm[i] + m * sm[i];
    rv[i] = (1.0f - m) * rv[i] + m * (sv[i] * unbias);
  }
}

void CpuBackend::batchnorm_backward_reduce(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& beta,
                                           const BatchNormState& state, Tensor& dx, const Tensor& dgamma,
                                           const Tensor& dbeta, std::span<double> sums, const BatchNormParams& p) {
  apply_threads();
  const std::int64_t c = check_batchnorm_backward(x, dy, gamma, beta, dgamma, dbeta, nullptr);
  if (sums.size() != static_cast<std::size_t>(2 * c)) {
    throw BackendError("batchnorm_backward_reduce: sums must hold 2C = " + std::to_string(2 * c) + " values");
  }
  if (!state.mean.defined() || !state.var.defined() || (p.fuse_relu && !state.workspace.defined())) {
    throw BackendError(
        "batchnorm_backward_reduce: the state of batchnorm_forward_with_stats (with the same fuse_relu) is missing");
  }
  const Shape& xs = x.shape();
  CacheKey key;
  key.add(kOpSyncBnBwd).add(xs).add(impl(x).layout_id).add(p.fuse_relu).add(float_bits(p.eps));
  auto* e = static_cast<SyncBnBwd*>(find(key));
  if (!e) {
    auto ne = std::make_unique<SyncBnBwd>();
    const nf f = global_flags(p.fuse_relu);
    auto hint = chosen(dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, md(x), p.eps, f), attr(),
        engine()));
    dnnl::batch_normalization_backward::desc d(dnnl::prop_kind::backward, md(x), md(x), p.eps, f);
    ne->pd = chosen(dnnl::batch_normalization_backward::primitive_desc(d, attr(), engine(), hint));
    ne->prim = dnnl::batch_normalization_backward(ne->pd);
    ne->data = ne->pd.diff_dst_desc();
    ne->dsrc = ne->pd.diff_src_desc();
    const auto& pd = ne->pd;
    e = static_cast<SyncBnBwd*>(insert(key, std::move(ne), pd));
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
  // diff_scale = sum(dy (x - mean)) * invstd: undo the invstd for torch's sum_dy_xmu.
  const float* var = state.var.data_as<float>();
  const float* dg = dgamma.data_as<float>();
  const float* db = dbeta.data_as<float>();
  for (std::int64_t i = 0; i < c; ++i) {
    sums[static_cast<std::size_t>(i)] = db[i];
    sums[static_cast<std::size_t>(c + i)] = static_cast<double>(dg[i]) * std::sqrt(static_cast<double>(var[i]) + p.eps);
  }
}

void CpuBackend::batchnorm_backward_elemt(const Tensor& x, const Tensor& gamma, const BatchNormState& state,
                                          Tensor& dx, std::span<const double> sums, std::int64_t count,
                                          const BatchNormParams& p) {
  apply_threads();
  if (!x.defined() || !dx.defined() || x.shape().rank() != 4 || !(dx.shape() == x.shape())) {
    throw BackendError("batchnorm_backward_elemt: dx must be batchnorm_backward_reduce's, of x's shape");
  }
  if (!(md(dx) == md(x))) {
    throw BackendError("batchnorm_backward_elemt: dx and x must share one layout");
  }
  const ChannelLayout l = channel_layout(md(x), x.shape(), "batchnorm_backward_elemt");
  if (sums.size() != static_cast<std::size_t>(2 * l.c) || count < 1) {
    throw BackendError("batchnorm_backward_elemt: expected 2C = " + std::to_string(2 * l.c) +
                       " sums and a positive count");
  }
  std::vector<float> a(static_cast<std::size_t>(l.c)), b(static_cast<std::size_t>(l.c));
  const float* g = gamma.data_as<float>();
  const float* mean = state.mean.data_as<float>();
  const float* var = state.var.data_as<float>();
  for (std::int64_t i = 0; i < l.c; ++i) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(var[i]) + p.eps);
    const double mean_dy = sums[static_cast<std::size_t>(i)] / static_cast<double>(count);
    const double mean_dy_xmu = sums[static_cast<std::size_t>(l.c + i)] / static_cast<double>(count);
    const double bc = -static_cast<double>(g[i]) * invstd * invstd * invstd * mean_dy_xmu;
    const double ac = -static_cast<double>(g[i]) * invstd * mean_dy - bc * mean[i];
    a[static_cast<std::size_t>(i)] = static_cast<float>(ac);
    b[static_cast<std::size_t>(i)] = static_cast<float>(bc);
  }
  const float* src = x.data_as<float>();
  float* d = dx.data_as<float>();
  const std::int64_t nblocks = l.blocks();
  const float* pa = a.data();
  const float* pb = b.data();
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t n = 0; n < l.n; ++n) {
    for (std::int64_t cb = 0; cb < nblocks; ++cb) {
      const std::int64_t c0 = cb * l.block, width = std::min(l.block, l.c - c0);
      const std::int64_t base = n * l.sn + (l.block == 1 ? c0 * l.sc : cb * l.sc);
      for (std::int64_t h = 0; h < l.h; ++h) {
        for (std::int64_t w = 0; w < l.w; ++w) {
          const std::int64_t o = base + h * l.sh + w * l.sw;
          for (std::int64_t k = 0; k < width; ++k) d[o + k] += pa[c0 + k] + pb[c0 + k] * src[o + k];
        }
      }
    }
  }
}

}  // namespace wb::backend::cpu
