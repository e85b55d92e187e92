#pragma once
// Bucket spans and clock offsets use CLOCK_MONOTONIC in integer nanoseconds: the clock the profiler and
// the data pipeline record with, so allreduce spans land on the same timeline as host ranges.

#include <cstdint>
#include <ctime>

namespace wb::parallel {

inline std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace wb::parallel
