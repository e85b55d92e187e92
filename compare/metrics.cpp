// One pass per tensor: elements are converted to double in cache-sized chunks and each chunk is
// reduced with `omp simd` (-fopenmp-simd, no OpenMP runtime) into partial sums that are added to the
// totals in double. A chunk holding NaN/Inf shows it in its sums of squares; only then is it fixed up
// element by element and reduced again.
#include "compare/metrics.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace wb::compare {
namespace {

static_assert(std::endian::native == std::endian::little, "tensor data are little-endian");

constexpr std::int64_t kChunk = 2048;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// IEEE half to float, built once: 65536 entries make F16 conversion a table lookup.
const std::array<float, 65536>& half_table() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (std::uint32_t h = 0; h < 65536; ++h) {
      const std::uint32_t sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
      double v;
      if (exp == 0) {
        v = std::ldexp(static_cast<double>(mant), -24);
      } else if (exp == 31) {
        v = mant != 0 ? kNaN : kInf;
      } else {
        v = std::ldexp(static_cast<double>(mant + 1024), static_cast<int>(exp) - 25);
      }
      t[h] = static_cast<float>(sign != 0 ? -v : v);
    }
    return t;
  }();
  return table;
}

template <typename T>
void convert_plain(const std::byte* p, std::int64_t n, double* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
    out[i] = static_cast<double>(v);
  }
}

std::size_t elem_size(store::DType d) { return store::dtype_size(d); }

// Partial sums of one chunk, or of a whole tensor.
struct Acc {
  double sum_abs = 0, sum_d2 = 0, sum_a2 = 0, sum_b2 = 0, dot = 0, dot_db = 0, sum_a = 0, sum_b = 0;
  double min_a = kInf, max_a = -kInf, min_b = kInf, max_b = -kInf;
  std::int64_t n_close = 0, n_1k = 0, n_5k = 0;
  double max_abs = -1.0;
  std::int64_t max_abs_index = -1;
  double max_rel = -1.0;
  std::int64_t max_rel_index = -1;
  std::int64_t nan_a = 0, inf_a = 0, nan_b = 0, inf_b = 0;
  std::int64_t mismatch = 0, first_mismatch = -1;
};

bool same_nonfinite(double x, double y) {
  if (std::isnan(x)) return std::isnan(y);
  return x == y;  // the same infinity
}

// Zeroes non-finite pairs (msprobe), counting them and marking mismatches in `skip`; returns the
// mismatches of this chunk.
std::int64_t fix_nonfinite(double* a, double* b, std::int64_t n, std::int64_t base, Acc& acc,
                           unsigned char* skip) {
  std::int64_t mismatched = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    skip[i] = 0;
    const bool fa = std::isfinite(a[i]), fb = std::isfinite(b[i]);
    if (fa && fb) continue;
    acc.nan_a += std::isnan(a[i]);
    acc.inf_a += std::isinf(a[i]);
    acc.nan_b += std::isnan(b[i]);
    acc.inf_b += std::isinf(b[i]);
    if (fa || fb || !same_nonfinite(a[i], b[i])) {
      ++mismatched;
      skip[i] = 1;
      if (acc.first_mismatch < 0) acc.first_mismatch = base + i;
    }
    a[i] = 0.0;
    b[i] = 0.0;
  }
  return mismatched;
}

// Partial sums of one chunk.
struct Partial {
  double s_abs = 0, s_d2 = 0, s_a2 = 0, s_b2 = 0, s_ab = 0, s_db = 0, s_a = 0, s_b = 0;
  double mn_a = kInf, mx_a = -kInf, mn_b = kInf, mx_b = -kInf, mx_abs = 0, mx_rel = 0;
  std::int64_t c_close = 0, c_1k = 0, c_5k = 0;

  // A NaN or Inf anywhere in the chunk shows in the sums of squares (x*x is non-finite exactly when
  // x is), so finite chunks need no separate scan.
  bool finite() const { return std::isfinite(s_a2 + s_b2 + s_d2); }
};

