// ReLU, residual add (+ fused relu), max pooling 3x3/2 pad 1, global average pooling and linear of the
// CPU backend: against PyTorch on random inputs (plain and blocked layouts) and against central
// differences of our own forwards.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "test_backend_util.hpp"

using wb::backend::Pool2dParams;
using wb::backend::Shape;
using wb::backend::Tensor;

namespace {

// Distinct values with gaps of at least 0.01 (no max-pool ties, no relu input near 0).
std::vector<float> distinct_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  std::mt19937_64 gen(seed);
  std::shuffle(v.begin(), v.end(), gen);
  for (auto& x : v) x = (x - static_cast<float>(n) / 2.0f + 0.5f) * 0.02f;
  return v;
}

const Pool2dParams kMaxPool{3, 2, 1};

}  // namespace

TEST_CASE("relu, add, max-pool, global average pool and linear match PyTorch", "[trainer][backend]") {
  wb::test::TempDir dir("ops");
  auto be = wb::backend::make_cpu_backend({2});
  std::map<std::string, std::vector<float>> ours, grads;  // forward outputs, gradients
  std::ostringstream script;
  int id = 0;
  auto put = [&](const std::string& name, const std::vector<float>& v) { wb::test::write_raw(dir.file(name), v); };

  // relu + add, plain and blocked, channel counts 5 and 32.
  for (bool blocked : {false, true}) {
    for (const Shape& s : {Shape{2, 5, 4, 3}, Shape{2, 32, 3, 3}}) {
      const auto n = static_cast<std::size_t>(s.numel());
      const auto a = wb::test::random_normal(n, 40 + id), b = wb::test::random_normal(n, 50 + id);
      const auto dy = wb::test::random_normal(n, 60 + id);
      const std::string k = wb::test::fname("e", static_cast<std::size_t>(id));
      put(k + "a", a);
      put(k + "b", b);
      put(k + "dy", dy);
      Tensor ta = wb::test::make_tensor(*be, s, a, blocked), tb = wb::test::make_tensor(*be, s, b, blocked);
      Tensor tdy = wb::test::make_tensor(*be, s, dy, !blocked);  // the other layout: converted inside
      Tensor y, dx, sum, sum_relu;
      be->relu_forward(ta, y);
      be->relu_backward(y, tdy, dx);
      be->add(ta, tb, sum, false);
      be->add(ta, tb, sum_relu, true);
      Tensor inplace = wb::test::make_tensor(*be, s, a, blocked);
      be->relu_forward(inplace, inplace);
      ours[k + "relu"] = wb::test::to_vec(*be, y);
      ours[k + "relu_inplace"] = wb::test::to_vec(*be, inplace);
      grads[k + "drelu"] = wb::test::to_vec(*be, dx);
      ours[k + "add"] = wb::test::to_vec(*be, sum);
      ours[k + "add_relu"] = wb::test::to_vec(*be, sum_relu);
      script << "a = load('" << k << "a', *" << s.to_string() << ").requires_grad_(); b = load('" << k << "b', *"
             << s.to_string() << ")\n"
             << "y = F.relu(a); y.backward(load('" << k << "dy', *" << s.to_string() << "))\n"
             << "save('" << k << "relu.out', y); save('" << k << "relu_inplace.out', y); save('" << k
             << "drelu.out', a.grad)\n"
             << "save('" << k << "add.out', a + b); save('" << k << "add_relu.out', F.relu(a + b))\n";
      ++id;
      wb::test::require_no_overrun(*be);
    }
  }
  // max-pool 3x3/2 pad 1 and global average pooling.
  for (bool blocked : {false, true}) {
    for (const Shape& s : {Shape{2, 5, 8, 8}, Shape{2, 16, 7, 9}, Shape{3, 64, 4, 4}}) {
      const auto n = static_cast<std::size_t>(s.numel());
      const auto x = distinct_values(n, 70 + id);
      const Shape ms{s[0], s[1], (s[2] - 1) / 2 + 1, (s[3] - 1) / 2 + 1}, gs{s[0], s[1], 1, 1};
      const auto dym = wb::test::random_normal(static_cast<std::size_t>(ms.numel()), 80 + id);
      const auto dyg = wb::test::random_normal(static_cast<std::size_t>(gs.numel()), 90 + id);
      const std::string k = wb::test::fname("p", static_cast<std::size_t>(id));
      put(k + "x", x);
      put(k + "dym", dym);
      put(k + "dyg", dyg);
      Tensor tx = wb::test::make_tensor(*be, s, x, blocked);
      Tensor my, ws, mdx, gy, gdx;
      be->maxpool_forward(tx, my, ws, kMaxPool);
      REQUIRE(my.shape() == ms);
      be->maxpool_backward(tx, my, wb::test::make_tensor(*be, ms, dym, blocked), ws, mdx, kMaxPool);
      be->global_avgpool_forward(tx, gy);
      REQUIRE(gy.shape() == gs);
      be->global_avgpool_backward(tx, wb::test::make_tensor(*be, gs, dyg), gdx);  // plain, as the fc hands it
      ours[k + "max"] = wb::test::to_vec(*be, my);
      grads[k + "dmax"] = wb::test::to_vec(*be, mdx);
      ours[k + "gap"] = wb::test::to_vec(*be, gy);
      grads[k + "dgap"] = wb::test::to_vec(*be, gdx);
      script << "x = load('" << k << "x', *" << s.to_string() << ").requires_grad_()\n"
             << "m = F.max_pool2d(x, 3, 2, 1); g = F.adaptive_avg_pool2d(x, 1)\n"
             << "m.backward(load('" << k << "dym', *" << ms.to_string() << ")); save('" << k << "dmax.out', x.grad)\n"
             << "x.grad = None; g.backward(load('" << k << "dyg', *" << gs.to_string() << ")); save('" << k
             << "dgap.out', x.grad)\n"
             << "save('" << k << "max.out', m); save('" << k << "gap.out', g)\n";
      ++id;
      wb::test::require_no_overrun(*be);
    }
  }
  // linear on (N, IN) and on a blocked (N, IN, 1, 1) input, as the model feeds it from the pooling.
  for (int variant = 0; variant < 3; ++variant) {
    const std::int64_t n = 4, in = variant == 0 ? 7 : 64, out = variant == 2 ? 10 : 5;
    const Shape xs = variant == 0 ? Shape{n, in} : Shape{n, in, 1, 1};
    const auto x = wb::test::random_normal(static_cast<std::size_t>(n * in), 100 + id);
    const auto w = wb::test::random_normal(static_cast<std::size_t>(out * in), 110 + id, 0.3f);
    const auto b = wb::test::random_normal(static_cast<std::size_t>(out), 120 + id);
    const auto dy = wb::test::random_normal(static_cast<std::size_t>(n * out), 130 + id);
    const std::string k = wb::test::fname("l", static_cast<std::size_t>(id));
    put(k + "x", x);
    put(k + "w", w);
    put(k + "b", b);
    put(k + "dy", dy);
    Tensor tx = wb::test::make_tensor(*be, xs, x, variant > 0), tw = wb::test::make_tensor(*be, {out, in}, w);
    Tensor tb = wb::test::make_tensor(*be, {out}, b), tdy = wb::test::make_tensor(*be, {n, out}, dy);
    Tensor y, dx, dw = be->empty({out, in}, wb::backend::DType::f32), db = be->empty({out}, wb::backend::DType::f32);
    be->linear_forward(tx, tw, tb, y);
    be->linear_backward(tx, tw, tdy, dx, dw, db);
    REQUIRE(dx.shape() == xs);
    ours[k + "y"] = wb::test::to_vec(*be, y);
    grads[k + "dx"] = wb::test::to_vec(*be, dx);
    grads[k + "dw"] = wb::test::to_vec(*be, dw);
    grads[k + "db"] = wb::test::to_vec(*be, db);
    script << "x = load('" << k << "x', " << n << ", " << in << ").requires_grad_(); w = load('" << k << "w', " << out
           << ", " << in << ").requires_grad_(); b = load('" << k << "b', " << out << ").requires_grad_()\n"
           << "y = F.linear(x, w, b); y.backward(load('" << k << "dy', " << n << ", " << out << "))\n"
           << "save('" << k << "y.out', y); save('" << k << "dx.out', x.grad); save('" << k << "dw.out', w.grad); save('"
           << k << "db.out', b.grad)\n";
    ++id;
    wb::test::require_no_overrun(*be);
  }
  wb::test::run_torch_script(dir, "ops", script.str());

  double worst_fwd = 0, worst_grad = 0;
  for (const auto* table : {&ours, &grads}) {
    const bool grad = table == &grads;
    for (const auto& [name, v] : *table) {
      const double e = wb::test::rel_l2(v, wb::test::read_raw(dir.file(name + ".out")));
      CAPTURE(name, e);
      CHECK(e <= (grad ? 1e-4 : 1e-5));
      double& worst = grad ? worst_grad : worst_fwd;
      worst = std::max(worst, e);
    }
  }
  std::printf("relu/add/maxpool/gap/linear vs torch: worst rel-L2 forward %.3g, gradients %.3g over %zu tensors\n",
              worst_fwd, worst_grad, ours.size() + grads.size());
}

