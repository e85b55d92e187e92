// The arithmetic behind the timeline, free of ImGui so it can be tested with known answers: the visible
// time window and its pixel mapping, zoom at the cursor and pan, per-depth event levels, sub-pixel
// merging (a frame costs the pixels, not the events), hit-testing a time to an event, queue-depth
// decimation per pixel column and time-axis ticks.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "profiler/analysis/critical_path.hpp"
#include "store/rows.hpp"

namespace wb::app_model {

// The visible time window [t0_ns, t1_ns] drawn across width_px pixels (x = 0 at t0_ns).
struct TimeView {
  double t0_ns = 0.0;
  double t1_ns = 1.0;
  double width_px = 1.0;

  double span_ns() const { return t1_ns - t0_ns; }
  double ns_per_px() const { return span_ns() / width_px; }
  double to_px(double t_ns) const { return (t_ns - t0_ns) / span_ns() * width_px; }
  double to_time(double px) const { return t0_ns + px / width_px * span_ns(); }
};

inline constexpr double kMinSpanNs = 100.0;  // deepest zoom: 100 ns across the lane

// The whole of [t0, t1] with a small margin on both sides.
TimeView fit_view(double t0_ns, double t1_ns, double width_px, double margin = 0.02);
// factor > 1 zooms in, < 1 out; the time under px stays under px. The span stays within
// [kMinSpanNs, max_span_ns].
TimeView zoom_at(const TimeView& view, double px, double factor, double max_span_ns = 1e15);
// Dragging the content by dx pixels: dx > 0 brings earlier times into view.
TimeView pan_px(const TimeView& view, double dx_px);
// Keeps the window overlapping [lo, hi] (so the data cannot be panned out of sight); the span is kept.
TimeView keep_in(const TimeView& view, double lo_ns, double hi_ns);

// One nesting level of a track: disjoint events ordered by start (so ends are ordered too).
struct Interval {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};
struct Level {
  std::vector<Interval> spans;
  std::vector<std::uint32_t> rows;  // index of each event in its track's row vector
};

// Splits a track's ranges (ordered by start) into one level per depth.
std::vector<Level> build_levels(std::span<const store::RangeRow> rows);
// Kernels of a stream: overlapping ones (concurrent kernels) go to the first level where they fit.
std::vector<Level> build_levels(std::span<const store::KernelRow> rows);

// One drawn box: a single event (count == 1) or a merged run of events too small to draw alone.
struct DrawRun {
  double x0 = 0.0;
  double x1 = 0.0;
  std::uint32_t first = 0;  // index into the level
  std::uint32_t count = 0;
  std::int64_t busy_ns = 0;  // summed durations of the events in the run
};

// The boxes of one level in the window. Events narrower than min_px merge with their neighbours while
// the gaps between them are under min_px; the cost is O(boxes * log n), not O(events).
void visible_runs(const Level& level, const TimeView& view, double min_px, std::vector<DrawRun>& out);

// The event of a level under time t, or the nearest one within tolerance_ns; nullopt when none.
std::optional<std::uint32_t> hit_test(const Level& level, double t_ns, double tolerance_ns = 0.0);
// The first event of a level whose start is >= t (level.spans.size() when none).
std::uint32_t first_at_or_after(const Level& level, double t_ns);

// Queue depth per pixel column: the step function of samples (value holds until the next sample)
// summarised as the max and min depth seen inside each column. Columns before the first sample are NaN.
struct ColumnExtent {
  double lo = 0.0;
  double hi = 0.0;
};
std::vector<ColumnExtent> counter_columns(std::span<const store::CounterRow> samples, const TimeView& view,
                                          int columns);

// Time-axis ticks: a 1-2-5 step giving about target_count ticks over the window, and the ticks.
double nice_step(double span, double target_count);
std::vector<double> ticks(double lo, double hi, double step);
// "12.5 ms" style label of a tick relative to the window's origin, with precision for this step.
std::string format_tick(double t_ns, double step_ns);

// Statistics of host ranges inside [t0, t1] (the drag-selected range): per (name, category), events
// overlapping the window and their time inside it. Feed levels with add(), then read result().
struct SelectionStat {
  std::uint32_t name = 0;
  std::uint8_t category = 0;
  std::int64_t count = 0;
  std::int64_t inside_ns = 0;
};
class SelectionStats {
 public:
  SelectionStats(std::int64_t t0_ns, std::int64_t t1_ns) : t0_(t0_ns), t1_(t1_ns) {}
  void add(const Level& level, std::span<const store::RangeRow> rows);
  // By time inside the window, descending.
  std::vector<SelectionStat> result() const;

 private:
  std::int64_t t0_, t1_;
  std::vector<SelectionStat> stats_;
  std::unordered_map<std::uint64_t, std::size_t> index_;  // (name << 8 | category) -> stats_ index
};

// Aligning a second run's timeline under the first: both runs' step N should start at the same x. A
// step starts when its earliest rank starts it; the first steady step is the one after the first
// recorded step (step 0 pays for allocation and kernel selection), or the only step there is.
std::optional<std::int64_t> step_start(std::span<const store::StepRow> steps, int step);
std::optional<int> first_steady_step(std::span<const store::StepRow> steps);
// The time a triggered capture's window covers: from its first step's start to its last step's end on
// its rank (every rank's steps when the rank has none), with a 2% margin each side; none when the step
// table has neither step.
std::optional<std::pair<double, double>> window_span(std::span<const store::StepRow> steps,
                                                     const store::CaptureWindowRow& window);
// The shift that maps a time of the first run onto the second run's clock (t2 = t1 + offset): the
// difference of the two runs' starts of `step` when both recorded it, else of their extents' starts.
struct Alignment {
  double offset_ns = 0.0;
  std::optional<int> step;  // the step aligned on, nullopt when the run starts were used
};
Alignment align_runs(std::span<const store::StepRow> first, std::int64_t first_t_min, std::span<const store::StepRow> second,
                     std::int64_t second_t_min, std::optional<int> step);
// The first run's window seen on the second run's clock.
TimeView shifted(const TimeView& view, double offset_ns);

// The step whose critical path the Timeline outlines: step `pinned` when it has a path (pinned >= 0),
// else the step whose path spans t_ns (the time under the cursor, or the window's middle); null when none.
const analysis::StepPath* path_step_at(const analysis::CriticalPath& path, int pinned, double t_ns);

}  // namespace wb::app_model
