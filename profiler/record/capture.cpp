// Triggered capture: the decision (triggers, windows) and the rows held per step until it is taken.
#include "profiler/record/capture.hpp"

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>

#include "profiler/record/recorder.hpp"
#include "store/writer.hpp"

namespace wb::profiler {
namespace {

constexpr std::size_t kMedianSteps = 100;  // the running median looks this far back
constexpr std::size_t kMinHistory = 5;     // steps before the first one judged
constexpr std::size_t kSpanSteps = 256;    // recent steps' spans kept to place kernels
constexpr int kMergedListed = 5;           // further triggers a window's detail names

// Set by the SIGUSR1 handler, taken by Capture::triggers at a step's end.
volatile std::sig_atomic_t g_signalled = 0;
struct sigaction g_previous {};

extern "C" void on_sigusr1(int) { g_signalled = 1; }  // async-signal-safe: one store

template <class T>
bool parse_whole(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && p == end && !text.empty();
}

std::string ms(double ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", ns / 1e6);
  return buf;
}

}  // namespace

CaptureConfig parse_capture(std::string_view text, std::int64_t window) {
  const std::string what = "--capture '" + std::string(text) + "'";
  const std::string expected = ": expected slow:K (keep steps over K x the running median, K > 1), signal (keep the "
                               "steps after a SIGUSR1) or steps:A-B (keep steps A to B, counted from 0)";
  if (window < 1) {
    throw ProfilerError("--capture-window " + std::to_string(window) +
                        ": expected at least 1 step (the steps kept around a trigger)");
  }
  CaptureConfig c;
  c.window = window;
  if (text == "signal") {
    c.mode = CaptureMode::signal;
    return c;
  }
  if (text.starts_with("slow:")) {
    const std::string k(text.substr(5));
    char* end = nullptr;
    const double f = k.empty() ? 0.0 : std::strtod(k.c_str(), &end);
    if (k.empty() || end != k.c_str() + k.size() || !(f > 1.0) || !(f < 1e6)) {
      throw ProfilerError(what + ": the factor K of slow:K must be a number > 1 (e.g. slow:3: over 3x the median)");
    }
    c.mode = CaptureMode::slow;
    c.factor = f;
    return c;
  }
  if (text.starts_with("steps:")) {
    const std::string_view range = text.substr(6);
    const std::size_t dash = range.find('-');
    if (dash == std::string_view::npos || !parse_whole(range.substr(0, dash), c.first) ||
        !parse_whole(range.substr(dash + 1), c.last) || c.first < 0) {
      throw ProfilerError(what + ": expected steps:A-B with whole step numbers counted from 0, e.g. steps:100-120");
    }
    if (c.first > c.last) throw ProfilerError(what + ": the first step A of steps:A-B is after the last B");
    c.mode = CaptureMode::steps;
    return c;
  }
  throw ProfilerError(what + expected);
}

std::string describe(const CaptureConfig& c) {
  char buf[96];
  switch (c.mode) {
    case CaptureMode::slow:
      std::snprintf(buf, sizeof buf, "slow:%g (window %lld)", c.factor, static_cast<long long>(c.window));
      return buf;
    case CaptureMode::signal:
      return "signal (window " + std::to_string(c.window) + ")";
    case CaptureMode::steps:
      return "steps:" + std::to_string(c.first) + "-" + std::to_string(c.last);
    case CaptureMode::full:
      break;
  }
  return "full";
}

Capture::Capture(store::Writer& writer, CaptureConfig config, int rank)
    : writer_(writer), config_(config), rank_(rank) {
  if (config_.mode == CaptureMode::steps) {
    Window w;
    w.row = store::CaptureWindowRow{rank_, static_cast<std::int32_t>(config_.first),
                                    static_cast<std::int32_t>(config_.last), "steps",
                                    static_cast<std::int32_t>(config_.first), "--capture " + describe(config_)};
    windows_.push_back(w);
  }
  if (config_.mode == CaptureMode::signal) {
    g_signalled = 0;
    struct sigaction sa {};
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    handler_installed_ = sigaction(SIGUSR1, &sa, &g_previous) == 0;
  }
}

Capture::~Capture() {
  if (handler_installed_) sigaction(SIGUSR1, &g_previous, nullptr);
}

bool Capture::kept(std::int64_t step) const {
  return std::any_of(windows_.begin(), windows_.end(),
                     [step](const Window& w) { return step >= w.row.first_step && step <= w.row.last_step; });
}

std::int64_t Capture::step_at(std::int64_t t_ns) const {
  auto it = std::find_if(spans_.begin(), spans_.end(), [t_ns](const auto& s) { return s.second >= t_ns; });
  return it == spans_.end() ? -2 : it->first;
}

void Capture::write(Bucket& b) {
  if (!b.ranges.empty()) writer_.add(std::span<const store::RangeRow>(b.ranges));
  if (!b.counters.empty()) writer_.add(std::span<const store::CounterRow>(b.counters));
  if (!b.kernels.empty()) writer_.add(std::span<const store::KernelRow>(b.kernels));
  if (!b.allreduces.empty()) writer_.add(std::span<const store::AllreduceRow>(b.allreduces));
}

void Capture::hold(std::span<const store::RangeRow> rows) {
  std::lock_guard lk(mutex_);
  for (const store::RangeRow& r : rows) {
    if (r.step < 0) continue;
    if (!decided(r.step)) held_[r.step].ranges.push_back(r);
    else if (kept(r.step)) writer_.add(r);
  }
}

void Capture::hold(std::span<const store::CounterRow> rows, std::span<const std::int32_t> steps) {
  std::lock_guard lk(mutex_);
  for (std::size_t i = 0; i < rows.size() && i < steps.size(); ++i) {
    if (steps[i] < 0) continue;
    if (!decided(steps[i])) held_[steps[i]].counters.push_back(rows[i]);
    else if (kept(steps[i])) writer_.add(rows[i]);
  }
}

void Capture::hold(std::span<const store::KernelRow> rows) {
  std::lock_guard lk(mutex_);
  for (const store::KernelRow& k : rows) {
    const std::int64_t step = step_at(k.start_ns);
    if (step == -2) unplaced_.push_back(k);
    else if (!decided(step)) held_[step].kernels.push_back(k);
    else if (kept(step)) writer_.add(k);
  }
}

void Capture::hold(const store::AllreduceRow& row) {
  std::lock_guard lk(mutex_);
  if (row.step < 0) return;
  if (!decided(row.step)) held_[row.step].allreduces.push_back(row);
  else if (kept(row.step)) writer_.add(row);
}

unsigned Capture::triggers(std::int64_t step, std::int64_t duration_ns) {
  std::lock_guard lk(mutex_);
  unsigned t = 0;
  if (config_.mode == CaptureMode::signal && g_signalled != 0) {
    g_signalled = 0;
    t |= kTriggerSignal;
  }
  local_signal_ = (t & kTriggerSignal) != 0;
  if (config_.mode == CaptureMode::slow) {
    slow_detail_.clear();
    if (history_.size() >= kMinHistory) {
      std::vector<std::int64_t> sorted(history_.begin(), history_.end());
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
      const double median = static_cast<double>(sorted[sorted.size() / 2]);
      const double ratio = median > 0 ? static_cast<double>(duration_ns) / median : 0.0;
      char buf[160];
      std::snprintf(buf, sizeof buf, "step %lld: %s, %.1fx the running median (%s)", static_cast<long long>(step),
                    ms(static_cast<double>(duration_ns)).c_str(), ratio, ms(median).c_str());
      slow_detail_ = buf;
      if (median > 0 && static_cast<double>(duration_ns) > config_.factor * median) t |= kTriggerSlow;
    }
    history_.push_back(duration_ns);
    if (history_.size() > kMedianSteps) history_.pop_front();
  }
  local_slow_ = (t & kTriggerSlow) != 0;
  return t;
}

void Capture::open_window(std::int64_t first, std::int64_t last, const char* trigger, std::int64_t trigger_step,
                          const std::string& detail) {
  first = std::max(first, first_step_);
  if (!windows_.empty() && !windows_.back().written && first <= windows_.back().row.last_step + 1) {
    Window& w = windows_.back();
    w.row.last_step = static_cast<std::int32_t>(std::max<std::int64_t>(w.row.last_step, last));
    if (++w.merged <= kMergedListed) {
      w.row.detail += (w.merged == 1 ? "; then " : "; ") + detail;
    } else if (w.merged == kMergedListed + 1) {
      w.row.detail += "; ...";
    }
    return;
  }
  Window w;
  w.row = store::CaptureWindowRow{rank_, static_cast<std::int32_t>(first), static_cast<std::int32_t>(last), trigger,
                                  static_cast<std::int32_t>(trigger_step), detail};
  windows_.push_back(w);
}

void Capture::end_step(std::int64_t step, unsigned triggers, std::int64_t end_ns) {
  std::lock_guard lk(mutex_);
  if (first_step_ < 0) first_step_ = step;
  last_step_ = step;
  spans_.emplace_back(step, end_ns);
  if (spans_.size() > kSpanSteps) spans_.pop_front();
  // Kernels that ran before this step's end belong to it (or to an earlier step still held).
  std::vector<store::KernelRow> later;
  for (const store::KernelRow& k : unplaced_) {
    const std::int64_t s = step_at(k.start_ns);
    if (s == -2) later.push_back(k);
    else if (!decided(s)) held_[s].kernels.push_back(k);
    else if (kept(s)) writer_.add(k);
  }
  unplaced_.swap(later);

  const std::int64_t n = config_.window;
  const std::string s = "step " + std::to_string(step);
  if (config_.mode == CaptureMode::slow && (triggers & kTriggerSlow) != 0) {
    open_window(step - n, step + n, "slow", step,
                local_slow_ ? slow_detail_ : slow_detail_ + " here; slow on another rank");
  }
  if (config_.mode == CaptureMode::signal && (triggers & kTriggerSignal) != 0) {
    open_window(step + 1, step + n, "signal", step,
                std::string(local_signal_ ? "SIGUSR1" : "SIGUSR1 on another rank") + " during " + s);
  }
  decided_through_ = config_.mode == CaptureMode::slow ? step - n : step;
  release_decided();
}

void Capture::release_decided() {
  for (auto it = held_.begin(); it != held_.end() && it->first <= decided_through_; it = held_.erase(it)) {
    if (kept(it->first)) write(it->second);
  }
  for (Window& w : windows_) {
    if (w.written || w.row.last_step > decided_through_) continue;
    writer_.add(w.row);
    w.written = true;
  }
}

void Capture::finish() {
  std::lock_guard lk(mutex_);
  if (finished_) return;
  finished_ = true;
  // Windows are cut at the run's ends; a fixed window the run never reached goes.
  std::erase_if(windows_, [this](Window& w) {
    if (w.written) return false;
    w.row.first_step = static_cast<std::int32_t>(std::max<std::int64_t>(w.row.first_step, std::max<std::int64_t>(first_step_, 0)));
    w.row.last_step = static_cast<std::int32_t>(std::min<std::int64_t>(w.row.last_step, last_step_));
    return w.row.first_step > w.row.last_step;
  });
  decided_through_ = last_step_;
  if (kept(last_step_)) {
    for (const store::KernelRow& k : unplaced_) held_[last_step_].kernels.push_back(k);
  }
  unplaced_.clear();
  release_decided();
  held_.clear();
}

std::vector<store::CaptureWindowRow> Capture::windows() const {
  std::lock_guard lk(mutex_);
  std::vector<store::CaptureWindowRow> out;
  for (const Window& w : windows_) out.push_back(w.row);
  return out;
}

std::int64_t Capture::steps_kept() const {
  std::lock_guard lk(mutex_);
  std::int64_t n = 0;
  for (const Window& w : windows_) {
    const std::int64_t last = std::min<std::int64_t>(w.row.last_step, decided_through_);
    if (last >= w.row.first_step) n += last - w.row.first_step + 1;
  }
  return n;
}

}  // namespace wb::profiler
