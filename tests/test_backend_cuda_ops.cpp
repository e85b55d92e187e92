// The CUDA backend op by op against the CPU (oneDNN) backend on random inputs, by normalised error
// ||cuda - cpu|| / ||cpu||, for every precision and layout: fp32 NCHW and NHWC (channels_last), tf32,
// bf16 NCHW and NHWC. Bounds: 1e-5 for fp32 arithmetic (every op in fp32 mode; the ops that do not
// depend on the precision mode in the others: batch norm, relu, add, pooling, loss, SGD); for conv and
// linear 5e-3 in tf32 (10-bit mantissa inputs, rounding 2^-11 relative) and 3e-2 in bf16 (8-bit
// mantissa inputs and a bf16 conv output, 2^-9 each). A small conv-bn-relu-pool-add-gap-fc chain,
// forward and backward, checks that layouts pass correctly from op to op (10x the per-op bounds).
//
// The first test runs everywhere and checks the errors of make_cuda_backend. The others are tagged [cuda]:
// without a CUDA device (or without the CUDA backend in the build) they do not run, and CTest reports
// test_backend_cuda_ops-cuda as skipped (tests/support/main.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "test_backend_util.hpp"
#include "trainer/backend/backend.hpp"
#if WB_BACKEND_CUDA
#include "trainer/backend/cuda/cuda_backend.hpp"
#endif

using wb::backend::Backend;
using wb::backend::BackendError;
using wb::backend::CudaOptions;
using wb::backend::DType;
using wb::backend::Precision;
using wb::backend::Shape;
using wb::backend::Tensor;

namespace {

bool message_has(const BackendError& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("make_cuda_backend rejects a missing device or an index out of range", "[backend]") {
  const int count = wb::backend::cuda_device_count();
  REQUIRE(count >= 0);
  if (count == 0) {
    REQUIRE_THROWS_AS(wb::backend::make_cuda_backend({}), BackendError);
    try {
      wb::backend::make_cuda_backend({});
    } catch (const BackendError& e) {
#if WB_BACKEND_CUDA
      CHECK(message_has(e, "no CUDA device"));
#else
      CHECK(message_has(e, "built without CUDA"));
#endif
    }
  }
  CudaOptions past_end;
  past_end.device = count;
  REQUIRE_THROWS_AS(wb::backend::make_cuda_backend(past_end), BackendError);
  CudaOptions negative;
  negative.device = -1;
  REQUIRE_THROWS_AS(wb::backend::make_cuda_backend(negative), BackendError);
#if WB_BACKEND_CUDA
  if (count > 0) {
    try {
      wb::backend::make_cuda_backend(past_end);
    } catch (const BackendError& e) {
      CHECK(message_has(e, "device " + std::to_string(count) + " out of range"));
    }
  }
  auto cpu = wb::backend::make_cpu_backend({1});
  REQUIRE_THROWS_AS(wb::backend::cuda::compute_stream(*cpu), BackendError);
#endif
}

#if WB_BACKEND_CUDA

using wb::backend::cuda::CudaBackend;
using wb::backend::cuda::Layout;

namespace {

constexpr double kFp32Tol = 1e-5;

struct Variant {
  const char* name;
  Precision precision;
  bool channels_last;
  double tol;  // conv and linear; every other op is fp32 arithmetic in every variant
};

const Variant kVariants[] = {
    {"fp32", Precision::fp32, false, 1e-5},      {"fp32 channels_last", Precision::fp32, true, 1e-5},
    {"tf32", Precision::tf32, false, 5e-3},      {"bf16", Precision::bf16, false, 3e-2},
    {"bf16 channels_last", Precision::bf16, true, 3e-2},
};

std::unique_ptr<Backend> make_gpu(const Variant& v) {
  CudaOptions o;
  o.precision = v.precision;
  o.channels_last = v.channels_last;
  return wb::backend::make_cuda_backend(o);
}

// A tensor holding `host` (plain row-major); on the CUDA backend optionally stored NHWC (a 1x1 one stays plain).
Tensor up(Backend& be, const Shape& s, const std::vector<float>& host, bool nhwc = false) {
  Tensor t;
  if (nhwc && s.rank() == 4) {
    t = dynamic_cast<CudaBackend&>(be).allocate(s, DType::f32, Layout::nhwc);
    // One spatial position: NHWC and NCHW are the same bytes, and the backend keeps such a tensor plain.
    REQUIRE(t.is_plain() == (s[2] * s[3] == 1));
  } else {
    t = be.empty(s, DType::f32);
  }
  be.from_host(t, host);
  return t;
}

std::vector<float> down(Backend& be, const Tensor& t) { return wb::test::to_vec(be, t); }

// Records the normalised error of `got` against `want` and checks it against `tol`.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, double tol,
                  double& worst) {
  const double e = wb::test::rel_l2(got, want);
  CAPTURE(what, e, tol);
  CHECK(e <= tol);
  worst = std::max(worst, e);
}

// Distinct values with gaps of at least 0.01 (no max-pool ties, no relu input near 0).
std::vector<float> distinct_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  std::mt19937_64 gen(seed);
  std::shuffle(v.begin(), v.end(), gen);
  for (auto& x : v) x = (x - static_cast<float>(n) / 2.0f + 0.5f) * 0.02f;
  return v;
}

std::size_t count(const Shape& s) { return static_cast<std::size_t>(s.numel()); }

struct ConvCase {
  Shape x, w;
  int stride, pad;
};

}  // namespace

