// A synthetic run file of a chosen size for benchmarks and tests of the app: per rank a main thread of
// steps holding nested forward/backward/optimizer ranges, a data worker, a batch queue with its depth,
// allreduce buckets and step records, written with store::Writer per rank and merged into one file.
#pragma once

#include <cstdint>
#include <filesystem>

namespace wb::app_model {

struct SyntheticRun {
  int ranks = 2;
  int steps = 4;
  std::int64_t ranges_per_rank = 2000;  // host ranges on each rank's threads, approximately
  int params = 16;
  int prefetch = 4;
};

// Writes the run to `out` (replaced) through a scratch directory next to it; returns the number of host
// ranges written. Throws store::StoreError when the files cannot be written.
std::int64_t write_synthetic_run(const std::filesystem::path& out, const SyntheticRun& spec);

}  // namespace wb::app_model
