// Allreduce analyses: per-bucket ready-to-start latency and duration, per-step communication,
// overlapped and exposed time (PyTorch DDP logger's definitions), and an alpha-beta fit of the spans.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct BucketStats {
  int bucket = 0;
  int first_param = 0;
  int last_param = 0;
  std::int64_t bytes = 0;
  int samples = 0;                  // rows over steps and ranks
  double mean_latency_ns = 0.0;     // start - ready: how long a ready bucket waited for the stream
  std::int64_t max_latency_ns = 0;
  double mean_duration_ns = 0.0;    // end - start
  std::int64_t max_duration_ns = 0;
};

// DDP logger (c10d/logger.cpp): comm = last end - first start; overlap = backward compute end - first
// start (clamped to [0, comm]); exposed = comm - overlap.
struct StepComm {
  int rank = 0;
  int step = 0;
  int buckets = 0;
  std::int64_t bytes = 0;
  std::int64_t comm_start_ns = 0;
  std::int64_t comm_end_ns = 0;
  std::int64_t compute_end_ns = 0;  // end of backward compute
  std::int64_t comm_ns = 0;
  std::int64_t overlap_ns = 0;
  std::int64_t exposed_ns = 0;
};

// t = alpha + beta * bytes by least squares.
struct AlphaBeta {
  double alpha_ns = 0.0;
  double beta_ns_per_byte = 0.0;
  double r2 = 0.0;
  int samples = 0;
  bool valid = false;  // false when fewer than two distinct sizes were seen
  double predict(double bytes) const { return alpha_ns + beta_ns_per_byte * bytes; }
};

std::vector<BucketStats> bucket_stats(std::span<const store::AllreduceRow> rows);
// One step's rows (same rank and step) against the end of its backward compute.
StepComm step_comm(std::span<const store::AllreduceRow> rows, std::int64_t compute_end_ns);
// Every (rank, step) of the run. The backward compute end is the last end of a backward range on the
// rank's main track within the step, else the latest ready time of the step's buckets.
std::vector<StepComm> step_comms(const RunData& run);

AlphaBeta fit_alpha_beta(std::span<const std::pair<double, double>> bytes_and_ns);
AlphaBeta fit_alpha_beta(std::span<const store::AllreduceRow> rows);

// The backward compute end of (rank, step) as step_comms defines it; nullopt-like -1 when unknown.
std::int64_t backward_end(const RunData& run, int rank, int step);

}  // namespace wb::analysis
