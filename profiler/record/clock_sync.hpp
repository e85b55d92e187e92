// Cross-rank clock alignment. Every rank measures its offset to rank 0 by ping-pong at start and at end;
// stored times are rank-0 nanoseconds, with the drift between the two measurements corrected linearly.
// The MPI exchange lives with the communicator; this file is the math, free of MPI.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>

namespace wb::profiler {

class ClockSyncError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One ping-pong: local send time t0, the remote clock's reading t1, local receive time t2.
struct ClockSample {
  std::int64_t t0 = 0;
  std::int64_t t1 = 0;
  std::int64_t t2 = 0;
};

// offset_ns: remote minus local (add it to a local time to get remote time); rtt_ns: the round trip of
// the sample it came from, which bounds the error to rtt/2.
struct ClockSync {
  std::int64_t offset_ns = 0;
  std::int64_t rtt_ns = 0;
  std::int64_t local_ns = 0;  // local midpoint (t0+t2)/2 of the chosen sample: when the offset held
  int samples = 0;
};

// offset = t1 - (t0+t2)/2 of the sample with the smallest round trip t2 - t0 (NTP's minimum-delay
// filter: the least-queued exchange is the most symmetric). Throws ClockSyncError on no samples or on a
// sample with t2 < t0.
ClockSync best_offset(std::span<const ClockSample> samples);

// Runs `rounds` exchanges. ping() performs one round trip and returns the remote clock's reading; the
// local times around it are taken with now_ns(). A single-process run passes a ping that returns
// now_ns() (offset ~0) or simply uses ClockSync{}.
ClockSync estimate_offset(const std::function<std::int64_t()>& ping, int rounds = 64);

// Maps local times to rank-0 times from the offsets measured at start and at end, interpolating (and
// extrapolating) the offset linearly in local time. With equal start and end points it is a constant
// shift.
class ClockMap {
 public:
  ClockMap() = default;
  ClockMap(std::int64_t t_start, std::int64_t offset_start, std::int64_t t_end, std::int64_t offset_end);
  ClockMap(const ClockSync& start, const ClockSync& end)
      : ClockMap(start.local_ns, start.offset_ns, end.local_ns, end.offset_ns) {}
  explicit ClockMap(const ClockSync& start) : ClockMap(start.local_ns, start.offset_ns, start.local_ns, start.offset_ns) {}

  std::int64_t to_rank0(std::int64_t local_ns) const;
  // Drift in ns of offset per second of local time.
  double drift_ns_per_s() const;

  std::int64_t t_start() const { return t_start_; }
  std::int64_t offset_start() const { return offset_start_; }
  std::int64_t t_end() const { return t_end_; }
  std::int64_t offset_end() const { return offset_end_; }

 private:
  std::int64_t t_start_ = 0;
  std::int64_t offset_start_ = 0;
  std::int64_t t_end_ = 0;
  std::int64_t offset_end_ = 0;
};

}  // namespace wb::profiler