// Compiled twice, for AVX2 and for the baseline, and picked at run time: the loop is compute-bound
// and four double lanes halve its cost where the CPU has them.
__attribute__((target_clones("avx2", "default"))) Partial reduce_chunk(const double* a, const double* b,
                                                                        std::int64_t n, Tolerance tol) {
  double s_abs = 0, s_d2 = 0, s_a2 = 0, s_b2 = 0, s_ab = 0, s_db = 0, s_a = 0, s_b = 0;
  double mn_a = kInf, mx_a = -kInf, mn_b = kInf, mx_b = -kInf, mx_abs = 0, mx_rel = 0;
  std::int64_t c_close = 0, c_1k = 0, c_5k = 0;
  const double rtol = tol.rtol, atol = tol.atol;
#pragma omp simd reduction(+ : s_abs, s_d2, s_a2, s_b2, s_ab, s_db, s_a, s_b, c_close, c_1k, c_5k) \
    reduction(min : mn_a, mn_b) reduction(max : mx_a, mx_b, mx_abs, mx_rel)
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    const double d = x - y;
    const double ad = std::fabs(d), ay = std::fabs(y);
    const double rel = ad / (ay > kRelEps ? ay : kRelEps);
    s_abs += ad;
    s_d2 += d * d;
    s_a2 += x * x;
    s_b2 += y * y;
    s_ab += x * y;
    s_db += d * y;
    s_a += x;
    s_b += y;
    mn_a = x < mn_a ? x : mn_a;
    mx_a = x > mx_a ? x : mx_a;
    mn_b = y < mn_b ? y : mn_b;
    mx_b = y > mx_b ? y : mx_b;
    mx_abs = ad > mx_abs ? ad : mx_abs;
    mx_rel = rel > mx_rel ? rel : mx_rel;
    c_close += (ad <= atol + rtol * ay) ? 1 : 0;
    c_1k += rel < 1e-3 ? 1 : 0;
    c_5k += rel < 5e-3 ? 1 : 0;
  }
  return Partial{s_abs, s_d2, s_a2, s_b2, s_ab, s_db, s_a, s_b, mn_a, mx_a, mn_b, mx_b, mx_abs, mx_rel, c_close, c_1k, c_5k};
}

// Adds a chunk's partials to the totals. Mismatched pairs were zeroed, so they look like exact
// matches: `mismatched` takes them back out of the counts and `skip` (null when there are none) keeps
// them out of the arg-max scans.
void merge_chunk(const double* a, const double* b, std::int64_t n, std::int64_t base, const Partial& p,
                 std::int64_t mismatched, const unsigned char* skip, Acc& acc) {
  acc.sum_abs += p.s_abs;
  acc.sum_d2 += p.s_d2;
  acc.sum_a2 += p.s_a2;
  acc.sum_b2 += p.s_b2;
  acc.dot += p.s_ab;
  acc.dot_db += p.s_db;
  acc.sum_a += p.s_a;
  acc.sum_b += p.s_b;
  acc.min_a = std::min(acc.min_a, p.mn_a);
  acc.max_a = std::max(acc.max_a, p.mx_a);
  acc.min_b = std::min(acc.min_b, p.mn_b);
  acc.max_b = std::max(acc.max_b, p.mx_b);
  acc.n_close += p.c_close - mismatched;
  acc.n_1k += p.c_1k - mismatched;
  acc.n_5k += p.c_5k - mismatched;
  // The first index of a new maximum: strictly greater keeps an earlier chunk's tie (numpy argmax).
  if (mismatched == n) return;
  if (p.mx_abs > acc.max_abs) {
    for (std::int64_t i = 0; i < n; ++i) {
      if ((skip == nullptr || skip[i] == 0) && std::fabs(a[i] - b[i]) == p.mx_abs) {
        acc.max_abs = p.mx_abs;
        acc.max_abs_index = base + i;
        break;
      }
    }
  }
  if (p.mx_rel > acc.max_rel) {
    for (std::int64_t i = 0; i < n; ++i) {
      const double ay = std::fabs(b[i]);
      if ((skip == nullptr || skip[i] == 0) && std::fabs(a[i] - b[i]) / (ay > kRelEps ? ay : kRelEps) == p.mx_rel) {
        acc.max_rel = p.mx_rel;
        acc.max_rel_index = base + i;
        break;
      }
    }
  }
}

