// Collectives that the training thread itself waits in, recorded as comm ranges on its track:
// SyncBatchNorm's (sync_bn.hpp) and the sharded classifier's (fc_shard.hpp). Each one blocks the thread
// until every member of its rank group has brought its part, so all of their time is exposed: the step
// breakdown counts it as exposed communication, not compute. What part of it is the collective itself
// and what part waits for a slower rank: for each exchange (step, name, occurrence within the step),
// the shortest span over the ranks is the collective's own cost (the last rank to arrive waits for
// nobody); the rest of each rank's span waited for a slower rank.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct BlockingPart {
  std::string layer;  // what the collectives belong to: a batch norm ("layer1.0.bn1"), an exchange ("fc.shard_max")
  std::int64_t forward_ns = 0, backward_ns = 0;  // over every rank and step
};

struct BlockingCommSummary {
  int ranks = 0;                      // 0: the run has none of these collectives
  int steps = 0;                      // step rows with their ranges
  int collectives_per_step = 0;       // on one rank, the most in one step
  double step_ns = 0;                 // mean step time
  double sync_ns = 0;                 // mean time per step in the collectives on one rank: all exposed
  double forward_ns = 0, backward_ns = 0;  // its parts
  double skew_ns = 0;                 // mean per step of the time waiting for a slower rank
  std::vector<BlockingPart> layers;   // by total time, longest first
};

// A range name's part and whether it runs in forward; nullopt for names of other ranges.
struct BlockingName {
  std::string part;
  bool forward = true;
};
using BlockingClassifier = std::function<std::optional<BlockingName>(const std::string& name)>;

// By string id: true for the names `classify` takes.
std::vector<bool> blocking_name_ids(const RunData& run, const BlockingClassifier& classify);
BlockingCommSummary blocking_comm_summary(const RunData& run, const BlockingClassifier& classify);
// A report section's body: the time per step and its share, forward and backward, the wait for a slower
// rank, and the `top` longest parts after `parts_label` ("longest layers").
void write_blocking_lines(const BlockingCommSummary& s, std::ostream& out, const std::string& parts_label,
                          std::size_t top);

}  // namespace wb::analysis
