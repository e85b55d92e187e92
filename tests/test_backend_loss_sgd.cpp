// Softmax cross-entropy with label smoothing in both conventions (mindspore's CrossEntropySmooth and
// torch's CrossEntropyLoss(label_smoothing)), and the fused momentum-SGD update, against PyTorch and
// against independent computations (finite differences; a double-precision loop for SGD).
#include <catch2/catch.hpp>

#include <sstream>

#include "test_backend_util.hpp"

using wb::backend::LossConvention;
using wb::backend::LossParams;
using wb::backend::ParamSegment;
using wb::backend::SgdParams;
using wb::backend::Tensor;

namespace {

struct LossCase {
  std::int64_t n, k;
  LossConvention convention;
  float smoothing;
};

const std::vector<LossCase> kLossCases = {
    {4, 10, LossConvention::torch, 0.0f},     {4, 10, LossConvention::torch, 0.1f},
    {5, 7, LossConvention::mindspore, 0.1f},  {3, 1000, LossConvention::mindspore, 0.1f},
    {6, 10, LossConvention::mindspore, 0.0f}, {2, 3, LossConvention::torch, 0.3f},
};

std::vector<std::int32_t> labels_for(const LossCase& c) {
  std::vector<std::int32_t> y(static_cast<std::size_t>(c.n));
  for (std::int64_t i = 0; i < c.n; ++i) y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 1) % c.k);
  return y;
}

}  // namespace

TEST_CASE("softmax cross-entropy in both smoothing conventions matches PyTorch", "[trainer][backend]") {
  wb::test::TempDir dir("loss");
  auto be = wb::backend::make_cpu_backend({2});
  std::ostringstream script;
  script << "cases = [\n";
  std::vector<float> loss(kLossCases.size());
  std::vector<std::vector<float>> grad(kLossCases.size());
  for (std::size_t i = 0; i < kLossCases.size(); ++i) {
    const LossCase& c = kLossCases[i];
    const auto z = wb::test::random_normal(static_cast<std::size_t>(c.n * c.k), 200 + i, 2.0f);
    const auto y = labels_for(c);
    wb::test::write_raw(dir.file(wb::test::fname("z", i)), z);
    wb::test::write_raw(dir.file(wb::test::fname("y", i)), y);
    script << "  (" << i << ", " << c.n << ", " << c.k << ", '"
           << (c.convention == LossConvention::torch ? "torch" : "mindspore") << "', " << c.smoothing << "),\n";
    Tensor tz = wb::test::make_tensor(*be, {c.n, c.k}, z);
    Tensor ty = be->empty({c.n}, wb::backend::DType::i32);
    be->from_host(ty, y);
    Tensor tl, probs, dz;
    const LossParams p{c.convention, c.smoothing};
    be->softmax_cross_entropy_forward(tz, ty, p, tl, probs);
    be->softmax_cross_entropy_backward(probs, ty, p, dz);
    loss[i] = wb::test::to_vec(*be, tl)[0];
    grad[i] = wb::test::to_vec(*be, dz);
    wb::test::require_no_overrun(*be);
  }
  // mindspore: CrossEntropySmooth = SoftmaxCrossEntropyWithLogits on a one-hot with on 1 - s, off s/(K-1).
  script << "]\n"
            "for i, n, k, conv, s in cases:\n"
            "    z = load(f'z{i}', n, k).requires_grad_()\n"
            "    y = torch.from_numpy(np.fromfile(f'y{i}', dtype=np.int32).astype(np.int64))\n"
            "    if conv == 'torch':\n"
            "        loss = F.cross_entropy(z, y, label_smoothing=s)\n"
            "    else:\n"
            "        t = torch.full((n, k), s / (k - 1) if k > 1 else 0.0)\n"
            "        t[torch.arange(n), y] = 1.0 - s\n"
            "        loss = (-(t * F.log_softmax(z, dim=1)).sum(dim=1)).mean()\n"
            "    loss.backward()\n"
            "    save(f'l{i}.out', loss.reshape(1)); save(f'dz{i}.out', z.grad)\n";
  wb::test::run_torch_script(dir, "loss", script.str());
  double worst_fwd = 0, worst_grad = 0;
  for (std::size_t i = 0; i < kLossCases.size(); ++i) {
    CAPTURE(i, kLossCases[i].n, kLossCases[i].k, kLossCases[i].smoothing);
    const double el = wb::test::rel_l2({loss[i]}, wb::test::read_raw(dir.file(wb::test::fname("l", i, ".out"))));
    const double eg = wb::test::rel_l2(grad[i], wb::test::read_raw(dir.file(wb::test::fname("dz", i, ".out"))));
    CHECK(el <= 1e-5);
    CHECK(eg <= 1e-4);
    worst_fwd = std::max(worst_fwd, el);
    worst_grad = std::max(worst_grad, eg);
  }
  std::printf("softmax cross-entropy vs torch: worst rel-L2 loss %.3g, dlogits %.3g over %zu cases\n", worst_fwd,
              worst_grad, kLossCases.size());
}