TEST_CASE("relu, pooling and linear gradients match finite differences of the forwards", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({2});
  const bool blocked = GENERATE(false, true);
  CAPTURE(blocked);
  // Inputs are at least 0.01 apart and away from 0, so a step of 1e-3 stays on one linear piece of relu
  // and max-pool and the difference quotient is exact up to rounding.
  const Shape s{2, 5, 6, 7};
  const auto n = static_cast<std::size_t>(s.numel());
  const auto x = distinct_values(n, 3);
  const double h = 1e-3, tol = 1e-3;
  SECTION("relu") {
    const auto r = wb::test::random_normal(n, 4);
    Tensor y, dx;
    be->relu_forward(wb::test::make_tensor(*be, s, x, blocked), y);
    be->relu_backward(y, wb::test::make_tensor(*be, s, r, blocked), dx);
    wb::test::check_gradient("relu dx", x, wb::test::to_vec(*be, dx), [&](const std::vector<float>& v) {
      Tensor out;
      be->relu_forward(wb::test::make_tensor(*be, s, v, blocked), out);
      return wb::test::dot(wb::test::to_vec(*be, out), r);
    }, h, tol, 5);
  }
  SECTION("max-pool") {
    Tensor tx = wb::test::make_tensor(*be, s, x, blocked), y, ws, dx;
    be->maxpool_forward(tx, y, ws, kMaxPool);
    const auto r = wb::test::random_normal(static_cast<std::size_t>(y.numel()), 6);
    be->maxpool_backward(tx, y, wb::test::make_tensor(*be, y.shape(), r, blocked), ws, dx, kMaxPool);
    wb::test::check_gradient("maxpool dx", x, wb::test::to_vec(*be, dx), [&](const std::vector<float>& v) {
      Tensor out, w2;
      be->maxpool_forward(wb::test::make_tensor(*be, s, v, blocked), out, w2, kMaxPool);
      return wb::test::dot(wb::test::to_vec(*be, out), r);
    }, h, tol, 7);
  }
  SECTION("global average pool") {
    Tensor tx = wb::test::make_tensor(*be, s, x, blocked), y, dx;
    be->global_avgpool_forward(tx, y);
    const auto r = wb::test::random_normal(static_cast<std::size_t>(y.numel()), 8);
    be->global_avgpool_backward(tx, wb::test::make_tensor(*be, y.shape(), r), dx);
    wb::test::check_gradient("gap dx", x, wb::test::to_vec(*be, dx), [&](const std::vector<float>& v) {
      Tensor out;
      be->global_avgpool_forward(wb::test::make_tensor(*be, s, v, blocked), out);
      return wb::test::dot(wb::test::to_vec(*be, out), r);
    }, 0.5, 1e-4, 9);
  }
  SECTION("linear") {
    const std::int64_t bn = 3, in = 6, out = 4;
    const auto xv = wb::test::random_normal(bn * in, 10), wv = wb::test::random_normal(out * in, 11);
    const auto bv = wb::test::random_normal(out, 12), r = wb::test::random_normal(bn * out, 13);
    auto objective = [&](const std::vector<float>& xx, const std::vector<float>& ww, const std::vector<float>& bb) {
      Tensor y;
      be->linear_forward(wb::test::make_tensor(*be, {bn, in}, xx), wb::test::make_tensor(*be, {out, in}, ww),
                         wb::test::make_tensor(*be, {out}, bb), y);
      return wb::test::dot(wb::test::to_vec(*be, y), r);
    };
    Tensor dx, dw = be->empty({out, in}, wb::backend::DType::f32), db = be->empty({out}, wb::backend::DType::f32);
    be->linear_backward(wb::test::make_tensor(*be, {bn, in}, xv), wb::test::make_tensor(*be, {out, in}, wv),
                        wb::test::make_tensor(*be, {bn, out}, r), dx, dw, db);
    wb::test::check_gradient("linear dx", xv, wb::test::to_vec(*be, dx),
                             [&](const std::vector<float>& v) { return objective(v, wv, bv); }, 0.5, 1e-4, 14);
    wb::test::check_gradient("linear dw", wv, wb::test::to_vec(*be, dw),
                             [&](const std::vector<float>& v) { return objective(xv, v, bv); }, 0.5, 1e-4, 15);
    wb::test::check_gradient("linear db", bv, wb::test::to_vec(*be, db),
                             [&](const std::vector<float>& v) { return objective(xv, wv, v); }, 0.5, 1e-4, 16);
  }
}

