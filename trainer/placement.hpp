// Where one rank of wb-train stands: its place in the job (from the launcher), the device it computes
// on, the communicators it talks through, its data shard and its threads. The first phase of the job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trainer/config.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/launch.hpp"

namespace wb::trainer {

// The CPU, or the CUDA device of the rank's local rank (one process per GPU).
struct DeviceChoice {
  bool cuda = false;
  int index = 0;
  bool shared = false;      // --ranks-per-gpu > 1: other local ranks use the same device
  std::string name;         // the GPU's name
  std::int64_t memory_bytes = 0;  // the GPU's memory (totalGlobalMem), 0 on the CPU
  int compute_major = 0;          // the GPU's compute capability major, 0 on the CPU
  std::string description;  // rank row and start-up line: "cpu", "cuda:0 (NVIDIA H100 80GB HBM3, bf16)"
};

// The collectives of one rank: `host` (self or MPI) for bookkeeping, clock sync and barriers, and on
// GPUs with several ranks `device` (NCCL over the same MPI job) for parameters and gradients.
struct Communicators {
  std::unique_ptr<parallel::Communicator> host;
  std::unique_ptr<parallel::Communicator> device;  // destroyed first: it holds a reference to `host`
  parallel::Communicator& main() { return device ? *device : *host; }
};

struct Placement {
  parallel::LaunchInfo launch;
  DeviceChoice device;
  Communicators comms;
  int rank = 0;
  int world = 1;
  Shard shard;      // the data shard this rank reads: its own, or the one --shard names
  int threads = 0;  // CPU threads (cfg.threads, or the host's cores shared among its ranks)
};

// Throws ConfigError for a device, shard or world size this build or machine cannot serve.
Placement place_rank(const TrainConfig& cfg);

}  // namespace wb::trainer