TEST_CASE("cuda conv forward, backward-data and backward-weights match the CPU backend", "[cuda][backend]") {
  auto cpu = wb::backend::make_cpu_backend({2});
  const ConvCase cases[] = {
      {{2, 8, 9, 9}, {16, 8, 3, 3}, 1, 1},     // 3x3, odd size
      {{2, 16, 10, 10}, {8, 16, 3, 3}, 2, 1},  // strided 3x3
      {{2, 8, 8, 8}, {32, 8, 1, 1}, 1, 0},     // 1x1 expansion
      {{2, 32, 8, 8}, {16, 32, 1, 1}, 2, 0},   // strided 1x1 (downsample)
      {{2, 3, 32, 32}, {8, 3, 7, 7}, 2, 3},    // the stem: 7x7 / 2
  };
  for (const Variant& v : kVariants) {
    auto gpu = make_gpu(v);
    double worst = 0.0;
    std::uint64_t seed = 1;
    for (const ConvCase& c : cases) {
      CAPTURE(v.name, c.x.to_string(), c.w.to_string(), c.stride, c.pad);
      const wb::backend::Conv2dParams p{c.stride, c.pad};
      const auto x = wb::test::random_normal(count(c.x), seed++);
      const auto w = wb::test::random_normal(count(c.w), seed++, 0.2f);
      Tensor cy;
      cpu->conv2d_forward(up(*cpu, c.x, x), up(*cpu, c.w, w), cy, p);
      const auto dy = wb::test::random_normal(count(cy.shape()), seed++);
      Tensor cdx, cdw = cpu->empty(c.w, DType::f32);
      cpu->conv2d_backward_data(up(*cpu, cy.shape(), dy), up(*cpu, c.w, w), cdx, c.x, p);
      cpu->conv2d_backward_weights(up(*cpu, c.x, x), up(*cpu, cy.shape(), dy), cdw, p);

      Tensor gx = up(*gpu, c.x, x, v.channels_last), gw = up(*gpu, c.w, w), gy, gdx;
      Tensor gdw = gpu->empty(c.w, DType::f32);
      gpu->conv2d_forward(gx, gw, gy, p);
      REQUIRE(gy.shape() == cy.shape());
      CHECK(gy.is_plain() == !v.channels_last);
      Tensor gdy = up(*gpu, cy.shape(), dy, v.channels_last);
      gpu->conv2d_backward_data(gdy, gw, gdx, c.x, p);
      gpu->conv2d_backward_weights(gx, gdy, gdw, p);
      REQUIRE(gdx.shape() == c.x);
      expect_close("conv y", down(*gpu, gy), down(*cpu, cy), v.tol, worst);
      expect_close("conv dx", down(*gpu, gdx), down(*cpu, cdx), v.tol, worst);
      expect_close("conv dw", down(*gpu, gdw), down(*cpu, cdw), v.tol, worst);
      // Plain NCHW input on a channels_last backend (the network input) gives the same result.
      Tensor gy2;
      gpu->conv2d_forward(up(*gpu, c.x, x), gw, gy2, p);
      expect_close("conv y from plain x", down(*gpu, gy2), down(*cpu, cy), v.tol, worst);
    }
    WARN("conv " << v.name << ": worst rel-L2 vs cpu " << worst);
  }
  auto gpu = make_gpu(kVariants[0]);
  Tensor y;
  REQUIRE_THROWS_AS(gpu->conv2d_forward(up(*gpu, {1, 4, 5, 5}, std::vector<float>(100, 1.0f)),
                                        up(*gpu, {8, 3, 3, 3}, std::vector<float>(216, 1.0f)), y, {1, 1}),
                    BackendError);
}

