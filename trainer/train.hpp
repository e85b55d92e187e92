// The training job of one rank: set up the run file, the profiler, the data pipeline, the model, the
// gradient buckets and the optimizer, run the steps, and leave a complete run file behind.
#pragma once

#include <filesystem>

#include "trainer/config.hpp"

namespace wb::trainer {

// Runs the job described by cfg on this rank (rank and world size come from the launcher). Returns the
// process exit code: 0 on success, 1 when training stopped on a runtime failure or a signal. Bad input
// throws (ConfigError, data::DataError, ...) for main() to turn into one line and exit code 2.
int run_training(const TrainConfig& cfg);

// --save: throws ConfigError unless it names a file in a folder that exists (checked before training,
// and before a multi-rank launch, so a bad path is one line at the start).
void check_save_path(const std::filesystem::path& save);

}  // namespace wb::trainer
