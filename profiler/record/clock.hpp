// Time sources of the profiler. now_ns() is the one clock every timestamp is expressed in: CLOCK_MONOTONIC
// in integer nanoseconds, the same clock as wb::data::now_ns, so ranges, queue samples and CUPTI records
// land on one timeline.
//
// The hot path (Range begin/end) reads now_ticks() instead, and the flusher converts ticks to now_ns()
// nanoseconds. Why: clock_gettime costs ~37 ns through the vDSO on a KVM guest (two per range would blow
// the 20 ns budget), rdtsc costs ~10 ns, and when the kernel's clocksource is the invariant TSC,
// CLOCK_MONOTONIC is itself a linear function of the TSC, so a fit of one against the other is exact up
// to the pairing error of the calibration samples (tens of ns). Without an invariant TSC (or off x86),
// ticks are nanoseconds and the conversion is the identity.
#pragma once

#include <cstdint>
#include <cstddef>
#include <ctime>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define WB_PROFILER_HAVE_TSC 1
#endif

namespace wb::profiler {

inline std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

namespace detail {
// Set once by ticks_are_tsc() before any recorder records; read on the hot path.
extern bool g_ticks_are_tsc;
}  // namespace detail

// A raw timestamp for the hot path: TSC ticks when TickClock found an invariant TSC, else now_ns().
inline std::int64_t now_ticks() {
#ifdef WB_PROFILER_HAVE_TSC
  if (detail::g_ticks_are_tsc) [[likely]] return static_cast<std::int64_t>(__rdtsc());
#endif
  return now_ns();
}

// One (tick, ns) pair taken as close together as the hardware allows.
struct TickPair {
  std::int64_t ticks = 0;
  std::int64_t ns = 0;
};

// True when now_ticks() reads an invariant TSC. Decided once per process (constant_tsc and nonstop_tsc
// in /proc/cpuinfo; the environment variable WB_PROFILER_CLOCK=monotonic forces plain nanoseconds).
bool ticks_are_tsc();

// Converts now_ticks() values to now_ns() nanoseconds. The mapping is piecewise linear in ticks and
// continuous: refresh() starts a new segment at "now" whose slope steers the line back onto the
// long-baseline fit of all calibration pairs. Because a tick value always maps through the segment that
// contains it, the same tick converts to the same nanosecond whenever it is converted, so ranges that
// were flushed at different times keep their exact nesting and order.
// Not thread-safe: one owner (the recorder's flusher) converts and refreshes.
class TickClock {
 public:
  TickClock();  // calibrates over ~2 ms when ticks are TSC

  bool uses_tsc() const { return uses_tsc_; }
  void refresh();
  std::int64_t to_ns(std::int64_t ticks) const;

  // The ns reading bracketed by the two tick readings with the smallest gap of a few tries, the tick
  // taken as their midpoint.
  static TickPair sample_pair();

 private:
  struct Segment {
    std::int64_t ticks;
    std::int64_t ns;
    double slope;
  };
  const Segment& segment_for(std::int64_t ticks) const;

  bool uses_tsc_ = false;
  TickPair base_;
  double global_slope_ = 1.0;
  std::vector<Segment> segments_;
  mutable std::size_t last_hit_ = 0;
};

}  // namespace wb::profiler