TEST_CASE("cuda batch norm (train, eval, backward, running stats) matches the CPU backend", "[cuda][backend]") {
  auto cpu = wb::backend::make_cpu_backend({2});
  const Shape shapes[] = {{4, 8, 5, 5}, {2, 16, 7, 7}, {3, 5, 4, 4}};
  for (const Variant& v : kVariants) {
    auto gpu = make_gpu(v);
    double worst = 0.0;
    std::uint64_t seed = 100;
    for (const Shape& s : shapes) {
      for (bool fuse : {false, true}) {
        CAPTURE(v.name, s.to_string(), fuse);
        const std::int64_t c = s[1];
        const wb::backend::BatchNormParams p{1e-5f, 0.1f, fuse};
        const auto x = wb::test::random_normal(count(s), seed++, 2.0f);
        const auto gamma = wb::test::random_uniform(static_cast<std::size_t>(c), seed++, 0.5f, 1.5f);
        const auto beta = wb::test::random_normal(static_cast<std::size_t>(c), seed++, 0.3f);
        const auto rm = wb::test::random_normal(static_cast<std::size_t>(c), seed++, 0.1f);
        const auto rv = wb::test::random_uniform(static_cast<std::size_t>(c), seed++, 0.5f, 2.0f);
        const auto dy = wb::test::random_normal(count(s), seed++);
        auto run = [&](Backend& be, bool nhwc, std::vector<std::vector<float>>& out) {
          Tensor tx = up(be, s, x, nhwc), tg = up(be, {c}, gamma), tb = up(be, {c}, beta);
          Tensor trm = up(be, {c}, rm), trv = up(be, {c}, rv), y, ye, dx;
          Tensor dg = be.empty({c}, DType::f32), db = be.empty({c}, DType::f32);
          wb::backend::BatchNormState st;
          be.batchnorm_forward_train(tx, tg, tb, y, trm, trv, st, p);
          be.batchnorm_backward(tx, up(be, s, dy, nhwc), tg, tb, st, dx, dg, db, p);
          be.batchnorm_forward_eval(tx, tg, tb, ye, trm, trv, p);
          out = {down(be, y), down(be, trm), down(be, trv), down(be, dx), down(be, dg), down(be, db), down(be, ye)};
        };
        std::vector<std::vector<float>> want, got;
        run(*cpu, false, want);
        run(*gpu, v.channels_last, got);
        const char* names[] = {"bn y", "running_mean", "running_var", "bn dx", "dgamma", "dbeta", "bn eval y"};
        for (std::size_t i = 0; i < want.size(); ++i) expect_close(names[i], got[i], want[i], kFp32Tol, worst);
      }
    }
    WARN("batch norm " << v.name << ": worst rel-L2 vs cpu " << worst);
  }
}

