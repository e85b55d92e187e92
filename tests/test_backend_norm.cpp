// Batch norm of the CPU backend: training forward (batch statistics, running mean / unbiased running
// variance with momentum 0.1), backward (dx, dgamma, dbeta), with and without the fused relu, and eval
// forward, against PyTorch's F.batch_norm and against central differences of our own forward.
#include <catch2/catch.hpp>

#include <sstream>

#include "test_backend_util.hpp"

using wb::backend::BatchNormParams;
using wb::backend::BatchNormState;
using wb::backend::Shape;
using wb::backend::Tensor;

namespace {

struct BnCase {
  Shape shape;
  bool blocked;
  bool relu;
};

const std::vector<BnCase> kCases = {
    {{4, 5, 3, 3}, false, false}, {{4, 5, 3, 3}, true, true},   {{2, 32, 4, 4}, true, false},
    {{8, 16, 1, 1}, true, true},  {{3, 24, 5, 7}, false, true}, {{2, 64, 2, 2}, true, false},
};

struct Params {
  std::vector<float> x, gamma, beta, rmean, rvar, dy;
};

Params make_params(const Shape& s, std::uint64_t seed) {
  const auto c = static_cast<std::size_t>(s[1]);
  Params p;
  p.x = wb::test::random_normal(static_cast<std::size_t>(s.numel()), seed, 2.0f);
  for (auto& v : p.x) v += 0.5f;  // a non-zero mean, as conv outputs have
  p.gamma = wb::test::random_uniform(c, seed + 1, 0.5f, 1.5f);
  p.beta = wb::test::random_normal(c, seed + 2, 0.5f);
  p.rmean = wb::test::random_normal(c, seed + 3, 0.2f);
  p.rvar = wb::test::random_uniform(c, seed + 4, 0.5f, 2.0f);
  p.dy = wb::test::random_normal(static_cast<std::size_t>(s.numel()), seed + 5);
  return p;
}

}  // namespace

TEST_CASE("batch norm train / eval forward and backward match PyTorch", "[trainer][backend]") {
  wb::test::TempDir dir("bn");
  auto be = wb::backend::make_cpu_backend({2});
  std::ostringstream script;
  script << "cases = [\n";
  struct Result {
    std::vector<float> y, rmean, rvar, dx, dgamma, dbeta, y_eval;
  };
  std::vector<Result> res(kCases.size());
  for (std::size_t i = 0; i < kCases.size(); ++i) {
    const BnCase& bc = kCases[i];
    const Shape& s = bc.shape;
    const Shape cs{s[1]};
    const Params p = make_params(s, 100 * i);
    for (auto [name, v] : {std::pair{"x", &p.x}, {"g", &p.gamma}, {"b", &p.beta}, {"rm", &p.rmean}, {"rv", &p.rvar},
                           {"dy", &p.dy}}) {
      wb::test::write_raw(dir.file(wb::test::fname(name, i)), *v);
    }
    script << "  (" << i << ", " << s.to_string() << ", " << (bc.relu ? "True" : "False") << "),\n";

    Tensor x = wb::test::make_tensor(*be, s, p.x, bc.blocked);
    Tensor gamma = wb::test::make_tensor(*be, cs, p.gamma), beta = wb::test::make_tensor(*be, cs, p.beta);
    Tensor rm = wb::test::make_tensor(*be, cs, p.rmean), rv = wb::test::make_tensor(*be, cs, p.rvar);
    Tensor dy = wb::test::make_tensor(*be, s, p.dy, bc.blocked);
    Tensor dgamma = be->empty(cs, wb::backend::DType::f32), dbeta = be->empty(cs, wb::backend::DType::f32);
    Tensor y, dx, y_eval;
    BatchNormState state;
    const BatchNormParams bp{1e-5f, 0.1f, bc.relu};
    // Eval first, on the initial running statistics.
    be->batchnorm_forward_eval(x, gamma, beta, y_eval, rm, rv, bp);
    be->batchnorm_forward_train(x, gamma, beta, y, rm, rv, state, bp);
    be->batchnorm_backward(x, dy, gamma, beta, state, dx, dgamma, dbeta, bp);
    res[i] = {wb::test::to_vec(*be, y),      wb::test::to_vec(*be, rm),     wb::test::to_vec(*be, rv),
              wb::test::to_vec(*be, dx),     wb::test::to_vec(*be, dgamma), wb::test::to_vec(*be, dbeta),
              wb::test::to_vec(*be, y_eval)};
    wb::test::require_no_overrun(*be);
  }
  script << "]\n"
            "for i, s, relu in cases:\n"
            "    C = s[1]\n"
            "    x = load(f'x{i}', *s).requires_grad_()\n"
            "    g = load(f'g{i}', C).requires_grad_(); b = load(f'b{i}', C).requires_grad_()\n"
            "    rm = load(f'rm{i}', C); rv = load(f'rv{i}', C)\n"
            "    ye = F.batch_norm(x, rm, rv, g, b, training=False, eps=1e-5)\n"
            "    if relu: ye = F.relu(ye)\n"
            "    save(f'ye{i}.out', ye)\n"
            "    y = F.batch_norm(x, rm, rv, g, b, training=True, momentum=0.1, eps=1e-5)\n"
            "    if relu: y = F.relu(y)\n"
            "    y.backward(load(f'dy{i}', *s))\n"
            "    for name, t in (('y', y), ('rm', rm), ('rv', rv), ('dx', x.grad), ('dg', g.grad), ('db', b.grad)):\n"
            "        save(f'{name}{i}.out', t)\n";
  wb::test::run_torch_script(dir, "bn", script.str());

  double worst_fwd = 0, worst_grad = 0;
  for (std::size_t i = 0; i < kCases.size(); ++i) {
    CAPTURE(i, kCases[i].shape.to_string(), kCases[i].blocked, kCases[i].relu);
    auto ref = [&](const char* name) { return wb::test::read_raw(dir.file(wb::test::fname(name, i, ".out"))); };
    const Result& r = res[i];
    const double fwd[] = {wb::test::rel_l2(r.y, ref("y")), wb::test::rel_l2(r.rmean, ref("rm")),
                          wb::test::rel_l2(r.rvar, ref("rv")), wb::test::rel_l2(r.y_eval, ref("ye"))};
    const double grad[] = {wb::test::rel_l2(r.dx, ref("dx")), wb::test::rel_l2(r.dgamma, ref("dg")),
                           wb::test::rel_l2(r.dbeta, ref("db"))};
    for (double e : fwd) {
      CHECK(e <= 1e-5);
      worst_fwd = std::max(worst_fwd, e);
    }
    for (double e : grad) {
      CHECK(e <= 1e-4);
      worst_grad = std::max(worst_grad, e);
    }
  }
  std::printf("batch norm vs torch: worst rel-L2 forward/running stats %.3g, gradients %.3g over %zu cases\n",
              worst_fwd, worst_grad, kCases.size());
}

