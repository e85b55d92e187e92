// The phases that set a rank's training job up, before the first step (train.cpp runs the steps and the
// end): what it records, what it trains, how its gradients cross ranks, and its input. Only train.cpp
// and job_setup.cpp include this.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "profiler/record/capture.hpp"
#include "profiler/record/clock_sync.hpp"
#include "profiler/record/recorder.hpp"
#include "store/writer.hpp"
#include "trainer/batch_source.hpp"
#include "trainer/config.hpp"
#include "trainer/data/dataset.hpp"
#include "trainer/data/pipeline.hpp"
#include "trainer/fc_shard.hpp"
#include "trainer/gpu_trace.hpp"
#include "trainer/memory_profile.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/observers.hpp"
#include "trainer/optim/lr_schedule.hpp"
#include "trainer/optim/sgd.hpp"
#include "trainer/parallel/buckets.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/heartbeat.hpp"
#include "trainer/placement.hpp"

namespace wb::trainer {

// ---- what this rank records -------------------------------------------------------------------------

struct Recording {
  std::filesystem::path run;      // the job's run file (merged from the rank files when there are several ranks)
  std::filesystem::path run_dir;  // the rank files, when there are several ranks
  std::unique_ptr<store::Writer> writer;
  store::RankRow rank_row;
  profiler::ClockSync clock_start;
  std::unique_ptr<profiler::Capture> capture;    // --capture: outlives the recorder, which feeds it
  std::unique_ptr<profiler::Recorder> recorder;  // null with --no-profile
  std::unique_ptr<GpuTrace> gpu_trace;           // null on the CPU, or when CUPTI refused
  std::unique_ptr<MemoryProfile> memory;         // null with --no-memory-profile or --no-profile
};


// The run file (Writer), the profiler (Recorder; CUPTI on GPUs), the memory profile, the clock offset to
// rank 0.
Recording open_recording(const TrainConfig& cfg, Placement& place);
// Clock offset of this rank to rank 0 (0 for a single process).
profiler::ClockSync measure_offset(parallel::Communicator& comm);

// ---- what it trains ---------------------------------------------------------------------------------

struct Learner {
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<model::ResNet50> model;
  std::unique_ptr<optim::Sgd> sgd;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::int64_t start_step = 0;  // steps a resumed checkpoint has behind it
};


// Backend, ResNet-50, SGD, LR schedule; resume; parameters broadcast from rank 0.
Learner make_learner(const TrainConfig& cfg, Placement& place, std::int64_t total_steps, ShardedClassifier* fc_shard);
// The parameters every rank holds alike (all but a sharded classifier's slices), as a count of floats.
std::size_t replicated_params(const model::ResNet50& m);

// ---- gradients across ranks -------------------------------------------------------------------------

struct Gradients {
  std::vector<parallel::Bucket> buckets;
  std::unique_ptr<parallel::Heartbeat> heartbeat;  // this rank's, next to the rank files (several ranks)
  std::unique_ptr<parallel::GradientSync> sync;    // null for a single rank
};


// Allreduce buckets and GradientSync (allreduce overlapped with backward); writes the param rows.
Gradients make_gradients(const TrainConfig& cfg, Placement& place, Learner& learner, Recording& rec,
                         const std::string& banner);

// ---- the input --------------------------------------------------------------------------------------

struct Input {
  data::Dataset train_set;
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
  std::unique_ptr<DataObserver> observer;  // the host queue's
  std::unique_ptr<data::Pipeline> pipeline;
  std::unique_ptr<BatchSource> source;  // destroyed before the pipeline it reads
};


// The data set and the length of the run; the workers start later (start_input).
Input open_input(const TrainConfig& cfg, const Placement& place, const std::filesystem::path& run);
// The data pipeline, and on a GPU the device prefetch queue: a BatchSource.
void start_input(const TrainConfig& cfg, const Placement& place, Input& in, Learner& learner, Recording& rec);

}  // namespace wb::trainer