// SyncBatchNorm's four steps over a batch split into parts (as processes hold it), the parts' sums added
// as the allreduce would: every part's y, dx, running statistics, dgamma and dbeta against the CPU
// backend's (which test_backend_sync_norm checks against float64 batch norm over the whole batch), in
// NCHW and NHWC, with and without the fused relu.
TEST_CASE("cuda synchronised batch norm over parts matches the CPU backend", "[cuda][backend]") {
  auto cpu = wb::backend::make_cpu_backend({2});
  struct Case {
    Shape part;
    int parts;
  };
  const Case cases[] = {{{2, 8, 5, 5}, 2}, {{1, 16, 7, 7}, 3}, {{3, 5, 4, 4}, 2}, {{4, 64, 1, 1}, 2}};
  for (bool nhwc : {false, true}) {
    Variant v{nhwc ? "fp32 channels_last" : "fp32", Precision::fp32, nhwc, kFp32Tol};
    auto gpu = make_gpu(v);
    double worst = 0.0;
    std::uint64_t seed = 900;
    for (const Case& k : cases) {
      for (bool fuse : {false, true}) {
        CAPTURE(v.name, k.part.to_string(), k.parts, fuse);
        const std::int64_t c = k.part[1];
        const std::size_t cu = static_cast<std::size_t>(c), pn = count(k.part);
        const wb::backend::BatchNormParams p{1e-5f, 0.1f, fuse};
        std::vector<std::vector<float>> xs, dys;
        for (int i = 0; i < k.parts; ++i) {
          xs.push_back(wb::test::random_normal(pn, seed++, 2.0f));
          for (auto& x : xs.back()) x += 3.0f;  // a mean away from 0
          dys.push_back(wb::test::random_normal(pn, seed++));
        }
        const auto gamma = wb::test::random_uniform(cu, seed++, 0.5f, 1.5f);
        const auto beta = wb::test::random_normal(cu, seed++, 0.3f);
        const auto rm = wb::test::random_normal(cu, seed++, 0.1f);
        const auto rv = wb::test::random_uniform(cu, seed++, 0.5f, 2.0f);
        // Per part: y, running mean, running var, dx, dgamma, dbeta.
        auto run = [&](Backend& be, bool in_nhwc, std::vector<std::vector<float>>& out) {
          struct Part {
            Tensor x, dy, y, dx, rm, rv, dg, db;
            wb::backend::BatchNormState st;
          };
          std::vector<Part> parts(static_cast<std::size_t>(k.parts));
          Tensor tg = up(be, {c}, gamma), tb = up(be, {c}, beta);
          std::vector<double> sums(2 * cu, 0.0), mine(2 * cu);
          for (std::size_t i = 0; i < parts.size(); ++i) {
            Part& q = parts[i];
            q.x = up(be, k.part, xs[i], in_nhwc);
            q.dy = up(be, k.part, dys[i], in_nhwc);
            q.rm = up(be, {c}, rm);
            q.rv = up(be, {c}, rv);
            q.dg = be.empty({c}, DType::f32);
            q.db = be.empty({c}, DType::f32);
            be.batchnorm_sums(q.x, mine);
            for (std::size_t j = 0; j < mine.size(); ++j) sums[j] += mine[j];
          }
          const std::int64_t n = k.part[0] * k.part[2] * k.part[3] * k.parts;
          std::vector<double> mean(cu), var(cu), grad_sums(2 * cu, 0.0);
          for (std::size_t j = 0; j < cu; ++j) {
            mean[j] = sums[j] / static_cast<double>(n);
            var[j] = std::max(0.0, sums[cu + j] / static_cast<double>(n) - mean[j] * mean[j]);
          }
          for (Part& q : parts) {
            be.batchnorm_forward_with_stats(q.x, tg, tb, q.y, q.rm, q.rv, mean, var, n, q.st, p);
            be.batchnorm_backward_reduce(q.x, q.dy, tg, tb, q.st, q.dx, q.dg, q.db, mine, p);
            for (std::size_t j = 0; j < mine.size(); ++j) grad_sums[j] += mine[j];
          }
          out.clear();
          for (Part& q : parts) {
            be.batchnorm_backward_elemt(q.x, tg, q.st, q.dx, grad_sums, n, p);
            for (const Tensor* t : {&q.y, &q.rm, &q.rv, &q.dx, &q.dg, &q.db}) out.push_back(down(be, *t));
          }
        };
        std::vector<std::vector<float>> want, got;
        run(*cpu, false, want);
        run(*gpu, nhwc, got);
        REQUIRE(got.size() == want.size());
        const char* names[] = {"sync bn y", "running_mean", "running_var", "sync bn dx", "dgamma", "dbeta"};
        for (std::size_t i = 0; i < want.size(); ++i) expect_close(names[i % 6], got[i], want[i], kFp32Tol, worst);
      }
    }
    WARN("synchronised batch norm " << v.name << ": worst rel-L2 vs cpu " << worst);
  }
}

