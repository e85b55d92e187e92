#pragma once
// Shared helpers of the backend and model tests: random data, tensors in the layouts the model uses,
// finite-difference gradient checks. Scratch directories, raw files, PyTorch scripts and rel_l2 come from
// tests/support.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/numeric.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::test {

inline std::vector<float> random_normal(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<float> random_uniform(std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// "<prefix><i><suffix>" (built with append: GCC 12 warns falsely on "literal" + std::string).
inline std::string fname(const char* prefix, std::size_t i, const char* suffix = "") {
  std::string s(prefix);
  s.append(std::to_string(i));
  s.append(suffix);
  return s;
}

// A CPU-backend tensor holding `host` (plain row-major), stored plain or in oneDNN's blocked layout
// (nChw16c for 4-D), so tests cover the layouts the model actually passes between layers.
inline backend::Tensor make_tensor(backend::Backend& be, const backend::Shape& shape, const std::vector<float>& host,
                                   bool blocked = false) {
  backend::Tensor t;
  if (blocked && shape.rank() == 4) {
    auto& cpu = dynamic_cast<backend::cpu::CpuBackend&>(be);
    dnnl::memory::desc md({shape[0], shape[1], shape[2], shape[3]}, dnnl::memory::data_type::f32,
                          dnnl::memory::format_tag::nChw16c);
    t = cpu.allocate(shape, backend::DType::f32, md);
  } else {
    t = be.empty(shape, backend::DType::f32);
  }
  be.from_host(t, host);
  return t;
}

// Fails when any kernel since the backend was made wrote past the tail slack of a live allocation
// (CpuBackend::kTailSlack): JIT kernels' writes are invisible to ASan, so the canary is the check.
inline void require_no_overrun(backend::Backend& be) {
  REQUIRE(dynamic_cast<backend::cpu::CpuBackend&>(be).damaged_guards() == 0);
}

inline std::vector<float> to_vec(backend::Backend& be, const backend::Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  be.to_host(t, v);
  return v;
}

// Backend::accumulate on views inside larger buffers (as the pipeline sums micro-batch gradients):
// dst = k1 * src1, then dst += k2 * src2, against the same in double on the host; the floats around
// the view must not move. Returns the largest relative error.
inline double check_accumulate(backend::Backend& be) {
  const std::size_t total = 1000, offset = 123, n = 700;
  const auto src1 = random_normal(total, 11), src2 = random_normal(total, 12), before = random_normal(total, 13);
  backend::Tensor a = be.empty(backend::Shape{static_cast<std::int64_t>(total)}, backend::DType::f32);
  backend::Tensor b = be.empty(backend::Shape{static_cast<std::int64_t>(total)}, backend::DType::f32);
  backend::Tensor dst = be.empty(backend::Shape{static_cast<std::int64_t>(total)}, backend::DType::f32);
  be.from_host(a, src1);
  be.from_host(b, src2);
  be.from_host(dst, before);
  const backend::Shape vs{static_cast<std::int64_t>(n)};
  be.accumulate(be.view(a, offset, vs), 0.25f, be.view(dst, offset, vs), true);
  be.accumulate(be.view(b, offset, vs), -1.5f, be.view(dst, offset, vs), false);
  const auto got = to_vec(be, dst);
  double worst = 0.0;
  for (std::size_t i = 0; i < total; ++i) {
    const bool in = i >= offset && i < offset + n;
    const double want = in ? 0.25 * src1[i] + -1.5 * src2[i] : before[i];
    worst = std::max(worst, std::abs(got[i] - want) / std::max(1.0, std::abs(want)));
  }
  // Bad arguments: a destination of another size.
  CHECK_THROWS_AS(be.accumulate(be.view(a, 0, vs), 1.0f, be.view(dst, 0, backend::Shape{10}), true), backend::BackendError);
  return worst;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

inline double norm(const std::vector<float>& a) { return std::sqrt(dot(a, a)); }

// Checks the analytic gradient g of a scalar objective L against central differences of L along a few
// random directions and a few coordinate directions. L is evaluated with the float op and accumulated in
// double by the caller. Tolerance: |fd - <g, v>| <= tol * max(|<g, v>|, ||g|| ||v|| / sqrt(n)).
template <class Objective>
inline void check_gradient(const char* what, std::vector<float> x, const std::vector<float>& g, Objective&& loss,
                           double h, double tol, std::uint64_t seed) {
  REQUIRE(x.size() == g.size());
  const std::size_t n = x.size();
  std::mt19937_64 gen(seed);
  std::vector<std::vector<float>> dirs;
  for (int k = 0; k < 3; ++k) dirs.push_back(random_normal(n, seed + 100 + static_cast<std::uint64_t>(k)));
  for (int k = 0; k < 3; ++k) {
    std::vector<float> e(n, 0.0f);
    e[gen() % n] = 1.0f;
    dirs.push_back(e);
  }
  const double gnorm = norm(g);
  for (const auto& v : dirs) {
    std::vector<float> xp(x), xm(x);
    for (std::size_t i = 0; i < n; ++i) {
      xp[i] = static_cast<float>(x[i] + h * v[i]);
      xm[i] = static_cast<float>(x[i] - h * v[i]);
    }
    // The step actually taken after rounding to float, per direction.
    double dx = 0.0, dv = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      dx += (static_cast<double>(xp[i]) - static_cast<double>(xm[i])) * v[i];
      dv += static_cast<double>(v[i]) * v[i];
    }
    const double step = dx / dv;  // ~ 2h
    const double fd = (loss(xp) - loss(xm)) / step;
    const double an = dot(g, v);
    const double scale = std::max(std::abs(an), gnorm * norm(v) / std::sqrt(static_cast<double>(n)));
    CAPTURE(what, fd, an, scale);
    CHECK(std::abs(fd - an) <= tol * scale);
  }
}

}  // namespace wb::test
