// The Timeline's arithmetic, without ImGui (timeline_logic.hpp): the visible window and its pixel
// mapping, zoom and pan, per-depth event levels, sub-pixel merging, hit-testing, queue-depth decimation
// and time-axis ticks.
#include "app/model/timeline_logic.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

namespace wb::app_model {

TimeView fit_view(double t0_ns, double t1_ns, double width_px, double margin) {
  double span = std::max(t1_ns - t0_ns, kMinSpanNs);
  TimeView v;
  v.t0_ns = t0_ns - span * margin;
  v.t1_ns = t0_ns + span * (1.0 + margin);
  v.width_px = std::max(width_px, 1.0);
  return v;
}

TimeView zoom_at(const TimeView& view, double px, double factor, double max_span_ns) {
  if (!(factor > 0.0)) return view;
  double anchor = view.to_time(px);
  double span = std::clamp(view.span_ns() / factor, kMinSpanNs, std::max(max_span_ns, kMinSpanNs));
  double frac = px / view.width_px;
  TimeView v = view;
  v.t0_ns = anchor - frac * span;
  v.t1_ns = v.t0_ns + span;
  return v;
}

TimeView pan_px(const TimeView& view, double dx_px) {
  TimeView v = view;
  double dt = dx_px * view.ns_per_px();
  v.t0_ns -= dt;
  v.t1_ns -= dt;
  return v;
}

TimeView keep_in(const TimeView& view, double lo_ns, double hi_ns) {
  TimeView v = view;
  double span = v.span_ns();
  // At least a tenth of the window keeps showing data.
  double keep = span * 0.1;
  if (v.t1_ns < lo_ns + keep) {
    v.t1_ns = lo_ns + keep;
    v.t0_ns = v.t1_ns - span;
  }
  if (v.t0_ns > hi_ns - keep) {
    v.t0_ns = hi_ns - keep;
    v.t1_ns = v.t0_ns + span;
  }
  return v;
}

std::vector<Level> build_levels(std::span<const store::RangeRow> rows) {
  std::vector<Level> levels;
  for (std::uint32_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (levels.size() <= r.depth) levels.resize(r.depth + 1u);
    levels[r.depth].spans.push_back({r.start_ns, std::max(r.end_ns, r.start_ns)});
    levels[r.depth].rows.push_back(i);
  }
  return levels;
}

std::vector<Level> build_levels(std::span<const store::KernelRow> rows) {
  std::vector<Level> levels;
  for (std::uint32_t i = 0; i < rows.size(); ++i) {
    const auto& k = rows[i];
    std::size_t l = 0;
    while (l < levels.size() && levels[l].spans.back().end_ns > k.start_ns) ++l;
    if (l == levels.size()) levels.emplace_back();
    levels[l].spans.push_back({k.start_ns, std::max(k.end_ns, k.start_ns)});
    levels[l].rows.push_back(i);
  }
  return levels;
}

namespace {

// First event whose end is >= t (ends are ordered within a level).
std::size_t first_ending_at_or_after(const std::vector<Interval>& spans, std::size_t from, double t) {
  auto it = std::partition_point(spans.begin() + static_cast<std::ptrdiff_t>(from), spans.end(),
                                 [t](const Interval& s) { return static_cast<double>(s.end_ns) < t; });
  return static_cast<std::size_t>(it - spans.begin());
}

}  // namespace

void visible_runs(const Level& level, const TimeView& view, double min_px, std::vector<DrawRun>& out) {
  out.clear();
  const auto& s = level.spans;
  const std::size_t n = s.size();
  const double gap_ns = min_px * view.ns_per_px();
  std::size_t i = first_ending_at_or_after(s, 0, view.t0_ns);
  while (i < n && static_cast<double>(s[i].start_ns) <= view.t1_ns) {
    double x0 = view.to_px(static_cast<double>(s[i].start_ns));
    double x1 = view.to_px(static_cast<double>(s[i].end_ns));
    if (x1 - x0 >= min_px) {
      out.push_back({x0, x1, static_cast<std::uint32_t>(i), 1, s[i].end_ns - s[i].start_ns});
      ++i;
      continue;
    }
    // A run of small events: everything ending before (run end + gap) belongs to it; then the next
    // event joins when it is small too and starts within the gap.
    std::size_t a = i;
    double run_end = static_cast<double>(s[i].end_ns);
    std::size_t j = i + 1;
    while (true) {
      j = first_ending_at_or_after(s, j, run_end + gap_ns);
      if (j >= n) break;
      double prev_end = static_cast<double>(s[j - 1].end_ns);
      double start = static_cast<double>(s[j].start_ns);
      double width_ns = static_cast<double>(s[j].end_ns - s[j].start_ns);
      if (start - prev_end > gap_ns || width_ns >= gap_ns || start > view.t1_ns) break;
      run_end = static_cast<double>(s[j].end_ns);
      ++j;
    }
    std::int64_t busy = 0;
    // Summing every event would make the cost O(events); long runs report an estimate instead: the
    // run's extent, which is what the box shows anyway.
    if (j - a <= 64) {
      for (std::size_t k = a; k < j; ++k) busy += s[k].end_ns - s[k].start_ns;
    } else {
      busy = s[j - 1].end_ns - s[a].start_ns;
    }
    double rx1 = view.to_px(static_cast<double>(s[j - 1].end_ns));
    out.push_back({x0, std::max(rx1, x0 + 1.0), static_cast<std::uint32_t>(a), static_cast<std::uint32_t>(j - a), busy});
    i = j;
  }
}

std::optional<std::uint32_t> hit_test(const Level& level, double t_ns, double tolerance_ns) {
  const auto& s = level.spans;
  if (s.empty()) return std::nullopt;
  // Last event starting at or before t.
  auto it = std::partition_point(s.begin(), s.end(), [t_ns](const Interval& v) { return static_cast<double>(v.start_ns) <= t_ns; });
  std::optional<std::uint32_t> best;
  double best_dist = tolerance_ns;
  auto consider = [&](std::ptrdiff_t k) {
    if (k < 0 || k >= static_cast<std::ptrdiff_t>(s.size())) return;
    const auto& v = s[static_cast<std::size_t>(k)];
    double d = 0.0;
    if (t_ns < static_cast<double>(v.start_ns)) d = static_cast<double>(v.start_ns) - t_ns;
    else if (t_ns > static_cast<double>(v.end_ns)) d = t_ns - static_cast<double>(v.end_ns);
    if (d <= best_dist) {
      if (!best || d < best_dist) {
        best = static_cast<std::uint32_t>(k);
        best_dist = d;
      }
    }
  };
  std::ptrdiff_t k = it - s.begin();
  consider(k - 1);  // contains t, or ends just before it
  if (!best || best_dist > 0.0) consider(k);  // starts just after t
  return best;
}

std::uint32_t first_at_or_after(const Level& level, double t_ns) {
  auto it = std::partition_point(level.spans.begin(), level.spans.end(),
                                 [t_ns](const Interval& v) { return static_cast<double>(v.start_ns) < t_ns; });
  return static_cast<std::uint32_t>(it - level.spans.begin());
}

std::vector<ColumnExtent> counter_columns(std::span<const store::CounterRow> samples, const TimeView& view,
                                          int columns) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<ColumnExtent> out(static_cast<std::size_t>(std::max(columns, 0)), ColumnExtent{nan, nan});
  if (samples.empty() || columns <= 0) return out;
  const double col_ns = view.span_ns() / columns;
  // Last sample at or before the window's start gives the depth the first column opens with.
  auto it = std::partition_point(samples.begin(), samples.end(),
                                 [&](const store::CounterRow& c) { return static_cast<double>(c.t_ns) <= view.t0_ns; });
  std::size_t k = static_cast<std::size_t>(it - samples.begin());
  bool have = k > 0;
  double current = have ? samples[k - 1].value : 0.0;
  for (int c = 0; c < columns; ++c) {
    double c1 = view.t0_ns + (c + 1) * col_ns;
    double lo = current, hi = current;
    bool seen = have;
    while (k < samples.size() && static_cast<double>(samples[k].t_ns) < c1) {
      current = samples[k].value;
      if (!seen) {
        lo = hi = current;
        seen = true;
      }
      lo = std::min(lo, current);
      hi = std::max(hi, current);
      ++k;
    }
    have = seen;
    if (seen) out[static_cast<std::size_t>(c)] = {lo, hi};
  }
  return out;
}