Metrics finish(const Acc& acc, std::int64_t numel, Tolerance tol) {
  Metrics m;
  m.numel = numel;
  m.tolerance = tol;
  m.nonfinite_mismatch = acc.mismatch;
  m.first_nonfinite_mismatch = acc.first_mismatch;
  m.compared = numel - acc.mismatch;
  m.a.nan_count = acc.nan_a;
  m.a.inf_count = acc.inf_a;
  m.b.nan_count = acc.nan_b;
  m.b.inf_count = acc.inf_b;
  const std::int64_t n = m.compared;
  if (n <= 0) return m;  // documented defaults: zero errors, cosine 1, ratios 1
  const auto dn = static_cast<double>(n);
  m.max_abs = acc.max_abs;
  m.max_abs_index = acc.max_abs_index;
  m.max_rel = acc.max_rel;
  m.max_rel_index = acc.max_rel_index;
  m.mean_abs = acc.sum_abs / dn;
  m.euc_dist = std::sqrt(acc.sum_d2);
  m.rmse = std::sqrt(acc.sum_d2 / dn);
  const double na = std::sqrt(acc.sum_a2), nb = std::sqrt(acc.sum_b2);
  m.rel_l2 = acc.sum_d2 == 0.0 ? 0.0 : (nb == 0.0 ? kInf : m.euc_dist / nb);
  if (na == 0.0 && nb == 0.0) {
    m.cosine = 1.0;
  } else if (na == 0.0 || nb == 0.0) {
    m.cosine = kNaN;
  } else {
    m.cosine = std::clamp(acc.dot / (na * nb), -1.0, 1.0);
  }
  m.sqnr_db = acc.sum_d2 == 0.0 ? kInf : (nb == 0.0 ? -kInf : 20.0 * std::log10(nb / m.euc_dist));
  // The scale. s - 1 = <d,b>/<b,b> and ||a - s b||^2 = ||d||^2 - <d,b>^2/<b,b> are taken from d
  // itself: through <a,b> and ||a||^2 they would cancel to nothing when a and b agree to fp32 precision.
  if (nb == 0.0) {
    m.norm_ratio = na == 0.0 ? 1.0 : kInf;
    m.scale = na == 0.0 ? 1.0 : kNaN;
    m.scale_stderr = na == 0.0 ? 0.0 : kNaN;
    m.scale_z = na == 0.0 ? 0.0 : kNaN;
    m.residual_rel_l2 = na == 0.0 ? 0.0 : kInf;
  } else {
    m.norm_ratio = na / nb;
    const double shift = acc.dot_db / acc.sum_b2;
    m.scale = 1.0 + shift;
    const double residual2 = std::max(0.0, acc.sum_d2 - acc.dot_db * shift);
    m.residual_rel_l2 = std::sqrt(residual2) / nb;
    m.scale_stderr = n >= 2 ? m.residual_rel_l2 / std::sqrt(dn - 1.0) : kInf;
    if (acc.sum_d2 > 0.0) {
      m.scale_noise_p = std::pow(std::sqrt(residual2 / acc.sum_d2), dn - 1.0);
    }
    if (shift == 0.0) {
      m.scale_z = 0.0;
    } else if (m.scale_stderr == 0.0) {
      m.scale_z = kInf;
    } else {
      m.scale_z = std::fabs(shift) / m.scale_stderr;
    }
  }
  m.allclose_count = acc.n_close;
  m.allclose_ratio = static_cast<double>(acc.n_close) / dn;
  m.one_thousandth_count = acc.n_1k;
  m.one_thousandth_ratio = static_cast<double>(acc.n_1k) / dn;
  m.five_thousandths_count = acc.n_5k;
  m.five_thousandths_ratio = static_cast<double>(acc.n_5k) / dn;
  const auto dnumel = static_cast<double>(numel);
  m.a.min = acc.min_a;
  m.a.max = acc.max_a;
  m.a.mean = acc.sum_a / dnumel;
  m.a.l2norm = na;
  m.b.min = acc.min_b;
  m.b.max = acc.max_b;
  m.b.mean = acc.sum_b / dnumel;
  m.b.l2norm = nb;
  return m;
}

