#include "profiler/record/clock_sync.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "profiler/record/clock.hpp"

namespace wb::profiler {

namespace {
__extension__ typedef __int128 int128;  // __extension__: GCC/Clang's 128-bit type, quiet under -Wpedantic
}  // namespace

ClockSync best_offset(std::span<const ClockSample> samples) {
  if (samples.empty()) throw ClockSyncError("clock sync: no ping-pong samples");
  const ClockSample* best = nullptr;
  for (const ClockSample& s : samples) {
    if (s.t2 < s.t0) {
      throw ClockSyncError("clock sync: sample received (t2=" + std::to_string(s.t2) + ") before it was sent (t0=" +
                           std::to_string(s.t0) + ")");
    }
    if (best == nullptr || s.t2 - s.t0 < best->t2 - best->t0) best = &s;
  }
  // (t0+t2)/2 without overflow: t0 + (t2-t0)/2, exact for even round trips and floor for odd ones.
  std::int64_t mid = best->t0 + (best->t2 - best->t0) / 2;
  return ClockSync{best->t1 - mid, best->t2 - best->t0, mid, static_cast<int>(samples.size())};
}

ClockSync estimate_offset(const std::function<std::int64_t()>& ping, int rounds) {
  if (rounds < 1) throw ClockSyncError("clock sync: rounds must be >= 1, got " + std::to_string(rounds));
  std::vector<ClockSample> samples(static_cast<std::size_t>(rounds));
  for (ClockSample& s : samples) {
    s.t0 = now_ns();
    s.t1 = ping();
    s.t2 = now_ns();
  }
  return best_offset(samples);
}

ClockMap::ClockMap(std::int64_t t_start, std::int64_t offset_start, std::int64_t t_end, std::int64_t offset_end)
    : t_start_(t_start), offset_start_(offset_start), t_end_(t_end), offset_end_(offset_end) {
  if (t_end < t_start) {
    throw ClockSyncError("clock map: end measurement (" + std::to_string(t_end) + " ns) precedes start (" +
                         std::to_string(t_start) + " ns)");
  }
}

std::int64_t ClockMap::to_rank0(std::int64_t local_ns) const {
  if (t_end_ == t_start_ || offset_end_ == offset_start_) return local_ns + offset_start_;
  // 128-bit product: (local - t_start) and the offset change can both be large.
  int128 num = static_cast<int128>(local_ns - t_start_) * (offset_end_ - offset_start_);
  int128 den = t_end_ - t_start_;
  // Round to nearest, half away from zero.
  int128 q = num >= 0 ? (num + den / 2) / den : -((-num + den / 2) / den);
  return local_ns + offset_start_ + static_cast<std::int64_t>(q);
}

double ClockMap::drift_ns_per_s() const {
  if (t_end_ == t_start_) return 0.0;
  return static_cast<double>(offset_end_ - offset_start_) * 1e9 / static_cast<double>(t_end_ - t_start_);
}

}  // namespace wb::profiler
