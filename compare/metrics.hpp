// Element-wise comparison metrics between a tensor A and a reference B, accumulated in double in one
// pass. Definitions (d = a - b, eps = 2.2e-16, as msprobe and Polygraphy use):
//   max abs error      max |d|, with the flat index of its first occurrence
//   mean abs error     sum |d| / n                 (over all compared elements, unlike TroubleShooter,
//                                                    whose mean is over unequal elements only)
//   max relative error max |d| / max(|b|, eps)
//   rel-L2             ||d|| / ||b||               (0 when ||d|| = 0; +inf when only ||b|| = 0)
//   RMSE               sqrt(sum d^2 / n);  EucDist = ||d||
//   cosine             a.b / (||a|| ||b||), clipped to [-1, 1]; 1 when both norms are 0, NaN when one is
//   allclose ratio     count(|d| <= atol + rtol |b|) / n   (b is the reference, as in numpy)
//   1‰ / 5‰ ratios     count(|d| / max(|b|, eps) < 0.001 or < 0.005) / n   (msprobe)
//   SQNR               20 log10(||b|| / ||d||) dB  (+inf when ||d|| = 0; -inf when only ||b|| = 0)
//   norm ratio         ||a|| / ||b||               (1 when both are 0; +inf when only ||b|| = 0)
//   scale              <a,b> / <b,b>, the least-squares s of a ~ s b, computed as 1 + <d,b>/<b,b>
//                      (1 when both norms are 0; NaN when only ||b|| = 0)
//   scale std. error   ||a - s b|| / (||b|| sqrt(n - 1)): the spread of s that noise of the residual's
//                      size, uncorrelated with b, gives (+inf for n < 2)
//   scale z            |s - 1| / std. error: how many standard errors the scale stands from 1 (0 when
//                      s = 1, +inf when the residual is 0 and s != 1)
//   scale noise p      (||a - s b|| / ||a - b||)^(n-1): a bound on the chance that noise of this rel-L2
//                      pointing in a random direction lines up with b as well as d = a - b does (the
//                      cap of the (n-1)-sphere around b); 1 when d = 0
// Non-finite values follow msprobe: where both sides hold the same non-finite value (NaN and NaN, or
// the same infinity) the pair counts as 0 and 0; where they differ it is a position mismatch, counted
// and left out of every metric (n excludes it). Per-side statistics count non-finite elements as 0.
// An empty comparison (no elements, or every pair mismatched) has zero errors, cosine 1 and ratios 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "store/tensor_file.hpp"

namespace wb::compare {

inline constexpr double kRelEps = 2.2e-16;

// The elements of one tensor in its stored dtype (little-endian, C order).
struct ElementView {
  store::DType dtype = store::DType::F32;
  const std::byte* data = nullptr;
  std::int64_t numel = 0;
};

ElementView view_of(const store::HostTensor& tensor);
ElementView view_of(std::span<const float> values);
ElementView view_of(std::span<const double> values);

// Tolerances of the allclose count: |a - b| <= atol + rtol * |b|.
struct Tolerance {
  double rtol = 1e-4;
  double atol = 1e-4;
};

// Statistics of one side, msprobe's "max/min/mean/l2norm" columns.
struct SideStats {
  double min = 0.0;
  double max = 0.0;
  double mean = 0.0;
  double l2norm = 0.0;
  std::int64_t nan_count = 0;
  std::int64_t inf_count = 0;
};

struct Metrics {
  std::int64_t numel = 0;
  std::int64_t compared = 0;  // numel minus non-finite position mismatches
  double max_abs = 0.0;
  std::int64_t max_abs_index = -1;  // flat C-order index, -1 when nothing was compared
  double mean_abs = 0.0;
  double max_rel = 0.0;
  std::int64_t max_rel_index = -1;
  double rel_l2 = 0.0;
  double rmse = 0.0;
  double euc_dist = 0.0;
  double cosine = 1.0;
  double sqnr_db = std::numeric_limits<double>::infinity();
  double norm_ratio = 1.0;
  double scale = 1.0;
  double scale_stderr = 0.0;
  double scale_z = 0.0;
  double scale_noise_p = 1.0;
  // ||a - s b|| / ||b||: the rel-L2 left when the scale is taken out (what noise is, by assumption).
  double residual_rel_l2 = 0.0;
  Tolerance tolerance;
  std::int64_t allclose_count = 0;
  double allclose_ratio = 1.0;
  std::int64_t one_thousandth_count = 0;
  double one_thousandth_ratio = 1.0;
  std::int64_t five_thousandths_count = 0;
  double five_thousandths_ratio = 1.0;
  SideStats a;
  SideStats b;
  std::int64_t nonfinite_mismatch = 0;         // pairs whose non-finite values differ
  std::int64_t first_nonfinite_mismatch = -1;  // flat index of the first one
  bool bit_exact = false;  // identical bytes, or integers (int32/int64/uint8/bool) equal by value at any width

  bool nonfinite_positions_match() const { return nonfinite_mismatch == 0; }
  bool has_nonfinite() const { return a.nan_count + a.inf_count + b.nan_count + b.inf_count > 0; }
};

// A and B must hold the same number of elements (std::invalid_argument otherwise); their dtypes may
// differ (both are converted to double: F16 and BF16 exactly, I64 rounded to nearest).
Metrics compute_metrics(ElementView a, ElementView b, Tolerance tolerance = {});
Metrics compute_metrics(const store::HostTensor& a, const store::HostTensor& b, Tolerance tolerance = {});

// The same metrics over the updates (a - a_base) and (b - b_base): how a parameter moved in one step,
// which a comparison of the updated values alone hides behind the (identical) starting values.
Metrics compute_update_metrics(ElementView a, ElementView a_base, ElementView b, ElementView b_base,
                               Tolerance tolerance = {});

// One element of the worst-k list.
struct WorstElement {
  std::int64_t index = 0;             // flat C-order index
  std::vector<std::int64_t> coord;    // the same index per dimension
  double a = 0.0;
  double b = 0.0;
  double abs_err = 0.0;               // |a - b|; +inf for a non-finite position mismatch
};

// The k elements with the largest |a - b|, largest first (non-finite mismatches rank above all;
// matching non-finite pairs never appear). Ties keep the lower index first.
std::vector<WorstElement> worst_elements(ElementView a, ElementView b, const std::vector<std::int64_t>& shape,
                                         std::size_t k);

// Converts n elements starting at element `first` to double (the conversion every metric uses).
void convert_to_double(ElementView v, std::int64_t first, std::int64_t n, double* out);

// The C-order coordinates of a flat index.
std::vector<std::int64_t> unravel_index(std::int64_t index, const std::vector<std::int64_t>& shape);

}  // namespace wb::compare
