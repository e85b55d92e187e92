// Stragglers and the critical path across ranks. In data parallelism every rank's allreduce of a
// gradient bucket completes only once the last rank has that bucket ready, so per step the rank whose
// gradients come last holds every other rank back. From the clock-aligned timelines (all times are on
// rank 0's clock):
//   - per step, the last rank: the one whose gradients were ready last (its latest bucket ready time,
//     else the end of its last backward range);
//   - how long each other rank waited for it: per bucket, the latest ready time over the ranks minus the
//     rank's own ready time, the largest over the buckets (0 for the last rank itself);
//   - what made the last rank late, against the median of the other ranks in the same step: more data
//     wait, slower ops (the ops whose ranges took longest beyond the others' median), or the host (the
//     rest of its lag: time between ops, scheduling, a slower start);
//   - persistent stragglers: ranks last in more than a given share of the steps, with their mean lag,
//     the wait they cause, and the ops behind it summed over those steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

enum class LagCause { data_wait, slower_ops, host };
const char* lag_cause_name(LagCause c);  // "data wait", "slower ops", "host"

struct OpLag {
  std::string op;          // the range name (a module: "layer3.1.conv2")
  std::int64_t extra_ns = 0;  // its time on the late rank minus the others' median (summed over steps)
};

struct StepStraggle {
  int step = 0;
  int last_rank = -1;
  std::int64_t lag_ns = 0;               // the last rank's ready time minus the others' median
  std::vector<std::int64_t> wait_ns;     // per rank (StragglerAnalysis::ranks order): wait for the last rank
  LagCause cause = LagCause::host;
  std::int64_t data_extra_ns = 0;        // the last rank's data wait minus the others' median
  std::int64_t ops_extra_ns = 0;         // its op time minus the others' median (positive ops only)
  std::vector<OpLag> top_ops;            // up to 3 ops that took longest beyond the others' median
};

struct PersistentStraggler {
  int rank = -1;
  int steps_last = 0;                   // steps in which it was the last rank
  double fraction = 0.0;                // of the steps all ranks share
  double mean_lag_ns = 0.0;             // over the steps it was last
  double mean_wait_caused_ns = 0.0;     // the other ranks' mean wait in those steps
  LagCause cause = LagCause::host;      // the cause with the most time over those steps
  std::int64_t data_extra_ns = 0, ops_extra_ns = 0, host_extra_ns = 0;  // summed over those steps
  std::vector<OpLag> top_ops;           // summed over those steps, up to 5
};

// A rank last in more than this share of the shared steps is a persistent straggler.
inline constexpr double kPersistentStragglerShare = 0.5;

struct StragglerAnalysis {
  std::vector<int> ranks;                // ascending
  std::vector<StepStraggle> steps;       // steps every rank recorded, ascending
  std::vector<PersistentStraggler> persistent;
  // Per rank (ranks order): total wait for other ranks over all steps.
  std::vector<std::int64_t> total_wait_ns;
  std::int64_t max_wait_ns = 0;          // the largest single wait (for colour scales)
};

// Empty (no steps) for a single-rank run. `share` is the persistent-straggler threshold.
StragglerAnalysis analyze_stragglers(const RunData& run, double share = kPersistentStragglerShare);

}  // namespace wb::analysis
