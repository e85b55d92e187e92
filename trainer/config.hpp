// wb-train's configuration: defaults, then a --config JSON file, then command-line flags (each layer
// overrides the one before). The resolved config is stored in the run file (meta.config_json), so the
// PyTorch baseline and the app see exactly what ran.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "allreduce/split_points.hpp"
#include "store/one_line.hpp"

namespace wb::trainer {

// Bad flags, bad JSON, bad values: the message is one line naming the flag or file.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(store::one_line(what)) {}
};

struct TrainConfig {
  // data
  std::string data = "synthetic";  // synthetic | cifar10 | fashion-mnist | imagefolder
  std::string data_path;           // dataset folder; default depends on `data`
  std::string val_path;            // imagefolder: the validation folder --eval reads
  std::string transforms = "seed-train";  // imagefolder training recipe (data/image_folder.hpp)
  bool skip_bad_images = false;    // imagefolder: count and skip bad images instead of stopping
  int data_workers = 2;
  int prefetch = 4;
  int crop_padding = 4;     // training augmentation: RandomCrop(side, padding); 0 disables it
  bool random_flip = true;  // training augmentation: RandomHorizontalFlip(0.5)
  int64_t data_delay_us = 0;  // artificial per-sample delay in the workers (starvation experiments)
  std::string slow_rank;      // "R:MODULE:US": rank R sleeps US us in MODULE's forward each step (straggler experiments)
  std::string slow_step;      // "S:US": every rank sleeps US us at the end of step S (triggered-capture experiments)
  int64_t synthetic_samples = 2048;
  // model
  int num_classes = 10;
  int image_size = 32;
  int batch_size = 32;
  // schedule
  int64_t steps = 0;   // 0: use epochs
  int64_t epochs = 1;  // used when steps == 0
  // optimizer
  double lr = 0.01;
  std::string lr_schedule = "constant";  // constant | step | cosine
  double lr_init = 0.0;                   // cosine: warmup start
  double lr_end = 0.0;                    // cosine: final
  double lr_max = 0.0;                    // cosine: peak (0: use lr)
  int64_t warmup_steps = 0;
  int64_t lr_step_size = 0;  // step schedule: decay every N steps
  double lr_gamma = 0.1;
  bool scale_lr = false;  // lr *= world size
  double momentum = 0.9;
  double weight_decay = 1e-4;
  bool nesterov = false;
  double label_smoothing = 0.1;
  std::string loss_convention = "mindspore";  // mindspore (CrossEntropySmooth) | torch
  // run
  uint64_t seed = 1;
  int threads = 0;  // 0: cores / ranks
  std::string device = "cpu";     // cpu | cuda | auto (auto: cuda when a device is visible, else cpu)
  std::string precision = "fp32";  // fp32 | tf32 | bf16; tf32 and bf16 need cuda (the CPU backend is fp32)
  bool channels_last = false;      // cuda: NHWC activations inside the backend
  int device_prefetch = 2;         // cuda: device batch buffers filled ahead on a copy stream
  int ranks_per_gpu = 1;           // cuda: local ranks sharing one device (local rank r uses device r / N)
  bool nvtx = false;               // cuda: NVTX ranges named like our ops, for Nsight Systems
  bool reference_kernels = false;  // cpu: oneDNN's reference kernels (another summation order; slow)
  std::filesystem::path run;  // RUN.sqlite; empty: runs/<timestamp>.sqlite
  bool profile = true;
  // Triggered capture (profiler/record/capture.hpp): "" records every step's events; slow:K, signal or
  // steps:A-B keep only the windows they trigger (the step table stays whole). capture_window: N.
  std::string capture;
  int64_t capture_window = 5;
  bool memory_profile = true;  // record every backend allocation and free (memory table); --no-memory-profile
  int64_t dump_step = -1;  // -1: none
  bool dump_all_ranks = false;
  // --dump-ranks LIST: the ranks that dump, comma-separated ("0,3"); "all" sets dump_all_ranks instead.
  std::string dump_ranks = "0";
  // Whether `rank` dumps the --dump-step step.
  bool dumps_on(int rank) const;
  // --dump-kinds: the tensor kinds a dump keeps, comma-separated (dump::kDumpKinds); "all" keeps every one.
  std::string dump_kinds = "all";
  // --allreduce-split "85,160" (or "none": one bucket), parsed by allreduce::SplitPoints::parse. In JSON:
  // an array of points ([85, 160]), "none", or the text form; null, or [] as recorded by earlier builds,
  // means not given. Not given: size-based buckets (--bucket-mb, default 25 MB).
  std::optional<allreduce::SplitPoints> allreduce_split;
  double bucket_mb = 0.0;  // 0 with no split: default 25 MB buckets
  bool calibrate_comm = true;  // multi-rank data parallel: the communicator's calibration before step 0
  int nproc = 0;           // >0: relaunch under mpirun with N ranks
  bool eval = false;
  std::filesystem::path save;
  std::filesystem::path resume;  // --steps/--epochs stay the schedule's total: training goes on from the saved step
  // SyncBatchNorm: off | local (the ranks of one host) | global (every rank): batch statistics of each
  // batch norm over that group's batches.
  std::string sync_bn = "off";
  // The sharded classifier: fc.weight and fc.bias split on the output dimension over groups of N
  // consecutive ranks (trainer/fc_shard.hpp); 1: off. N divides num_classes and the world.
  int shard_fc = 1;
  bool check_sync = false;       // after every step, check the parameters are bit-identical on every rank
  double watchdog_s = 30.0;      // abort a job whose allreduce has not completed after this long; 0: never
  // A NaN or Inf loss on any rank: "stop" ends the run after that step (exit 1), "skip" drops that
  // step's update (parameters, momentum and batch-norm statistics stay as before it) and goes on.
  std::string on_nonfinite = "stop";
  bool check_finite = false;  // check every activation, so a non-finite loss names the first bad tensor
  // Testing aid (not in --help): a NaN in rank 0's input batch of this step (-1: none; CPU batches).
  int64_t poison_step = -1;
  // Testing and diagnosis aid (not in --help): "R/N" makes a single process train on the data shard that
  // rank R of an N-rank job would get, so its gradients can be set beside one rank of a distributed run.
  std::string shard;
  // Diagnosis aid (not in --help): caps the profiler's event buffers at N events in all (0: the default
  // pool), so a run that outgrows them shows its dropped events counted in the run file and `wb report`.
  int64_t profile_buffer_events = 0;
  // pipeline parallelism (trainer/pipeline_step.hpp): S stages of M micro-batches each step
  int pipeline_stages = 1;
  int micro_batches = 1;
  std::string stage_split;                 // "layer3" or "layer2,layer3.2,...": where stages 1.. begin
  std::string pipeline_schedule = "gpipe";  // gpipe | 1f1b
  std::string pipeline_loss = "sum";        // sum (the seed's PipelineCell) | mean of the micro-batch losses
  int log_every = 0;  // 0: automatic
  std::string config_file;

