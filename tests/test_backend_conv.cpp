// Convolution forward / backward-data / backward-weights of the CPU backend: against PyTorch
// (F.conv2d and autograd) on random inputs, and against central differences of our own forward.
#include <catch2/catch.hpp>

#include <sstream>

#include "test_backend_util.hpp"

using wb::backend::Conv2dParams;
using wb::backend::Shape;
using wb::backend::Tensor;

namespace {

struct ConvCase {
  std::int64_t n, c, h, w, o, k;
  int stride, pad;
  bool blocked;  // input handed over in the blocked layout
};

// Stem (7x7/2, 3 channels), 3x3 with channel counts that are not multiples of 8/16, 1x1 and strided 1x1
// (downsample), odd spatial sizes.
const std::vector<ConvCase> kCases = {
    {2, 3, 17, 17, 8, 7, 2, 3, false},  {2, 5, 9, 9, 12, 3, 1, 1, false},  {2, 16, 8, 8, 32, 3, 2, 1, true},
    {3, 20, 6, 6, 24, 1, 1, 0, false},  {2, 32, 7, 7, 64, 1, 2, 0, true},  {1, 13, 5, 7, 7, 3, 1, 1, false},
    {2, 64, 4, 4, 16, 3, 1, 1, true},   {2, 24, 9, 9, 40, 3, 2, 1, false},
    // A 1x1 output (layer4's 3x3 convolutions at 32x32: 1x1 and strided 2x2 inputs), which backward-weights
    // computes as one inner product with the unrolled window: padded, unpadded, strided.
    {3, 16, 1, 1, 24, 3, 1, 1, true},   {2, 16, 2, 2, 8, 3, 2, 1, true},   {2, 5, 3, 3, 4, 3, 1, 0, false},
    {2, 7, 1, 1, 5, 3, 2, 1, false},    {2, 6, 2, 3, 9, 5, 3, 2, false},
};

Shape out_shape(const ConvCase& c) {
  return {c.n, c.o, (c.h + 2 * c.pad - c.k) / c.stride + 1, (c.w + 2 * c.pad - c.k) / c.stride + 1};
}

}  // namespace

TEST_CASE("conv2d forward and backward match PyTorch", "[trainer][backend]") {
  wb::test::TempDir dir("conv");
  auto be = wb::backend::make_cpu_backend({2});
  std::ostringstream script;
  script << "cases = [\n";
  std::vector<std::vector<float>> y(kCases.size()), dx(kCases.size()), dw(kCases.size());
  for (std::size_t i = 0; i < kCases.size(); ++i) {
    const ConvCase& c = kCases[i];
    const Shape xs{c.n, c.c, c.h, c.w}, ws{c.o, c.c, c.k, c.k}, ys = out_shape(c);
    const auto xh = wb::test::random_normal(static_cast<std::size_t>(xs.numel()), 10 + i);
    const auto wh = wb::test::random_normal(static_cast<std::size_t>(ws.numel()), 20 + i, 0.2f);
    const auto dyh = wb::test::random_normal(static_cast<std::size_t>(ys.numel()), 30 + i);
    wb::test::write_raw(dir.file(wb::test::fname("x", i)), xh);
    wb::test::write_raw(dir.file(wb::test::fname("w", i)), wh);
    wb::test::write_raw(dir.file(wb::test::fname("dy", i)), dyh);
    script << "  (" << i << ", " << xs.to_string() << ", " << ws.to_string() << ", " << ys.to_string() << ", "
           << c.stride << ", " << c.pad << "),\n";

    Tensor x = wb::test::make_tensor(*be, xs, xh, c.blocked);
    Tensor w = wb::test::make_tensor(*be, ws, wh);
    Tensor dy = wb::test::make_tensor(*be, ys, dyh, c.blocked);
    Tensor out, dxt;
    Tensor dwt = be->empty(ws, wb::backend::DType::f32);
    const Conv2dParams p{c.stride, c.pad};
    be->conv2d_forward(x, w, out, p);
    be->conv2d_backward_data(dy, w, dxt, xs, p);
    be->conv2d_backward_weights(x, dy, dwt, p);
    REQUIRE(out.shape() == ys);
    REQUIRE(dxt.shape() == xs);
    y[i] = wb::test::to_vec(*be, out);
    dx[i] = wb::test::to_vec(*be, dxt);
    dw[i] = wb::test::to_vec(*be, dwt);
    wb::test::require_no_overrun(*be);
  }
  script << "]\n"
            "for i, xs, ws, ys, s, p in cases:\n"
            "    x = load(f'x{i}', *xs).requires_grad_()\n"
            "    w = load(f'w{i}', *ws).requires_grad_()\n"
            "    y = F.conv2d(x, w, stride=s, padding=p)\n"
            "    assert list(y.shape) == ys, (y.shape, ys)\n"
            "    y.backward(load(f'dy{i}', *ys))\n"
            "    save(f'y{i}.out', y); save(f'dx{i}.out', x.grad); save(f'dw{i}.out', w.grad)\n";
  wb::test::run_torch_script(dir, "conv", script.str());

  double worst_fwd = 0, worst_grad = 0;
  for (std::size_t i = 0; i < kCases.size(); ++i) {
    const ConvCase& c = kCases[i];
    CAPTURE(i, c.n, c.c, c.h, c.w, c.o, c.k, c.stride, c.pad, c.blocked);
    const double ey = wb::test::rel_l2(y[i], wb::test::read_raw(dir.file(wb::test::fname("y", i, ".out"))));
    const double edx = wb::test::rel_l2(dx[i], wb::test::read_raw(dir.file(wb::test::fname("dx", i, ".out"))));
    const double edw = wb::test::rel_l2(dw[i], wb::test::read_raw(dir.file(wb::test::fname("dw", i, ".out"))));
    CHECK(ey <= 1e-5);
    CHECK(edx <= 1e-4);
    CHECK(edw <= 1e-4);
    worst_fwd = std::max(worst_fwd, ey);
    worst_grad = std::max({worst_grad, edx, edw});
  }
  std::printf("conv2d vs torch: worst rel-L2 forward %.3g, gradients %.3g over %zu shapes\n", worst_fwd, worst_grad,
              kCases.size());
}