// The shared driver: `load` fills one chunk of a and b as doubles.
template <typename Load>
Metrics run(std::int64_t numel, Tolerance tol, Load&& load) {
  Acc acc;
  alignas(64) double a[kChunk];
  alignas(64) double b[kChunk];
  unsigned char skip[kChunk];
  for (std::int64_t base = 0; base < numel; base += kChunk) {
    const std::int64_t n = std::min(kChunk, numel - base);
    load(base, n, a, b);
    Partial p = reduce_chunk(a, b, n, tol);
    if (p.finite()) {
      merge_chunk(a, b, n, base, p, 0, nullptr, acc);
      continue;
    }
    // The rare chunk with NaN/Inf (or finite values whose squares overflow): fix it up and redo it.
    const std::int64_t mismatched = fix_nonfinite(a, b, n, base, acc, skip);
    acc.mismatch += mismatched;
    p = reduce_chunk(a, b, n, tol);
    merge_chunk(a, b, n, base, p, mismatched, skip, acc);
  }
  return finish(acc, numel, tol);
}

}  // namespace

void convert_to_double(ElementView v, std::int64_t first, std::int64_t n, double* out) {
  const std::byte* p = v.data + first * static_cast<std::int64_t>(elem_size(v.dtype));
  switch (v.dtype) {
    case store::DType::F32: convert_plain<float>(p, n, out); break;
    case store::DType::F64: convert_plain<double>(p, n, out); break;
    case store::DType::I32: convert_plain<std::int32_t>(p, n, out); break;
    case store::DType::I64: convert_plain<std::int64_t>(p, n, out); break;
    case store::DType::U8: convert_plain<std::uint8_t>(p, n, out); break;
    case store::DType::BOOL:
      for (std::int64_t i = 0; i < n; ++i) out[i] = p[i] != std::byte{0} ? 1.0 : 0.0;
      break;
    case store::DType::F16: {
      const auto& table = half_table();
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = table[h];
      }
      break;
    }
    case store::DType::BF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
      }
      break;
  }
}

ElementView view_of(const store::HostTensor& tensor) {
  return ElementView{tensor.dtype, tensor.data.data(), tensor.numel()};
}

ElementView view_of(std::span<const float> values) {
  return ElementView{store::DType::F32, reinterpret_cast<const std::byte*>(values.data()),
                     static_cast<std::int64_t>(values.size())};
}

ElementView view_of(std::span<const double> values) {
  return ElementView{store::DType::F64, reinterpret_cast<const std::byte*>(values.data()),
                     static_cast<std::int64_t>(values.size())};
}

namespace {

void require_same_numel(ElementView a, ElementView b, const char* what) {
  if (a.numel != b.numel) {
    throw std::invalid_argument(std::string(what) + ": element counts differ (" + std::to_string(a.numel) +
                                " vs " + std::to_string(b.numel) + ")");
  }
}

bool same_bytes(ElementView a, ElementView b) {
  if (a.dtype != b.dtype || a.numel != b.numel) return false;
  const auto bytes = static_cast<std::size_t>(a.numel) * elem_size(a.dtype);
  return bytes == 0 || std::memcmp(a.data, b.data, bytes) == 0;
}

bool is_integral(store::DType d) {
  return d == store::DType::I32 || d == store::DType::I64 || d == store::DType::U8 || d == store::DType::BOOL;
}

std::int64_t integer_at(ElementView v, std::int64_t i) {
  const std::byte* p = v.data + i * static_cast<std::int64_t>(elem_size(v.dtype));
  switch (v.dtype) {
    case store::DType::I32: {
      std::int32_t x;
      std::memcpy(&x, p, sizeof x);
      return x;
    }
    case store::DType::I64: {
      std::int64_t x;
      std::memcpy(&x, p, sizeof x);
      return x;
    }
    case store::DType::U8: return static_cast<std::int64_t>(std::to_integer<std::uint8_t>(*p));
    case store::DType::BOOL: return *p != std::byte{0} ? 1 : 0;
    default: return 0;  // not integral: same_values never asks
  }
}

// Exactly the same values: the same bytes, or integers (int32, int64, uint8, bool) equal by value
// whatever their width: PyTorch's int64 labels against a port's int32 ones are the same labels.
bool same_values(ElementView a, ElementView b) {
  if (same_bytes(a, b)) return true;
  if (a.numel != b.numel || !is_integral(a.dtype) || !is_integral(b.dtype)) return false;
  for (std::int64_t i = 0; i < a.numel; ++i) {
    if (integer_at(a, i) != integer_at(b, i)) return false;
  }
  return true;
}

}  // namespace