TEST_CASE("cuda relu, add, max-pool and global average pool match the CPU backend", "[cuda][backend]") {
  auto cpu = wb::backend::make_cpu_backend({2});
  const Shape shapes[] = {{2, 5, 8, 8}, {2, 16, 7, 9}, {3, 64, 4, 4}};
  const wb::backend::Pool2dParams mp{3, 2, 1};
  for (const Variant& v : kVariants) {
    auto gpu = make_gpu(v);
    double worst = 0.0;
    std::uint64_t seed = 200;
    for (const Shape& s : shapes) {
      CAPTURE(v.name, s.to_string());
      const auto a = distinct_values(count(s), seed++);
      const auto b = wb::test::random_normal(count(s), seed++);
      const auto dy = wb::test::random_normal(count(s), seed++);
      const Shape ms{s[0], s[1], (s[2] - 1) / 2 + 1, (s[3] - 1) / 2 + 1}, gs{s[0], s[1], 1, 1};
      const auto dym = wb::test::random_normal(count(ms), seed++);
      const auto dyg = wb::test::random_normal(count(gs), seed++);
      auto run = [&](Backend& be, bool nhwc) {
        std::vector<std::vector<float>> out;
        Tensor ta = up(be, s, a, nhwc), tb = up(be, s, b, nhwc), y, dx, sum, sum_relu;
        be.relu_forward(ta, y);
        be.relu_backward(y, up(be, s, dy, !nhwc && &be != cpu.get()), dx);  // dy in the other layout
        be.add(ta, tb, sum, false);
        be.add(ta, up(be, s, b), sum_relu, true);
        Tensor inplace = up(be, s, a, nhwc), acc = up(be, s, a, nhwc);
        be.relu_forward(inplace, inplace);
        be.add(acc, tb, acc, false);
        Tensor dyi = up(be, s, dy, nhwc);
        be.relu_backward(y, dyi, dyi);
        Tensor my, ws, mdx, gy, gdx;
        be.maxpool_forward(ta, my, ws, mp);
        REQUIRE(my.shape() == ms);
        be.maxpool_backward(ta, my, up(be, ms, dym, nhwc), ws, mdx, mp);
        be.global_avgpool_forward(ta, gy);
        REQUIRE(gy.shape() == gs);
        be.global_avgpool_backward(ta, up(be, gs, dyg), gdx);
        for (const Tensor* t : {&y, &dx, &sum, &sum_relu, &inplace, &acc, &dyi, &my, &mdx, &gy, &gdx}) {
          out.push_back(down(be, *t));
        }
        return out;
      };
      const auto want = run(*cpu, false);
      const auto got = run(*gpu, v.channels_last);
      const char* names[] = {"relu", "relu dx", "add", "add relu", "relu in place", "add in place", "relu dx in place",
                             "maxpool y", "maxpool dx", "gap y", "gap dx"};
      for (std::size_t i = 0; i < want.size(); ++i) expect_close(names[i], got[i], want[i], kFp32Tol, worst);
    }
    WARN("relu/add/pool " << v.name << ": worst rel-L2 vs cpu " << worst);
  }
}

TEST_CASE("cuda accumulate scales and adds into a view, leaving the rest of the buffer", "[cuda][backend]") {
  auto gpu = make_gpu(kVariants[0]);
  const double worst = wb::test::check_accumulate(*gpu);
  CAPTURE(worst);
  CHECK(worst <= 1e-6);
}

TEST_CASE("cuda linear and softmax cross-entropy match the CPU backend", "[cuda][backend]") {
  auto cpu = wb::backend::make_cpu_backend({2});
  for (const Variant& v : kVariants) {
    auto gpu = make_gpu(v);
    double worst = 0.0;
    std::uint64_t seed = 300;
    for (const Shape& xs : {Shape{4, 32}, Shape{6, 64, 1, 1}}) {
      CAPTURE(v.name, xs.to_string());
      const std::int64_t n = xs[0], in = xs[1], out = 10;
      const auto x = wb::test::random_normal(count(xs), seed++);
      const auto w = wb::test::random_normal(static_cast<std::size_t>(out * in), seed++, 0.2f);
      const auto b = wb::test::random_normal(static_cast<std::size_t>(out), seed++);
      const auto dy = wb::test::random_normal(static_cast<std::size_t>(n * out), seed++);
      auto run = [&](Backend& be) {
        Tensor tx = up(be, xs, x), tw = up(be, {out, in}, w), tb = up(be, {out}, b), y, dx;
        Tensor dw = be.empty({out, in}, DType::f32), db = be.empty({out}, DType::f32);
        be.linear_forward(tx, tw, tb, y);
        be.linear_backward(tx, tw, up(be, {n, out}, dy), dx, dw, db);
        REQUIRE(dx.shape() == xs);
        return std::vector<std::vector<float>>{down(be, y), down(be, dx), down(be, dw), down(be, db)};
      };
      const auto want = run(*cpu), got = run(*gpu);
      expect_close("linear y", got[0], want[0], v.tol, worst);
      expect_close("linear dx", got[1], want[1], v.tol, worst);
      expect_close("linear dw", got[2], want[2], v.tol, worst);
      expect_close("linear db", got[3], want[3], kFp32Tol, worst);
    }
    for (auto conv : {wb::backend::LossConvention::torch, wb::backend::LossConvention::mindspore}) {
      for (float smoothing : {0.0f, 0.1f}) {
        for (std::int64_t k : {10, 1000}) {
          CAPTURE(v.name, static_cast<int>(conv), smoothing, k);
          const std::int64_t n = 6;
          const auto logits = wb::test::random_normal(static_cast<std::size_t>(n * k), seed++, 3.0f);
          std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
          for (std::int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % k);
          const wb::backend::LossParams p{conv, smoothing};
          auto run = [&](Backend& be) {
            Tensor tl = be.empty({n}, DType::i32), loss, probs, d;
            be.from_host(tl, labels);
            be.softmax_cross_entropy_forward(up(be, {n, k}, logits), tl, p, loss, probs);
            be.softmax_cross_entropy_backward(probs, tl, p, d);
            return std::vector<std::vector<float>>{down(be, loss), down(be, probs), down(be, d)};
          };
          const auto want = run(*cpu), got = run(*gpu);
          expect_close("loss", got[0], want[0], kFp32Tol, worst);
          expect_close("probs", got[1], want[1], kFp32Tol, worst);
          expect_close("dlogits", got[2], want[2], kFp32Tol, worst);
        }
      }
    }
    WARN("linear/loss " << v.name << ": worst rel-L2 vs cpu " << worst);
  }
  auto gpu = make_gpu(kVariants[0]);
  Tensor labels = gpu->empty({2}, DType::i32), loss, probs;
  gpu->from_host(labels, std::vector<std::int32_t>{1, 10});
  REQUIRE_THROWS_AS(gpu->softmax_cross_entropy_forward(up(*gpu, {2, 10}, std::vector<float>(20, 0.5f)), labels, {},
                                                       loss, probs),
                    BackendError);
}

