// Synchronised batch norm on the CPU backend (batchnorm_sums, batchnorm_forward_with_stats,
// batchnorm_backward_reduce, batchnorm_backward_elemt): a batch split into P parts, as P processes hold
// it, with the parts' sums added as the allreduce would, must give each part the rows that batch norm
// over the whole batch gives: y, dx, the running statistics, and dgamma / dbeta summed over the parts.
// The reference is batch norm over the whole batch in double, written out here from its definition.
// Layouts: plain NCHW, oneDNN's blocked nChw16c (what the model's convolutions hand over) and NHWC,
// with and without the fused relu. The same parts normalised each with their own statistics (batch norm
// without synchronisation) are checked to be far off the reference, so the bounds can tell.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "test_backend_util.hpp"

using wb::backend::BatchNormParams;
using wb::backend::BatchNormState;
using wb::backend::Shape;
using wb::backend::Tensor;

namespace {

enum class Layout { plain, blocked, nhwc };

struct SyncCase {
  Shape part;  // one part's shape: (n, C, H, W)
  int parts;
  Layout layout;
  bool relu;
};

const std::vector<SyncCase> kCases = {
    {{2, 5, 3, 3}, 2, Layout::plain, false},  {{2, 5, 3, 3}, 2, Layout::blocked, true},
    {{1, 32, 4, 4}, 3, Layout::blocked, false}, {{4, 16, 1, 1}, 2, Layout::blocked, true},
    {{3, 24, 5, 7}, 2, Layout::nhwc, true},   {{2, 64, 2, 2}, 2, Layout::plain, true},
};

Tensor make(wb::backend::Backend& be, const Shape& s, const std::vector<float>& host, Layout layout) {
  if (layout == Layout::nhwc) {
    auto& cpu = dynamic_cast<wb::backend::cpu::CpuBackend&>(be);
    dnnl::memory::desc md({s[0], s[1], s[2], s[3]}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::nhwc);
    Tensor t = cpu.allocate(s, wb::backend::DType::f32, md);
    be.from_host(t, host);
    return t;
  }
  return wb::test::make_tensor(be, s, host, layout == Layout::blocked);
}

// Batch norm over the whole batch (plain NCHW, `rows` images), in double.
struct Reference {
  std::vector<double> y, dx, dgamma, dbeta, rmean, rvar;
};

Reference reference(const std::vector<float>& x, const std::vector<float>& dy, const std::vector<float>& gamma,
                    const std::vector<float>& beta, const std::vector<float>& rmean0, const std::vector<float>& rvar0,
                    std::int64_t rows, std::int64_t c, std::int64_t hw, bool relu) {
  const double eps = 1e-5, m = 0.1, count = static_cast<double>(rows * hw);
  Reference r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.dgamma.assign(static_cast<std::size_t>(c), 0.0);
  r.dbeta.assign(static_cast<std::size_t>(c), 0.0);
  r.rmean.resize(static_cast<std::size_t>(c));
  r.rvar.resize(static_cast<std::size_t>(c));
  auto at = [&](std::int64_t n, std::int64_t ch, std::int64_t k) { return static_cast<std::size_t>((n * c + ch) * hw + k); };
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    for (std::int64_t n = 0; n < rows; ++n)
      for (std::int64_t k = 0; k < hw; ++k) mean += x[at(n, ch, k)];
    mean /= count;
    for (std::int64_t n = 0; n < rows; ++n)
      for (std::int64_t k = 0; k < hw; ++k) var += (x[at(n, ch, k)] - mean) * (x[at(n, ch, k)] - mean);
    var /= count;
    const double invstd = 1.0 / std::sqrt(var + eps), g = gamma[static_cast<std::size_t>(ch)];
    const std::size_t cu = static_cast<std::size_t>(ch);
    r.rmean[cu] = (1 - m) * rmean0[cu] + m * mean;
    r.rvar[cu] = (1 - m) * rvar0[cu] + m * var * count / (count - 1);
    std::vector<double> g_in(static_cast<std::size_t>(rows * hw));
    double sum_dy = 0, sum_dy_xhat = 0;
    for (std::int64_t n = 0; n < rows; ++n)
      for (std::int64_t k = 0; k < hw; ++k) {
        const std::size_t i = at(n, ch, k);
        const double xhat = (x[i] - mean) * invstd;
        double y = g * xhat + beta[cu];
        double d = dy[i];
        if (relu) {
          if (y <= 0) d = 0;
          y = std::max(0.0, y);
        }
        r.y[i] = y;
        g_in[static_cast<std::size_t>(n * hw + k)] = d;
        sum_dy += d;
        sum_dy_xhat += d * xhat;
      }
    r.dbeta[cu] = sum_dy;
    r.dgamma[cu] = sum_dy_xhat;
    for (std::int64_t n = 0; n < rows; ++n)
      for (std::int64_t k = 0; k < hw; ++k) {
        const std::size_t i = at(n, ch, k);
        const double xhat = (x[i] - mean) * invstd;
        r.dx[i] = g * invstd * (g_in[static_cast<std::size_t>(n * hw + k)] - sum_dy / count - xhat * sum_dy_xhat / count);
      }
  }
  return r;
}