Metrics compute_metrics(ElementView a, ElementView b, Tolerance tolerance) {
  require_same_numel(a, b, "compute_metrics");
  Metrics m = run(a.numel, tolerance, [&](std::int64_t base, std::int64_t n, double* da, double* db) {
    convert_to_double(a, base, n, da);
    convert_to_double(b, base, n, db);
  });
  m.bit_exact = same_values(a, b);
  return m;
}

Metrics compute_metrics(const store::HostTensor& a, const store::HostTensor& b, Tolerance tolerance) {
  return compute_metrics(view_of(a), view_of(b), tolerance);
}

Metrics compute_update_metrics(ElementView a, ElementView a_base, ElementView b, ElementView b_base,
                               Tolerance tolerance) {
  require_same_numel(a, b, "compute_update_metrics");
  require_same_numel(a, a_base, "compute_update_metrics (A and its base)");
  require_same_numel(b, b_base, "compute_update_metrics (B and its base)");
  alignas(64) double tmp[kChunk];
  Metrics m = run(a.numel, tolerance, [&](std::int64_t base, std::int64_t n, double* da, double* db) {
    convert_to_double(a, base, n, da);
    convert_to_double(a_base, base, n, tmp);
    for (std::int64_t i = 0; i < n; ++i) da[i] -= tmp[i];
    convert_to_double(b, base, n, db);
    convert_to_double(b_base, base, n, tmp);
    for (std::int64_t i = 0; i < n; ++i) db[i] -= tmp[i];
  });
  m.bit_exact = same_values(a, b) && same_values(a_base, b_base);
  return m;
}

std::vector<std::int64_t> unravel_index(std::int64_t index, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> coord(shape.size(), 0);
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::int64_t extent = shape[d] > 0 ? shape[d] : 1;
    coord[d] = index % extent;
    index /= extent;
  }
  return coord;
}

std::vector<WorstElement> worst_elements(ElementView a, ElementView b, const std::vector<std::int64_t>& shape,
                                         std::size_t k) {
  require_same_numel(a, b, "worst_elements");
  std::vector<WorstElement> best;  // kept sorted, largest error first, at most k entries
  if (k == 0) return best;
  auto worse = [](const WorstElement& x, const WorstElement& y) {
    return x.abs_err > y.abs_err || (x.abs_err == y.abs_err && x.index < y.index);
  };
  alignas(64) double da[kChunk];
  alignas(64) double db[kChunk];
  for (std::int64_t base = 0; base < a.numel; base += kChunk) {
    const std::int64_t n = std::min(kChunk, a.numel - base);
    convert_to_double(a, base, n, da);
    convert_to_double(b, base, n, db);
    for (std::int64_t i = 0; i < n; ++i) {
      double err;
      const bool fa = std::isfinite(da[i]), fb = std::isfinite(db[i]);
      if (fa && fb) {
        err = std::fabs(da[i] - db[i]);
      } else if (!fa && !fb && same_nonfinite(da[i], db[i])) {
        continue;
      } else {
        err = kInf;
      }
      if (best.size() == k && !(err > best.back().abs_err)) continue;
      WorstElement w{base + i, {}, da[i], db[i], err};
      best.insert(std::upper_bound(best.begin(), best.end(), w, worse), w);
      if (best.size() > k) best.pop_back();
    }
  }
  for (auto& w : best) w.coord = unravel_index(w.index, shape);
  return best;
}

}  // namespace wb::compare