TEST_CASE("accumulate scales and adds into a view, leaving the rest of the buffer", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({2});
  const double worst = wb::test::check_accumulate(*be);
  CAPTURE(worst);
  CHECK(worst <= 1e-6);  // two float roundings of values around 1
  wb::test::require_no_overrun(*be);
}

TEST_CASE("elementwise, pooling and linear ops reject bad shapes", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({1});
  Tensor a = be->empty({2, 3, 4, 4}, wb::backend::DType::f32), b = be->empty({2, 3, 4, 5}, wb::backend::DType::f32);
  Tensor y;
  REQUIRE_THROWS_AS(be->add(a, b, y, false), wb::backend::BackendError);
  Tensor w = be->empty({5, 4}, wb::backend::DType::f32), bias = be->empty({5}, wb::backend::DType::f32);
  Tensor x = be->empty({2, 3}, wb::backend::DType::f32);
  REQUIRE_THROWS_AS(be->linear_forward(x, w, bias, y), wb::backend::BackendError);
  Tensor ws;
  REQUIRE_THROWS_AS(be->maxpool_forward(a, y, ws, {3, 2, 2}), wb::backend::BackendError);  // pad > kernel / 2
  Tensor labels = be->empty({2}, wb::backend::DType::i32);
  REQUIRE_THROWS_AS(be->from_host(labels, std::vector<float>{1.0f, 2.0f}), wb::backend::BackendError);  // dtype
  REQUIRE_THROWS_AS(be->from_host(x, std::vector<float>(5)), wb::backend::BackendError);                // size
}