TEST_CASE("softmax cross-entropy gradient matches finite differences; bad labels are rejected",
          "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({1});
  const LossCase c = GENERATE(LossCase{3, 5, LossConvention::mindspore, 0.2f}, LossCase{4, 6, LossConvention::torch, 0.1f});
  const auto z = wb::test::random_normal(static_cast<std::size_t>(c.n * c.k), 9);
  const auto y = labels_for(c);
  Tensor ty = be->empty({c.n}, wb::backend::DType::i32);
  be->from_host(ty, y);
  const LossParams p{c.convention, c.smoothing};
  auto objective = [&](const std::vector<float>& v) {
    Tensor l, probs;
    be->softmax_cross_entropy_forward(wb::test::make_tensor(*be, {c.n, c.k}, v), ty, p, l, probs);
    return static_cast<double>(wb::test::to_vec(*be, l)[0]);
  };
  Tensor l, probs, dz;
  be->softmax_cross_entropy_forward(wb::test::make_tensor(*be, {c.n, c.k}, z), ty, p, l, probs);
  be->softmax_cross_entropy_backward(probs, ty, p, dz);
  wb::test::check_gradient("dlogits", z, wb::test::to_vec(*be, dz), objective, 1e-2, 2e-3, 10);

  Tensor bad = be->empty({c.n}, wb::backend::DType::i32);
  std::vector<std::int32_t> yb(y);
  yb[1] = static_cast<std::int32_t>(c.k);  // one past the last class
  be->from_host(bad, yb);
  REQUIRE_THROWS_AS(be->softmax_cross_entropy_forward(wb::test::make_tensor(*be, {c.n, c.k}, z), bad, p, l, probs),
                    wb::backend::BackendError);
  REQUIRE_THROWS_AS(be->softmax_cross_entropy_forward(wb::test::make_tensor(*be, {c.n, c.k}, z), ty,
                                                      LossParams{c.convention, 1.5f}, l, probs),
                    wb::backend::BackendError);
}