TEST_CASE("conv2d gradients match finite differences of the forward", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({2});
  auto c = GENERATE(ConvCase{2, 3, 9, 9, 8, 7, 2, 3, false}, ConvCase{2, 5, 6, 6, 12, 3, 1, 1, true},
                    ConvCase{2, 20, 5, 5, 24, 1, 2, 0, false}, ConvCase{2, 8, 2, 2, 16, 3, 2, 1, true});
  CAPTURE(c.c, c.o, c.k, c.stride, c.pad);
  const Shape xs{c.n, c.c, c.h, c.w}, ws{c.o, c.c, c.k, c.k}, ys = out_shape(c);
  const auto xh = wb::test::random_normal(static_cast<std::size_t>(xs.numel()), 1);
  const auto wh = wb::test::random_normal(static_cast<std::size_t>(ws.numel()), 2, 0.3f);
  const auto r = wb::test::random_normal(static_cast<std::size_t>(ys.numel()), 3);  // L = sum(r * y)
  const Conv2dParams p{c.stride, c.pad};
  Tensor w = wb::test::make_tensor(*be, ws, wh);
  Tensor dy = wb::test::make_tensor(*be, ys, r);
  Tensor y;
  auto objective = [&](const std::vector<float>& xv, const std::vector<float>& wv) {
    Tensor xt = wb::test::make_tensor(*be, xs, xv, c.blocked);
    Tensor wt = wb::test::make_tensor(*be, ws, wv);
    be->conv2d_forward(xt, wt, y, p);
    return wb::test::dot(wb::test::to_vec(*be, y), r);
  };
  Tensor x = wb::test::make_tensor(*be, xs, xh, c.blocked);
  Tensor dx;
  Tensor dw = be->empty(ws, wb::backend::DType::f32);
  be->conv2d_backward_data(dy, w, dx, xs, p);
  be->conv2d_backward_weights(x, dy, dw, p);
  // The objective is linear in x and in w, so a large step is exact up to rounding.
  wb::test::check_gradient("dx", xh, wb::test::to_vec(*be, dx),
                           [&](const std::vector<float>& v) { return objective(v, wh); }, 0.5, 1e-4, 7);
  wb::test::check_gradient("dw", wh, wb::test::to_vec(*be, dw),
                           [&](const std::vector<float>& v) { return objective(xh, v); }, 0.5, 1e-4, 8);
}

TEST_CASE("conv2d rejects mismatched shapes", "[trainer][backend]") {
  auto be = wb::backend::make_cpu_backend({1});
  Tensor x = be->empty({1, 4, 8, 8}, wb::backend::DType::f32);
  Tensor w = be->empty({8, 3, 3, 3}, wb::backend::DType::f32);  // expects 3 input channels
  Tensor y;
  REQUIRE_THROWS_AS(be->conv2d_forward(x, w, y, {1, 1}), wb::backend::BackendError);
  Tensor w5 = be->empty({8, 4, 9, 9}, wb::backend::DType::f32);  // kernel larger than the padded input
  REQUIRE_THROWS_AS(be->conv2d_forward(x, w5, y, {1, 0}), wb::backend::BackendError);
  Tensor dy = be->empty({1, 8, 5, 5}, wb::backend::DType::f32);  // conv of x makes 8x8, not 5x5
  Tensor w4 = be->empty({8, 4, 3, 3}, wb::backend::DType::f32);
  Tensor dx;
  REQUIRE_THROWS_AS(be->conv2d_backward_data(dy, w4, dx, x.shape(), {1, 1}), wb::backend::BackendError);
}
