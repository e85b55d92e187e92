// What-if on a data-parallel run's step graph (`wb whatif`): replay the recorded steps with some ranges,
// collectives or input batches made longer or shorter, and predict the step time and its critical path.
//
// The graph, per rank and step:
//   - the ops on the rank's main thread directly under the step (module forward and backward blocks,
//     loss, the data wait, the wait for the allreduces, the optimizer) in program order, each keeping the
//     gap before it; a change to a range inside an op (a module within a block) lengthens that op;
//   - each allreduce bucket joins on a rank when its gradients are ready (an instant inside a backward
//     op, moved with it), or when the rank's previous collective ends; it starts when the last rank
//     has joined, and lasts on each rank what it lasted after that in the recording;
//   - the wait for the allreduces ends when the rank's last collective does;
//   - the data wait (or the step's start, where it did not wait) ends when its batch is in the queue:
//     the input pipeline is replayed from the data
//     workers' recorded batches (each worker takes the next batch once it has a free buffer, batches
//     are queued in order, at most `prefetch` at a time);
//   - each step starts after the rank's previous one, with the recorded gap between them.
// Replayed with no change, the graph gives back the recorded step times (`replay_step_ns`, printed as a
// check). The prediction is the measured step scaled by changed/replayed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "profiler/analysis/critical_path.hpp"
#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

// One --scale PATTERN:FACTOR or --add PATTERN:+US. PATTERN is one or more terms joined by '&', all of
// which must hold:
//   GLOB (or op:GLOB)    a range on a main thread whose name matches (fnmatch: layer3.*, layer4.0.conv2)
//   class:C              a range of category C (forward, backward, loss, optimizer, data, comm), or
//                        class:communication for the allreduce collectives
//   bucket:K             allreduce bucket K's collective
//   rank:R               on rank R only
//   data                 the input pipeline: each batch a data worker assembles
struct WhatIfChange {
  enum class Target { ranges, collectives, batches };
  std::string text;  // as given
  Target target = Target::ranges;
  std::vector<std::string> globs;
  std::optional<int> rank;
  std::optional<int> bucket;
  std::optional<store::Category> category;
  double factor = 1.0;      // --scale
  std::int64_t add_ns = 0;  // --add
};

// Throw AnalysisError naming the text and what was expected.
WhatIfChange parse_scale_change(std::string_view text);
WhatIfChange parse_add_change(std::string_view text);

struct WhatIf {
  int steps_used = 0;                  // steps every rank recorded, from the warmup on
  double measured_step_ns = 0.0;       // mean over those steps of the ranks' mean step time
  double replay_step_ns = 0.0;         // the same, replayed with no change
  double changed_step_ns = 0.0;        // the same, replayed with the changes
  double predicted_step_ns = 0.0;      // measured * changed / replay
  std::vector<std::int64_t> matched;   // per change: ranges, collectives or batches it changed
  bool batches_replayed = false;       // the input pipeline was replayed from worker batches
  int median_step = -1;                // the step whose changed time is nearest their mean
  RunData replayed;                    // the graph's times with the changes: steps, main threads, allreduces
  CriticalPath before;                 // the critical path as recorded
  CriticalPath after;                  // and with the changes (of `replayed`)
};

// Every step every rank recorded is replayed; the figures count those from step `warmup` on (all of them
// when there are none). Throws AnalysisError for a run it cannot replay (no step every rank recorded, a
// pipeline run) and for a change that matches nothing (naming it).
WhatIf what_if(const RunData& run, const std::vector<WhatIfChange>& changes, int warmup = 1);

// Why a replay can be wrong on this run's machines, or empty: a host whose ranks ask for more compute
// threads than it has CPUs (the meta keys host_cpus.rank<R> and threads.rank<R> wb-train writes). There a
// rank that waits gives its CPUs to the others, which then run faster than recorded, and the replay keeps
// every op's recorded time: it over-predicts what one rank's slowdown costs.
std::string shared_cpu_caveat(const RunData& run);

}  // namespace wb::analysis
