// Per-step breakdown (compute, data wait, exposed communication, other) and input-starvation metrics:
// TensorFlow Profiler's input-bound percentage, MindInsight's empty-queue ratio, the longest spells of
// an empty queue, producer and consumer rates and the worker count that would keep the queue non-empty.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct StepBreakdown {
  int rank = 0;
  int step = 0;
  std::int64_t start_ns = 0;
  std::int64_t total_ns = 0;
  std::int64_t compute_ns = 0;       // union of forward/backward/loss/optimizer ranges on the main track
  std::int64_t data_wait_ns = 0;     // step.data_wait_ns, else union of data ranges on the main track
  std::int64_t h2d_ns = 0;           // union of h2d ranges on the main track (part of "other")
  std::int64_t comm_exposed_ns = 0;  // DDP exposed time from allreduce rows, else step.comm_exposed_ns; + sync_bn_ns + fc_shard_ns
  std::int64_t sync_bn_ns = 0;       // SyncBatchNorm's collectives (sync_bn.hpp), all exposed
  std::int64_t fc_shard_ns = 0;      // the sharded classifier's collectives (fc_shard.hpp), all exposed
  std::int64_t other_ns = 0;         // the rest of the step, never negative
};

std::vector<StepBreakdown> step_breakdown(const RunData& run);

// TensorFlow Profiler's input-pipeline classification of input% = 100 (wait + h2d) / step time.
enum class InputBound { no, moderately, highly };  // < 5 %, 5-20 %, > 20 %
InputBound classify_input_bound(double percent);
const char* input_bound_name(InputBound b);

struct InputBoundStats {
  int rank = -1;  // -1: all ranks together
  int steps = 0;
  std::int64_t step_ns = 0;
  std::int64_t wait_ns = 0;  // data wait + host-to-device copies
  double percent = 0.0;
  InputBound level = InputBound::no;
};

struct Spell {
  int rank = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  int step = -1;  // the step it began in, -1 when outside every step
  std::int64_t duration_ns() const { return end_ns - start_ns; }
};

// MindInsight flags a pipeline whose queue is empty in more than 30 % of samples.
inline constexpr double kEmptyQueueWarning = 0.30;

struct QueueStats {
  std::uint32_t track = 0;
  int rank = 0;
  std::string name;
  std::int64_t samples = 0;
  std::int64_t empty_samples = 0;
  double empty_ratio = 0.0;  // empty samples / all samples
  bool flagged = false;      // empty_ratio > kEmptyQueueWarning
  std::int64_t pushes = 0;   // samples where the depth rose
  std::int64_t pops = 0;     // samples where it fell
  double producer_per_s = 0.0;  // pushes over the sampled span
  double consumer_per_s = 0.0;  // pops over the sampled span
  std::vector<Spell> longest_spells;  // from a sample at depth 0 to the next sample above 0
};

struct Starvation {
  std::vector<InputBoundStats> per_rank;
  InputBoundStats overall;
  std::vector<QueueStats> queues;
  std::vector<Spell> longest_spells;  // over all queues
  int workers = 0;                    // data workers feeding each rank's queue
  double demand_per_s = 0.0;          // batches/s the consumer would take if it never waited
  double per_worker_per_s = 0.0;      // batches/s one worker produces
  int workers_needed = 0;             // ceil(demand / per_worker), 0 when unknown
  // What one image costs a worker, from the per-sample stage ranges on the data-worker tracks (read,
  // decode, resize, ...): mean ns per image by stage, the costliest first, and their sum.
  std::vector<std::pair<std::string, double>> per_image_stages;
  double per_image_ns = 0.0;
};

// Depth-0 spells of one counter series (ordered by time); a spell still open at the end closes at the
// last sample.
std::vector<Spell> empty_spells(const std::vector<store::CounterRow>& samples);
Starvation starvation(const RunData& run, std::size_t top_spells = 5);

}  // namespace wb::analysis