TEST_CASE("batch norm gradients match finite differences of the forward", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({2});
  auto bc = GENERATE(BnCase{{4, 3, 3, 3}, false, false}, BnCase{{3, 18, 2, 2}, true, false},
                     BnCase{{4, 5, 2, 3}, true, true});
  CAPTURE(bc.shape.to_string(), bc.blocked, bc.relu);
  const Shape& s = bc.shape;
  const Shape cs{s[1]};
  Params p = make_params(s, 7);
  const BatchNormParams bp{1e-5f, 0.1f, bc.relu};
  Tensor rm = be->empty(cs, wb::backend::DType::f32), rv = be->empty(cs, wb::backend::DType::f32);
  be->fill(rm, 0.0f);
  be->fill(rv, 1.0f);
  Tensor y;
  BatchNormState state;
  auto objective = [&](const std::vector<float>& xv, const std::vector<float>& gv, const std::vector<float>& bv) {
    Tensor x = wb::test::make_tensor(*be, s, xv, bc.blocked);
    Tensor g = wb::test::make_tensor(*be, cs, gv), b = wb::test::make_tensor(*be, cs, bv);
    be->batchnorm_forward_train(x, g, b, y, rm, rv, state, bp);
    return wb::test::dot(wb::test::to_vec(*be, y), p.dy);
  };
  Tensor x = wb::test::make_tensor(*be, s, p.x, bc.blocked);
  Tensor g = wb::test::make_tensor(*be, cs, p.gamma), b = wb::test::make_tensor(*be, cs, p.beta);
  Tensor dy = wb::test::make_tensor(*be, s, p.dy, bc.blocked);
  Tensor dx, dg = be->empty(cs, wb::backend::DType::f32), db = be->empty(cs, wb::backend::DType::f32);
  be->batchnorm_forward_train(x, g, b, y, rm, rv, state, bp);
  be->batchnorm_backward(x, dy, g, b, state, dx, dg, db, bp);
  // Nonlinear in x and gamma: a small step; the objective is accumulated in double. With the fused relu
  // the step is smaller still, so that few outputs cross the kink.
  const double h = bc.relu ? 1e-3 : 1e-2, tol = 2e-3;
  wb::test::check_gradient("dx", p.x, wb::test::to_vec(*be, dx),
                           [&](const std::vector<float>& v) { return objective(v, p.gamma, p.beta); }, h, tol, 1);
  wb::test::check_gradient("dgamma", p.gamma, wb::test::to_vec(*be, dg),
                           [&](const std::vector<float>& v) { return objective(p.x, v, p.beta); }, h, tol, 2);
  if (!bc.relu) {
    wb::test::check_gradient("dbeta", p.beta, wb::test::to_vec(*be, db),
                             [&](const std::vector<float>& v) { return objective(p.x, p.gamma, v); }, h, tol, 3);
  }
}

TEST_CASE("batch norm rejects a single value per channel and mismatched parameters", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({1});
  Tensor x = be->empty({1, 4, 1, 1}, wb::backend::DType::f32);
  be->fill(x, 1.0f);
  Tensor c4 = be->empty({4}, wb::backend::DType::f32), c3 = be->empty({3}, wb::backend::DType::f32);
  Tensor y;
  BatchNormState st;
  REQUIRE_THROWS_AS(be->batchnorm_forward_train(x, c4, c4, y, c4, c4, st, {}), wb::backend::BackendError);
  Tensor x2 = be->empty({2, 4, 1, 1}, wb::backend::DType::f32);
  REQUIRE_THROWS_AS(be->batchnorm_forward_train(x2, c3, c4, y, c4, c4, st, {}), wb::backend::BackendError);
  Tensor dx;
  BatchNormState empty;
  REQUIRE_THROWS_AS(be->batchnorm_backward(x2, x2, c4, c4, empty, dx, c4, c4, {}), wb::backend::BackendError);
}
