#include "app/model/plot_logic.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "app/model/timeline_logic.hpp"

namespace wb::app_model {

std::int64_t Histogram::max_count() const {
  return counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
}

int Histogram::bin_of(double v) const {
  if (counts.empty() || !std::isfinite(v) || v < edges.front() || v > edges.back()) return -1;
  if (log_scale && v <= 0.0) return -1;
  auto it = std::upper_bound(edges.begin(), edges.end(), v);
  int b = static_cast<int>(it - edges.begin()) - 1;
  return std::min(b, static_cast<int>(counts.size()) - 1);
}

Histogram make_histogram(std::span<const double> values, int bins, double lo, double hi, bool log_scale) {
  if (bins < 1) throw std::invalid_argument("histogram: expected at least one bin");
  if (!(hi >= lo)) throw std::invalid_argument("histogram: expected lo <= hi");
  if (log_scale && !(lo > 0.0)) throw std::invalid_argument("histogram: a log scale needs lo > 0");
  Histogram h;
  h.log_scale = log_scale;
  if (hi == lo) bins = 1;
  h.counts.assign(static_cast<std::size_t>(bins), 0);
  h.edges.resize(static_cast<std::size_t>(bins) + 1);
  const double a = log_scale ? std::log10(lo) : lo;
  const double b = log_scale ? std::log10(hi) : hi;
  for (int i = 0; i <= bins; ++i) {
    double e = a + (b - a) * i / bins;
    h.edges[static_cast<std::size_t>(i)] = log_scale ? std::pow(10.0, e) : e;
  }
  h.edges.front() = lo;
  h.edges.back() = hi;
  const double width = (b - a) / bins;
  for (double v : values) {
    if (!std::isfinite(v)) {
      ++h.nonfinite;
      continue;
    }
    if (log_scale && v <= 0.0) {
      ++h.below;
      continue;
    }
    if (v < lo) {
      ++h.below;
      continue;
    }
    if (v > hi) {
      ++h.above;
      continue;
    }
    double x = log_scale ? std::log10(v) : v;
    int bin = width > 0.0 ? static_cast<int>((x - a) / width) : 0;
    bin = std::clamp(bin, 0, bins - 1);
    // Rounding in the division can land a value one bin off its edges; the edges decide.
    while (bin > 0 && v < h.edges[static_cast<std::size_t>(bin)]) --bin;
    while (bin < bins - 1 && v >= h.edges[static_cast<std::size_t>(bin) + 1]) ++bin;
    ++h.counts[static_cast<std::size_t>(bin)];
  }
  return h;
}

Histogram make_histogram(std::span<const double> values, int bins, bool log_scale) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values) {
    if (!std::isfinite(v) || (log_scale && v <= 0.0)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (!(hi >= lo)) {  // nothing to bin: an empty histogram over a unit range
    lo = log_scale ? 1.0 : 0.0;
    hi = log_scale ? 10.0 : 1.0;
  }
  return make_histogram(values, bins, lo, hi, log_scale);
}

Axis nice_axis(double lo, double hi, double target) {
  Axis a;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return a;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    double pad = lo == 0.0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  a.step = nice_step(hi - lo, target);
  a.lo = std::floor(lo / a.step) * a.step;
  a.hi = std::ceil(hi / a.step) * a.step;
  return a;
}

std::vector<double> log_decades(double lo, double hi) {
  std::vector<double> out;
  if (!(lo > 0.0) || !(hi >= lo)) return out;
  for (int k = static_cast<int>(std::floor(std::log10(lo))); k <= static_cast<int>(std::ceil(std::log10(hi))); ++k)
    out.push_back(std::pow(10.0, k));
  return out;
}

}  // namespace wb::app_model