TEST_CASE("fused SGD matches torch.optim.SGD with weight-decay groups, with and without nesterov",
          "[trainer][backend]") {
  wb::test::TempDir dir("sgd");
  auto be = wb::backend::make_cpu_backend({2});
  // Three parameters in one buffer: a decayed weight, an undecayed bias, a decayed weight.
  const std::vector<ParamSegment> segs{{0, 300, true}, {300, 17, false}, {317, 1000, true}};
  const std::size_t total = 1317;
  const int steps = 3;
  const auto p0 = wb::test::random_normal(total, 1);
  for (int s = 0; s < steps; ++s) wb::test::write_raw(dir.file(wb::test::fname("g", static_cast<std::size_t>(s))),
                                                      wb::test::random_normal(total, 10 + static_cast<std::uint64_t>(s)));
  wb::test::write_raw(dir.file("p0"), p0);
  struct Variant {
    float momentum;
    bool nesterov;
  };
  const std::vector<Variant> variants{{0.9f, false}, {0.9f, true}, {0.0f, false}};
  const float lr = 0.1f, wd = 1e-4f;
  std::vector<std::vector<float>> ours_p, ours_m;
  for (const Variant& v : variants) {
    Tensor params = wb::test::make_tensor(*be, {static_cast<std::int64_t>(total)}, p0);
    Tensor grads = be->empty({static_cast<std::int64_t>(total)}, wb::backend::DType::f32);
    Tensor mom = be->empty({static_cast<std::int64_t>(total)}, wb::backend::DType::f32);
    be->fill(mom, 123.0f);  // must be ignored: the first step sets buf = g'
    // An independent double-precision reference of torch's update rule.
    std::vector<double> rp(p0.begin(), p0.end()), rb(total, 0.0);
    for (int s = 0; s < steps; ++s) {
      const auto g = wb::test::read_raw(dir.file(wb::test::fname("g", static_cast<std::size_t>(s))));
      be->from_host(grads, g);
      be->sgd_update(params, grads, mom, segs, SgdParams{lr, v.momentum, wd, v.nesterov, s == 0});
      for (const auto& seg : segs) {
        for (std::size_t i = seg.offset; i < seg.offset + seg.numel; ++i) {
          double d = g[i] + (seg.decay ? wd * rp[i] : 0.0);
          if (v.momentum != 0.0f) {
            rb[i] = s == 0 ? d : v.momentum * rb[i] + d;
            d = v.nesterov ? d + v.momentum * rb[i] : rb[i];
          }
          rp[i] -= lr * d;
        }
      }
    }
    ours_p.push_back(wb::test::to_vec(*be, params));
    ours_m.push_back(wb::test::to_vec(*be, mom));
    wb::test::require_no_overrun(*be);
    const std::vector<float> ref(rp.begin(), rp.end());
    CHECK(wb::test::rel_l2(ours_p.back(), ref) <= 1e-6);
    if (v.momentum != 0.0f) {
      CHECK(wb::test::rel_l2(ours_m.back(), std::vector<float>(rb.begin(), rb.end())) <= 1e-6);
    }
  }
  const char* body =
      "segs = [(0, 300, True), (300, 317, False), (317, 1317, True)]\n"
      "for vi, (m, nest) in enumerate([(0.9, False), (0.9, True), (0.0, False)]):\n"
      "    p0 = load('p0', 1317)\n"
      "    ps = [p0[a:b].clone().requires_grad_() for a, b, _ in segs]\n"
      "    opt = torch.optim.SGD([{'params': [p for p, s in zip(ps, segs) if s[2]], 'weight_decay': 1e-4},\n"
      "                           {'params': [p for p, s in zip(ps, segs) if not s[2]], 'weight_decay': 0.0}],\n"
      "                          lr=0.1, momentum=m, nesterov=nest)\n"
      "    for s in range(3):\n"
      "        g = load(f'g{s}', 1317)\n"
      "        for p, (a, b, _) in zip(ps, segs): p.grad = g[a:b].clone()\n"
      "        opt.step()\n"
      "    save(f'p{vi}.out', torch.cat([p.detach() for p in ps]))\n"
      "    if m: save(f'm{vi}.out', torch.cat([opt.state[p]['momentum_buffer'] for p in ps]))\n";
  wb::test::run_torch_script(dir, "sgd", body);
  double worst = 0;
  for (std::size_t v = 0; v < variants.size(); ++v) {
    CAPTURE(v);
    const double ep = wb::test::rel_l2(ours_p[v], wb::test::read_raw(dir.file(wb::test::fname("p", v, ".out"))));
    CHECK(ep <= 1e-6);
    worst = std::max(worst, ep);
    if (variants[v].momentum != 0.0f) {
      const double em = wb::test::rel_l2(ours_m[v], wb::test::read_raw(dir.file(wb::test::fname("m", v, ".out"))));
      CHECK(em <= 1e-5);
      worst = std::max(worst, em);
    }
  }
  std::printf("sgd vs torch.optim.SGD (3 steps, 3 variants): worst rel-L2 %.3g\n", worst);

  Tensor small = be->empty({10}, wb::backend::DType::f32);
  const std::vector<ParamSegment> outside{{5, 6, true}};
  REQUIRE_THROWS_AS(be->sgd_update(small, small, small, outside, SgdParams{}), wb::backend::BackendError);
}