double nice_step(double span, double target_count) {
  if (!(span > 0.0) || !(target_count > 0.0)) return 1.0;
  double raw = span / target_count;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double norm = raw / mag;
  double step = norm < 1.5 ? 1.0 : norm < 3.5 ? 2.0 : norm < 7.5 ? 5.0 : 10.0;
  return step * mag;
}

std::vector<double> ticks(double lo, double hi, double step) {
  std::vector<double> out;
  if (!(step > 0.0) || !(hi >= lo)) return out;
  double first = std::ceil(lo / step) * step;
  for (double t = first; t <= hi + step * 1e-9 && out.size() < 10000; t += step) out.push_back(t);
  return out;
}

std::string format_tick(double t_ns, double step_ns) {
  const char* unit = "ns";
  double scale = 1.0;
  if (step_ns >= 1e8) {
    unit = "s";
    scale = 1e9;
  } else if (step_ns >= 1e5) {
    unit = "ms";
    scale = 1e6;
  } else if (step_ns >= 1e2) {
    unit = "us";
    scale = 1e3;
  }
  double v = std::abs(t_ns) < step_ns * 1e-6 ? 0.0 : t_ns / scale;
  double s = step_ns / scale;
  int decimals = s >= 1.0 ? 0 : static_cast<int>(std::ceil(-std::log10(s) - 1e-9));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", std::clamp(decimals, 0, 6), v, unit);
  return buf;
}