TEST_CASE("cuda sgd_update matches the CPU backend and refreshes cached weights", "[cuda][backend]") {
  auto cpu = wb::backend::make_cpu_backend({2});
  // A conv weight (8, 4, 3, 3) = 288 elements at offset 0, a bias-like segment, a gap of 100 elements that
  // belongs to no segment (must stay untouched), and a large segment spanning several chunks.
  const std::vector<wb::backend::ParamSegment> segments = {{0, 288, true}, {288, 50, false}, {438, 9000, true}};
  const std::size_t total = 9438;
  const auto p0 = wb::test::random_normal(total, 400), m0 = wb::test::random_normal(total, 401);
  const auto g1 = wb::test::random_normal(total, 402), g2 = wb::test::random_normal(total, 403);
  const auto x = wb::test::random_normal(2 * 4 * 6 * 6, 404);
  for (const Variant& v : kVariants) {
    for (bool nesterov : {false, true}) {
      for (float momentum : {0.9f, 0.0f}) {
        CAPTURE(v.name, nesterov, momentum);
        auto gpu = make_gpu(v);
        auto run = [&](Backend& be, bool nhwc) {
          Tensor params = up(be, {static_cast<std::int64_t>(total)}, p0);
          Tensor mom = up(be, {static_cast<std::int64_t>(total)}, m0);  // garbage for first_step: never read
          Tensor grads = up(be, {static_cast<std::int64_t>(total)}, g1);
          Tensor w = be.view(params, 0, {8, 4, 3, 3}), tx = up(be, {2, 4, 6, 6}, x, nhwc), y0, y1;
          be.conv2d_forward(tx, w, y0, {1, 1});  // caches a converted filter on the cuda backend
          wb::backend::SgdParams sp{0.1f, momentum, 1e-2f, nesterov, true};
          be.sgd_update(params, grads, mom, segments, sp);
          be.from_host(grads, g2);
          sp.first_step = false;
          be.sgd_update(params, grads, mom, segments, sp);
          be.conv2d_forward(tx, w, y1, {1, 1});  // must see the updated weights
          return std::vector<std::vector<float>>{down(be, params), down(be, mom), down(be, y0), down(be, y1)};
        };
        const auto want = run(*cpu, false), got = run(*gpu, v.channels_last);
        double worst = 0.0;
        expect_close("params", got[0], want[0], 1e-6, worst);
        if (momentum != 0.0f) expect_close("momentum", got[1], want[1], 1e-6, worst);
        for (std::size_t i = 338; i < 438; ++i) {
          REQUIRE(got[0][i] == p0[i]);  // outside every segment
          REQUIRE(got[1][i] == m0[i]);
        }
        expect_close("conv before update", got[2], want[2], v.tol, worst);
        expect_close("conv after update", got[3], want[3], v.tol, worst);
      }
    }
  }
  auto gpu = make_gpu(kVariants[0]);
  Tensor a = gpu->empty({100}, DType::f32), b = gpu->empty({100}, DType::f32), c = gpu->empty({100}, DType::f32);
  const std::vector<wb::backend::ParamSegment> overlap = {{0, 60, true}, {50, 50, false}};
  REQUIRE_THROWS_AS(gpu->sgd_update(a, b, c, overlap, {}), BackendError);
  const std::vector<wb::backend::ParamSegment> outside = {{90, 20, true}};
  REQUIRE_THROWS_AS(gpu->sgd_update(a, b, c, outside, {}), BackendError);
}

