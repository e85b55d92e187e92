// SyncBatchNorm's collectives in a run (wb-train --sync-bn): the comm ranges "<bn>.sync_stats" (forward:
// the batch statistics) and "<bn>.sync_grads" (backward: the two gradient sums) on each rank's training
// thread. Each one blocks the training thread until every rank of the group has brought its sums, so
// all of their time is exposed: the step breakdown counts it as exposed communication, not compute.
// What part of it is the collective itself and what part waits for a slower rank: for each exchange
// (rank group, step, layer, direction), the shortest span over the ranks is the collective's own cost
// (the last rank to arrive waits for nobody); the rest of each rank's span waited for a slower rank.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// Whether `name` is a SyncBatchNorm range name.
bool is_sync_bn_name(const std::string& name);
// By string id: true for the ids of SyncBatchNorm range names.
std::vector<bool> sync_bn_name_ids(const RunData& run);

struct SyncBnLayer {
  std::string layer;  // the batch norm ("layer1.0.bn1")
  std::int64_t forward_ns = 0, backward_ns = 0;  // over every rank and step
};

struct SyncBnSummary {
  int ranks = 0;
  int steps = 0;                      // step rows with their ranges
  int collectives_per_step = 0;       // on one rank (2 per batch norm)
  double step_ns = 0;                 // mean step time
  double sync_ns = 0;                 // mean time per step in the collectives on one rank: all exposed
  double forward_ns = 0, backward_ns = 0;  // its parts
  double skew_ns = 0;                 // mean per step of the time waiting for a slower rank
  std::vector<SyncBnLayer> layers;    // by total time, longest first
};

// Empty (ranks 0) when the run has no SyncBatchNorm ranges.
SyncBnSummary sync_bn_summary(const RunData& run);
// The report's section; nothing when the run has no SyncBatchNorm ranges.
void write_sync_bn_section(const RunData& run, std::ostream& out, std::size_t top_layers = 5);

}  // namespace wb::analysis
