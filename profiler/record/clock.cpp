#include "profiler/record/clock.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

namespace wb::profiler {

namespace detail {
bool g_ticks_are_tsc = false;
}  // namespace detail

namespace {

bool cpu_has_invariant_tsc() {
#ifdef WB_PROFILER_HAVE_TSC
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    auto has = [&](const char* flag) { return (" " + line + " ").find(std::string(" ") + flag + " ") != std::string::npos; };
    return has("constant_tsc") && has("nonstop_tsc");
  }
#endif
  return false;
}

}  // namespace

bool ticks_are_tsc() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* force = std::getenv("WB_PROFILER_CLOCK");
    bool monotonic_forced = force != nullptr && std::strcmp(force, "monotonic") == 0;
    detail::g_ticks_are_tsc = !monotonic_forced && cpu_has_invariant_tsc();
  });
  return detail::g_ticks_are_tsc;
}

TickPair TickClock::sample_pair() {
  TickPair best;
  std::int64_t best_gap = INT64_MAX;
  for (int i = 0; i < 8; ++i) {
    std::int64_t a = now_ticks();
    std::int64_t ns = now_ns();
    std::int64_t b = now_ticks();
    if (b - a < best_gap) {
      best_gap = b - a;
      best = {a + (b - a) / 2, ns};
    }
  }
  return best;
}

TickClock::TickClock() : uses_tsc_(ticks_are_tsc()) {
  if (!uses_tsc_) {
    segments_.push_back({0, 0, 1.0});
    return;
  }
  base_ = sample_pair();
  TickPair second;
  do {
    second = sample_pair();
  } while (second.ns - base_.ns < 2'000'000);
  global_slope_ = static_cast<double>(second.ns - base_.ns) / static_cast<double>(second.ticks - base_.ticks);
  segments_.push_back({base_.ticks, base_.ns, global_slope_});
}

const TickClock::Segment& TickClock::segment_for(std::int64_t ticks) const {
  // Conversions arrive roughly in time order, so the last segment used is almost always the answer.
  std::size_t n = segments_.size();
  std::size_t i = std::min(last_hit_, n - 1);
  bool inside = segments_[i].ticks <= ticks && (i + 1 == n || ticks < segments_[i + 1].ticks);
  if (!inside) {
    auto it = std::upper_bound(segments_.begin(), segments_.end(), ticks,
                               [](std::int64_t t, const Segment& s) { return t < s.ticks; });
    i = it == segments_.begin() ? 0 : static_cast<std::size_t>(it - segments_.begin()) - 1;
    last_hit_ = i;
  }
  return segments_[i];
}

std::int64_t TickClock::to_ns(std::int64_t ticks) const {
  if (!uses_tsc_) return ticks;
  const Segment& s = segment_for(ticks);
  return s.ns + static_cast<std::int64_t>(static_cast<double>(ticks - s.ticks) * s.slope);
}

void TickClock::refresh() {
  if (!uses_tsc_) return;
  TickPair p = sample_pair();
  const Segment& last = segments_.back();
  std::int64_t interval = p.ticks - last.ticks;
  if (interval <= 0) return;
  global_slope_ = static_cast<double>(p.ns - base_.ns) / static_cast<double>(p.ticks - base_.ticks);
  std::int64_t continuous_ns = to_ns(p.ticks);
  // Aim to meet the measured clock one interval from now; the clamp keeps the mapping strictly
  // increasing even if a calibration pair was disturbed (preempted between its readings).
  double target = static_cast<double>(p.ns) + global_slope_ * static_cast<double>(interval);
  double slope = (target - static_cast<double>(continuous_ns)) / static_cast<double>(interval);
  slope = std::clamp(slope, 0.9 * global_slope_, 1.1 * global_slope_);
  segments_.push_back({p.ticks, continuous_ns, slope});
}

}  // namespace wb::profiler
