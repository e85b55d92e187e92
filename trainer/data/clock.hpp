#pragma once
// The pipeline's timestamps: CLOCK_MONOTONIC in integer nanoseconds, the same clock the profiler
// records with, so queue events and host ranges land on one timeline.

#include <cstdint>
#include <ctime>

namespace wb::data {

inline int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace wb::data
