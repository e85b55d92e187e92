// Plot arithmetic shared by the views, free of ImGui: histogram binning (linear or logarithmic bins,
// like Tracy's find-zone histogram), value axes with 1-2-5 ticks, log-axis decades.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace wb::app_model {

struct Histogram {
  std::vector<double> edges;          // bins + 1 ascending edges
  std::vector<std::int64_t> counts;   // per bin; the last bin includes its upper edge
  std::int64_t below = 0;             // values under edges.front() (or <= 0 on a log axis)
  std::int64_t above = 0;             // values over edges.back()
  std::int64_t nonfinite = 0;         // NaN and infinities, never binned
  bool log_scale = false;
  std::int64_t max_count() const;
  // The bin holding v, or -1 when outside.
  int bin_of(double v) const;
};

// Bins over [lo, hi]; lo == hi gives one bin. log_scale needs lo > 0: bin edges are equal steps of
// log10. Throws std::invalid_argument for bins < 1, hi < lo or a log scale with lo <= 0.
Histogram make_histogram(std::span<const double> values, int bins, double lo, double hi, bool log_scale);
// Same, over the finite values' own range (the positive ones' for a log scale).
Histogram make_histogram(std::span<const double> values, int bins, bool log_scale);

// Axis range rounded outward to the 1-2-5 step that gives about target ticks.
struct Axis {
  double lo = 0.0;
  double hi = 1.0;
  double step = 1.0;
};
Axis nice_axis(double lo, double hi, double target = 5.0);
// Decades 10^k covering [lo, hi] (lo > 0) for a log axis.
std::vector<double> log_decades(double lo, double hi);

}  // namespace wb::app_model