TEST_CASE("every allocation keeps a tail slack for kernels that store past the end, and a canary after it",
          "[trainer][backend]") {
  using wb::backend::cpu::CpuBackend;
  auto be = wb::backend::make_cpu_backend({1});
  auto& cpu = dynamic_cast<CpuBackend&>(*be);
  // The shape of the measured oneDNN 2.6 overrun: nChw16c with a 5-channel tail, add with a fused ReLU.
  const Shape s{2, 5, 4, 3};
  const auto n = static_cast<std::size_t>(s.numel());
  Tensor a = wb::test::make_tensor(*be, s, wb::test::random_normal(n, 1), true);
  Tensor b = wb::test::make_tensor(*be, s, wb::test::random_normal(n, 2), true);
  Tensor y;
  be->add(a, b, y, true);
  REQUIRE(cpu.damaged_guards() == 0);

  SECTION("a write inside the slack is tolerated") {
    auto* p = static_cast<unsigned char*>(y.data()) + y.bytes();
    std::fill_n(p, CpuBackend::kTailSlack, 0x11);
    REQUIRE(cpu.damaged_guards() == 0);
  }
  SECTION("a write that reaches the canary is counted, once per allocation") {
    auto* p = static_cast<unsigned char*>(y.data()) + y.bytes();
    p[CpuBackend::kTailSlack] = 0;  // the first canary byte (bytes is a multiple of 64 here)
    REQUIRE(cpu.damaged_guards() == 1);
    y = Tensor();  // freed allocations are no longer checked
    REQUIRE(cpu.damaged_guards() == 0);
  }
}