std::vector<float> slice(const std::vector<double>& v, std::size_t begin, std::size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(begin + n)};
}
std::vector<float> as_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("synchronised batch norm over parts equals batch norm over the whole batch", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({2});
  double worst_y = 0, worst_dx = 0, worst_stats = 0, worst_dparams = 0, unsynced_best = 1e30;
  for (std::size_t ci = 0; ci < kCases.size(); ++ci) {
    const SyncCase& sc = kCases[ci];
    const Shape& ps = sc.part;
    const std::int64_t c = ps[1], hw = ps[2] * ps[3], rows = ps[0] * sc.parts;
    const std::size_t part_numel = static_cast<std::size_t>(ps.numel()), cu = static_cast<std::size_t>(c);
    CAPTURE(ci, ps.to_string(), sc.parts, static_cast<int>(sc.layout), sc.relu);
    std::vector<float> x = wb::test::random_normal(part_numel * static_cast<std::size_t>(sc.parts), 7 + ci, 2.0f);
    for (auto& v : x) v += 3.0f;  // a mean well away from 0, as conv outputs may have
    const std::vector<float> dy = wb::test::random_normal(x.size(), 11 + ci);
    const std::vector<float> gamma = wb::test::random_uniform(cu, 13 + ci, 0.5f, 1.5f);
    const std::vector<float> beta = wb::test::random_normal(cu, 17 + ci, 0.5f);
    const std::vector<float> rmean = wb::test::random_normal(cu, 19 + ci, 0.2f);
    const std::vector<float> rvar = wb::test::random_uniform(cu, 23 + ci, 0.5f, 2.0f);
    const Reference ref = reference(x, dy, gamma, beta, rmean, rvar, rows, c, hw, sc.relu);
    const BatchNormParams bp{1e-5f, 0.1f, sc.relu};
    const Shape cs{c};

    struct Part {
      Tensor x, dy, y, dx, rm, rv, dgamma, dbeta;
      BatchNormState state;
    };
    std::vector<Part> parts(static_cast<std::size_t>(sc.parts));
    const Tensor g = wb::test::make_tensor(*be, cs, gamma), b = wb::test::make_tensor(*be, cs, beta);
    std::vector<double> sums(2 * cu, 0.0);
    for (int p = 0; p < sc.parts; ++p) {
      Part& part = parts[static_cast<std::size_t>(p)];
      const std::size_t off = part_numel * static_cast<std::size_t>(p);
      part.x = make(*be, ps, {x.begin() + static_cast<std::ptrdiff_t>(off), x.begin() + static_cast<std::ptrdiff_t>(off + part_numel)}, sc.layout);
      part.dy = make(*be, ps, {dy.begin() + static_cast<std::ptrdiff_t>(off), dy.begin() + static_cast<std::ptrdiff_t>(off + part_numel)}, sc.layout);
      part.rm = wb::test::make_tensor(*be, cs, rmean);
      part.rv = wb::test::make_tensor(*be, cs, rvar);
      part.dgamma = be->empty(cs, wb::backend::DType::f32);
      part.dbeta = be->empty(cs, wb::backend::DType::f32);
      std::vector<double> mine(2 * cu);
      be->batchnorm_sums(part.x, mine);
      for (std::size_t i = 0; i < mine.size(); ++i) sums[i] += mine[i];  // the allreduce
    }
    const std::int64_t count = rows * hw;
    std::vector<double> mean(cu), var(cu);
    for (std::size_t i = 0; i < cu; ++i) {
      mean[i] = sums[i] / static_cast<double>(count);
      var[i] = sums[cu + i] / static_cast<double>(count) - mean[i] * mean[i];
    }
    std::vector<double> grad_sums(2 * cu, 0.0);
    for (auto& part : parts) {
      be->batchnorm_forward_with_stats(part.x, g, b, part.y, part.rm, part.rv, mean, var, count, part.state, bp);
      std::vector<double> mine(2 * cu);
      be->batchnorm_backward_reduce(part.x, part.dy, g, b, part.state, part.dx, part.dgamma, part.dbeta, mine, bp);
      for (std::size_t i = 0; i < mine.size(); ++i) grad_sums[i] += mine[i];
    }
    std::vector<double> dgamma(cu, 0.0), dbeta(cu, 0.0);
    for (std::size_t p = 0; p < parts.size(); ++p) {
      Part& part = parts[p];
      be->batchnorm_backward_elemt(part.x, g, part.state, part.dx, grad_sums, count, bp);
      wb::test::require_no_overrun(*be);
      const std::size_t off = part_numel * p;
      const double ey = wb::test::rel_l2(wb::test::to_vec(*be, part.y), slice(ref.y, off, part_numel));
      const double edx = wb::test::rel_l2(wb::test::to_vec(*be, part.dx), slice(ref.dx, off, part_numel));
      const double es = std::max(wb::test::rel_l2(wb::test::to_vec(*be, part.rm), as_float(ref.rmean)),
                                 wb::test::rel_l2(wb::test::to_vec(*be, part.rv), as_float(ref.rvar)));
      CHECK(ey < 1e-6);
      CHECK(edx < 1e-6);
      CHECK(es < 1e-6);
      worst_y = std::max(worst_y, ey);
      worst_dx = std::max(worst_dx, edx);
      worst_stats = std::max(worst_stats, es);
      const auto dg = wb::test::to_vec(*be, part.dgamma), db = wb::test::to_vec(*be, part.dbeta);
      for (std::size_t i = 0; i < cu; ++i) {
        dgamma[i] += dg[i];
        dbeta[i] += db[i];
      }
    }
    const double ep = std::max(wb::test::rel_l2(as_float(dgamma), as_float(ref.dgamma)),
                               wb::test::rel_l2(as_float(dbeta), as_float(ref.dbeta)));
    CHECK(ep < 1e-6);
    worst_dparams = std::max(worst_dparams, ep);

    // Without synchronisation: each part's own statistics. Far from the whole batch's.
    Part& first = parts[0];
    Tensor y_local, dx_local;
    BatchNormState st;
    be->batchnorm_forward_train(first.x, g, b, y_local, first.rm, first.rv, st, bp);
    be->batchnorm_backward(first.x, first.dy, g, b, st, dx_local, first.dgamma, first.dbeta, bp);
    unsynced_best = std::min(unsynced_best, std::max(wb::test::rel_l2(wb::test::to_vec(*be, y_local), slice(ref.y, 0, part_numel)),
                                                     wb::test::rel_l2(wb::test::to_vec(*be, dx_local), slice(ref.dx, 0, part_numel))));
  }
  WARN("worst rel-L2 against float64 batch norm over the whole batch: y " << worst_y << ", dx " << worst_dx
                                                                           << ", running stats " << worst_stats
                                                                           << ", dgamma/dbeta " << worst_dparams
                                                                           << "; unsynchronised parts at best " << unsynced_best);
  CHECK(unsynced_best > 1e-2);
}

TEST_CASE("synchronised batch norm: bad sizes are errors naming the op", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({1});
  const Shape s{2, 4, 2, 2};
  Tensor x = wb::test::make_tensor(*be, s, wb::test::random_normal(static_cast<std::size_t>(s.numel()), 1));
  std::vector<double> few(3);
  CHECK_THROWS_WITH(be->batchnorm_sums(x, few), Catch::Contains("batchnorm_sums") && Catch::Contains("2C = 8"));
  Tensor g = wb::test::make_tensor(*be, {4}, {1, 1, 1, 1}), b = wb::test::make_tensor(*be, {4}, {0, 0, 0, 0});
  Tensor rm = wb::test::make_tensor(*be, {4}, {0, 0, 0, 0}), rv = wb::test::make_tensor(*be, {4}, {1, 1, 1, 1});
  std::vector<double> mean(4, 0.0), var(4, 1.0);
  Tensor y;
  BatchNormState st;
  CHECK_THROWS_WITH(be->batchnorm_forward_with_stats(x, g, b, y, rm, rv, mean, var, 1, st, {}),
                    Catch::Contains("at least 2 values"));
}