TEST_CASE("cuda training steps allocate nothing after the first", "[cuda][backend]") {
  for (const Variant& v : kVariants) {
    CAPTURE(v.name);
    auto gpu = make_gpu(v);
    auto& cuda = dynamic_cast<CudaBackend&>(*gpu);
    const Shape xs{4, 16, 12, 12}, ws{32, 16, 3, 3};
    Tensor x = up(*gpu, xs, wb::test::random_normal(count(xs), 500));
    Tensor params = up(*gpu, {ws.numel() + 64}, wb::test::random_normal(count(ws) + 64, 501, 0.1f));
    Tensor grads = gpu->empty({ws.numel() + 64}, DType::f32), mom = gpu->empty({ws.numel() + 64}, DType::f32);
    Tensor w = gpu->view(params, 0, ws), gamma = gpu->view(params, count(ws), {32});
    Tensor beta = gpu->view(params, count(ws) + 32, {32});
    Tensor dw = gpu->view(grads, 0, ws), dg = gpu->view(grads, count(ws), {32});
    Tensor db = gpu->view(grads, count(ws) + 32, {32});
    Tensor rm = up(*gpu, {32}, std::vector<float>(32, 0.0f)), rv = up(*gpu, {32}, std::vector<float>(32, 1.0f));
    const std::vector<wb::backend::ParamSegment> segs = {{0, count(ws), true}, {count(ws), 64, false}};
    Tensor y, z, out, dout, dz, dy, dx;
    wb::backend::BatchNormState st;
    std::int64_t mallocs_after_first = 0, searches_after_first = 0;
    for (int step = 0; step < 3; ++step) {
      gpu->conv2d_forward(x, w, y, {1, 1});
      gpu->batchnorm_forward_train(y, gamma, beta, z, rm, rv, st, {1e-5f, 0.1f, true});
      gpu->add(z, z, out, true);
      if (!dout.defined()) dout = gpu->empty(out.shape(), DType::f32);  // kept across steps, as the model does
      gpu->fill(dout, 0.5f);
      gpu->relu_backward(out, dout, dz);
      gpu->batchnorm_backward(y, dz, gamma, beta, st, dy, dg, db, {1e-5f, 0.1f, true});
      gpu->conv2d_backward_weights(x, dy, dw, {1, 1});
      gpu->conv2d_backward_data(dy, w, dx, xs, {1, 1});
      gpu->sgd_update(params, grads, mom, segs, {0.01f, 0.9f, 1e-4f, false, step == 0});
      gpu->synchronize();
      const auto s = cuda.stats();
      if (step == 0) {
        mallocs_after_first = s.memory.cuda_malloc_count;
        searches_after_first = s.algorithm_searches;
        CHECK(searches_after_first == 3);
      } else {
        CAPTURE(step, s.memory.cuda_malloc_count, mallocs_after_first);
        CHECK(s.memory.cuda_malloc_count == mallocs_after_first);
        CHECK(s.algorithm_searches == searches_after_first);
      }
    }
    WARN(v.name << ": " << mallocs_after_first << " cudaMalloc calls in the first step, none after");
  }
}