  nlohmann::json to_json() const;
  // Total number of steps given the number of batches per epoch.
  int64_t total_steps(int64_t steps_per_epoch) const {
    return steps > 0 ? steps : epochs * steps_per_epoch;
  }
};

// The data shard of --shard "R/N" (rank R of N). A process without --shard is shard 0 of 1.
struct Shard {
  int rank = 0;
  int count = 1;
};
// Parses --shard's value; throws ConfigError naming the flag unless it is "R/N" with 0 <= R < N.
Shard parse_shard(const std::string& text);

// --slow-rank "R:MODULE:US": rank R sleeps US microseconds at the end of MODULE's forward in every
// step, a planted straggler whose cause (that op) the analyses must find. "all:MODULE:US": every rank
// does, a planted slow layer (what `wb whatif` predicts).
struct SlowRank {
  static constexpr int kAll = -2;
  int rank = -1;
  std::string module;
  std::int64_t us = 0;
};
// Throws ConfigError naming the flag unless the text is R:MODULE:US with R >= 0 (or all) and US > 0 (the module
// name is checked against the model where it is used).
SlowRank parse_slow_rank(const std::string& text);

// --slow-step "S:US": every rank sleeps US microseconds at the end of step S, a planted slow step for
// triggered capture to find.
struct SlowStep {
  std::int64_t step = -1;
  std::int64_t us = 0;
};
// Throws ConfigError naming the flag unless the text is S:US with S >= 0 and US > 0.
SlowStep parse_slow_step(const std::string& text);

// Applies a JSON object (keys as in to_json) onto cfg; unknown keys are errors naming the file.
void apply_json(TrainConfig& cfg, const nlohmann::json& j, const std::string& origin);
// Parses argv (after the program name). Throws ConfigError. Sets *help when --help was given.
TrainConfig parse_args(const std::vector<std::string>& args, bool* help);
// Checks ranges and combinations (batch > 0, image size 32..224, ...). Throws ConfigError.
void validate(const TrainConfig& cfg);
std::string usage();

}  // namespace wb::trainer