void SelectionStats::add(const Level& level, std::span<const store::RangeRow> rows) {
  std::size_t i = first_ending_at_or_after(level.spans, 0, static_cast<double>(t0_));
  for (; i < level.spans.size() && level.spans[i].start_ns < t1_; ++i) {
    const auto& r = rows[level.rows[i]];
    std::int64_t inside = std::min(r.end_ns, t1_) - std::max(r.start_ns, t0_);
    if (inside <= 0 && !(r.start_ns == r.end_ns && r.start_ns >= t0_)) continue;
    std::uint64_t key = (static_cast<std::uint64_t>(r.name) << 8) | r.category;
    auto [it, fresh] = index_.try_emplace(key, stats_.size());
    if (fresh) stats_.push_back({r.name, r.category, 0, 0});
    auto& st = stats_[it->second];
    ++st.count;
    st.inside_ns += std::max<std::int64_t>(inside, 0);
  }
}

std::vector<SelectionStat> SelectionStats::result() const {
  auto out = stats_;
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.inside_ns != b.inside_ns ? a.inside_ns > b.inside_ns : a.name < b.name;
  });
  return out;
}

std::optional<std::int64_t> step_start(std::span<const store::StepRow> steps, int step) {
  std::optional<std::int64_t> start;
  for (const auto& s : steps)
    if (s.step == step) start = start ? std::min(*start, s.start_ns) : s.start_ns;
  return start;
}

std::optional<std::pair<double, double>> window_span(std::span<const store::StepRow> steps,
                                                     const store::CaptureWindowRow& window) {
  auto span_of = [&](bool same_rank) {
    std::optional<std::int64_t> t0, t1;
    for (const auto& s : steps) {
      if (same_rank && s.rank != window.rank) continue;
      if (s.step == window.first_step) t0 = t0 ? std::min(*t0, s.start_ns) : s.start_ns;
      if (s.step == window.last_step) t1 = t1 ? std::max(*t1, s.end_ns) : s.end_ns;
    }
    return std::make_pair(t0, t1);
  };
  auto [t0, t1] = span_of(true);
  if (!t0 || !t1) std::tie(t0, t1) = span_of(false);
  if (!t0 || !t1 || *t1 <= *t0) return std::nullopt;
  const double pad = 0.02 * static_cast<double>(*t1 - *t0);
  return std::make_pair(static_cast<double>(*t0) - pad, static_cast<double>(*t1) + pad);
}

std::optional<int> first_steady_step(std::span<const store::StepRow> steps) {
  if (steps.empty()) return std::nullopt;
  int lo = steps.front().step;
  for (const auto& s : steps) lo = std::min(lo, s.step);
  std::optional<int> next;
  for (const auto& s : steps)
    if (s.step > lo) next = next ? std::min(*next, s.step) : s.step;
  return next ? next : std::optional<int>(lo);
}

Alignment align_runs(std::span<const store::StepRow> first, std::int64_t first_t_min, std::span<const store::StepRow> second,
                     std::int64_t second_t_min, std::optional<int> step) {
  Alignment a;
  a.offset_ns = static_cast<double>(second_t_min) - static_cast<double>(first_t_min);
  if (!step) return a;
  auto s1 = step_start(first, *step), s2 = step_start(second, *step);
  if (!s1 || !s2) return a;
  a.offset_ns = static_cast<double>(*s2) - static_cast<double>(*s1);
  a.step = step;
  return a;
}

TimeView shifted(const TimeView& view, double offset_ns) {
  TimeView v = view;
  v.t0_ns += offset_ns;
  v.t1_ns += offset_ns;
  return v;
}

const analysis::StepPath* path_step_at(const analysis::CriticalPath& path, int pinned, double t_ns) {
  for (const auto& s : path.steps)
    if (pinned >= 0 ? s.step == pinned : static_cast<double>(s.start_ns) <= t_ns && t_ns < static_cast<double>(s.end_ns))
      return &s;
  return nullptr;
}

}  // namespace wb::app_model