TEST_CASE("cuda conv-bn-relu-pool-add-gap-fc chain matches the CPU backend in every layout and precision",
          "[cuda][backend]") {
  auto cpu = wb::backend::make_cpu_backend({2});
  const auto x = wb::test::random_normal(2 * 3 * 32 * 32, 600);
  const auto w1 = wb::test::random_normal(8 * 3 * 7 * 7, 601, 0.1f), w2 = wb::test::random_normal(8 * 8 * 9, 602, 0.1f);
  const auto w3 = wb::test::random_normal(10 * 8, 603, 0.3f), b3 = wb::test::random_normal(10, 604, 0.1f);
  const auto g1 = wb::test::random_uniform(8, 605, 0.5f, 1.5f), be1 = wb::test::random_normal(8, 606, 0.2f);
  const std::vector<std::int32_t> labels = {3, 7};
  auto run = [&](Backend& be) {
    Tensor tx = up(be, {2, 3, 32, 32}, x), tw1 = up(be, {8, 3, 7, 7}, w1), tw2 = up(be, {8, 8, 3, 3}, w2);
    Tensor tw3 = up(be, {10, 8}, w3), tb3 = up(be, {10}, b3), tg = up(be, {8}, g1), tb = up(be, {8}, be1);
    Tensor rm1 = up(be, {8}, std::vector<float>(8, 0.0f)), rv1 = up(be, {8}, std::vector<float>(8, 1.0f));
    Tensor rm2 = up(be, {8}, std::vector<float>(8, 0.0f)), rv2 = up(be, {8}, std::vector<float>(8, 1.0f));
    Tensor tl = be.empty({2}, DType::i32);
    be.from_host(tl, labels);
    const wb::backend::BatchNormParams fused{1e-5f, 0.1f, true}, plain{1e-5f, 0.1f, false};
    wb::backend::BatchNormState s1, s2;
    Tensor y1, z1, m, ws, y2, z2, sum, g, logits, loss, probs;
    be.conv2d_forward(tx, tw1, y1, {2, 3});                        // (2, 8, 16, 16)
    be.batchnorm_forward_train(y1, tg, tb, z1, rm1, rv1, s1, fused);
    be.maxpool_forward(z1, m, ws, {3, 2, 1});                      // (2, 8, 8, 8)
    be.conv2d_forward(m, tw2, y2, {1, 1});
    be.batchnorm_forward_train(y2, tg, tb, z2, rm2, rv2, s2, plain);
    be.add(z2, m, sum, true);
    be.global_avgpool_forward(sum, g);                             // (2, 8, 1, 1)
    be.linear_forward(g, tw3, tb3, logits);                        // (2, 10)
    be.softmax_cross_entropy_forward(logits, tl, {wb::backend::LossConvention::torch, 0.1f}, loss, probs);
    Tensor dlogits, dg, ds, dsum, dy2, dm, dz1, dy1;
    Tensor dw1 = be.empty({8, 3, 7, 7}, DType::f32), dw2 = be.empty({8, 8, 3, 3}, DType::f32);
    Tensor dw3 = be.empty({10, 8}, DType::f32), db3 = be.empty({10}, DType::f32);
    Tensor dga1 = be.empty({8}, DType::f32), dbe1 = be.empty({8}, DType::f32);
    Tensor dga2 = be.empty({8}, DType::f32), dbe2 = be.empty({8}, DType::f32);
    be.softmax_cross_entropy_backward(probs, tl, {wb::backend::LossConvention::torch, 0.1f}, dlogits);
    be.linear_backward(g, tw3, dlogits, dg, dw3, db3);
    be.global_avgpool_backward(sum, dg, ds);
    be.relu_backward(sum, ds, dsum);
    be.batchnorm_backward(y2, dsum, tg, tb, s2, dy2, dga2, dbe2, plain);
    be.conv2d_backward_weights(m, dy2, dw2, {1, 1});
    be.conv2d_backward_data(dy2, tw2, dm, m.shape(), {1, 1});
    be.add(dm, dsum, dm, false);
    be.maxpool_backward(z1, m, dm, ws, dz1, {3, 2, 1});
    be.batchnorm_backward(y1, dz1, tg, tb, s1, dy1, dga1, dbe1, fused);
    be.conv2d_backward_weights(tx, dy1, dw1, {2, 3});
    return std::vector<std::vector<float>>{down(be, loss), down(be, logits), down(be, dw3), down(be, dw2),
                                           down(be, dga1), down(be, dw1)};
  };
  const auto want = run(*cpu);
  const char* names[] = {"loss", "logits", "fc dw", "conv2 dw", "bn1 dgamma", "conv1 dw"};
  for (const Variant& v : kVariants) {
    CAPTURE(v.name);
    auto gpu = make_gpu(v);
    const auto got = run(*gpu);
    double worst = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) expect_close(names[i], got[i], want[i], 10.0 * v.tol, worst);
    WARN("chain " << v.name << ": worst rel-L2 vs cpu " << worst);
  }
}

#endif  // WB_BACKEND_CUDA
