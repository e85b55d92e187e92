// The sharded classifier's collectives in a run (wb-train --shard-fc N): the comm ranges "fc.shard_*" on
// each rank's training thread: in forward fc.shard_gather (the group's features and labels),
// fc.shard_max, fc.shard_sum and fc.shard_target (the parallel cross-entropy's three sums); in backward
// fc.shard_grad (the features' gradient, reduce-scattered) and, with several shard groups,
// fc.shard_sync (the slices' gradients across them). Each one blocks the training thread (blocking_comm.hpp); the
// summary's parts are the exchanges.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "profiler/analysis/blocking_comm.hpp"
#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// Whether `name` is one of the sharded classifier's range names.
bool is_fc_shard_name(const std::string& name);
// By string id: true for the ids of its range names.
std::vector<bool> fc_shard_name_ids(const RunData& run);
// Empty (ranks 0) when the run has none of its ranges.
BlockingCommSummary fc_shard_summary(const RunData& run);
// The report's section; nothing when the run has none of its ranges.
void write_fc_shard_section(const RunData& run, std::ostream& out);

}  // namespace wb::analysis
