// SyncBatchNorm's collectives in a run (wb-train --sync-bn): the comm ranges "<bn>.sync_stats" (forward:
// the batch statistics) and "<bn>.sync_grads" (backward: the two gradient sums) on each rank's training
// thread. Each one blocks the training thread (blocking_comm.hpp: all exposed, and the part of it spent
// waiting for a slower rank); the summary's parts are the batch norms.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "profiler/analysis/blocking_comm.hpp"
#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// Whether `name` is a SyncBatchNorm range name.
bool is_sync_bn_name(const std::string& name);
// By string id: true for the ids of SyncBatchNorm range names.
std::vector<bool> sync_bn_name_ids(const RunData& run);

using SyncBnLayer = BlockingPart;
using SyncBnSummary = BlockingCommSummary;

// Empty (ranks 0) when the run has no SyncBatchNorm ranges.
SyncBnSummary sync_bn_summary(const RunData& run);
// The report's section; nothing when the run has no SyncBatchNorm ranges.
void write_sync_bn_section(const RunData& run, std::ostream& out, std::size_t top_layers = 5);

}  // namespace wb::analysis
