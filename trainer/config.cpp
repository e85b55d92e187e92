// Table-driven options: one entry per setting gives its flag (--batch-size), its JSON key (batch_size),
// its type and its help line, so flags, --config files and the recorded config never drift apart.
#include "trainer/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <variant>

#include "profiler/record/capture.hpp"
#include "profiler/record/recorder.hpp"
#include "trainer/dump/dump.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/pipeline_plan.hpp"

namespace wb::trainer {
namespace {

using Field = std::variant<int TrainConfig::*, int64_t TrainConfig::*, uint64_t TrainConfig::*,
                           double TrainConfig::*, bool TrainConfig::*, std::string TrainConfig::*,
                           std::filesystem::path TrainConfig::*, std::optional<allreduce::SplitPoints> TrainConfig::*>;

struct Option {
  const char* key;  // JSON key; the flag is "--" + key with '_' -> '-'
  Field field;
  const char* help;
};

// Accepted but left out of --help: testing and diagnosis aids (documented in config.hpp).
bool is_hidden(std::string_view key) {
  return key == "shard" || key == "profile_buffer_events" || key == "poison_step";
}

const Option kOptions[] = {
    {"config_file", &TrainConfig::config_file, "F.json: read settings from a JSON file (flags override it)"},
    {"data", &TrainConfig::data, "synthetic|cifar10|fashion-mnist|imagefolder (default synthetic)"},
    {"data_path", &TrainConfig::data_path, "dataset folder (cifar-10-batches-bin, the Fashion-MNIST .gz folder, or ROOT/CLASS/IMAGE)"},
    {"val_path", &TrainConfig::val_path, "imagefolder: ROOT/CLASS/IMAGE folder --eval reads (eval transforms)"},
    {"transforms", &TrainConfig::transforms, "imagefolder training: seed-train|torchvision-train|torchvision-eval (default seed-train)"},
    {"skip_bad_images", &TrainConfig::skip_bad_images, "imagefolder: count and skip corrupt or unreadable images instead of stopping"},
    {"data_workers", &TrainConfig::data_workers, "N: worker threads assembling batches (default 2)"},
    {"prefetch", &TrainConfig::prefetch, "N: capacity of the ready-batch queue (default 4)"},
    {"data_delay_us", &TrainConfig::data_delay_us, "US: artificial per-sample delay in the workers (starvation experiments)"},
    {"slow_rank", &TrainConfig::slow_rank, "R:MODULE:US: rank R (or every rank: all) sleeps US us at the end of MODULE's forward each step (straggler experiments)"},
    {"slow_step", &TrainConfig::slow_step, "S:US: every rank sleeps US us at the end of step S (a planted slow step, for --capture)"},
    {"synthetic_samples", &TrainConfig::synthetic_samples, "N: size of the synthetic data set (default 2048)"},
    {"num_classes", &TrainConfig::num_classes, "N: classes (default 10)"},
    {"image_size", &TrainConfig::image_size, "N: input size, 32..224 (default 32)"},
    {"batch_size", &TrainConfig::batch_size, "N: images per rank and step (default 32)"},
    {"steps", &TrainConfig::steps, "N: train N steps (overrides --epochs)"},
    {"epochs", &TrainConfig::epochs, "N: train N epochs (default 1)"},
    {"lr", &TrainConfig::lr, "X: learning rate (default 0.01)"},
    {"lr_schedule", &TrainConfig::lr_schedule, "constant|step|cosine (cosine: linear warmup, then the seed guide's cosine)"},
    {"lr_init", &TrainConfig::lr_init, "X: cosine schedule's warmup start"},
    {"lr_end", &TrainConfig::lr_end, "X: cosine schedule's final learning rate"},
    {"lr_max", &TrainConfig::lr_max, "X: cosine schedule's peak (default --lr)"},
    {"warmup_steps", &TrainConfig::warmup_steps, "N: cosine schedule's warmup steps"},
    {"lr_step_size", &TrainConfig::lr_step_size, "N: step schedule: multiply by --lr-gamma every N steps"},
    {"lr_gamma", &TrainConfig::lr_gamma, "X: step schedule's factor (default 0.1)"},
    {"scale_lr", &TrainConfig::scale_lr, "scale the learning rate by the world size"},
    {"momentum", &TrainConfig::momentum, "X: SGD momentum (default 0.9)"},
    {"weight_decay", &TrainConfig::weight_decay, "X: weight decay on conv/fc weights (default 1e-4)"},
    {"nesterov", &TrainConfig::nesterov, "Nesterov momentum"},
    {"label_smoothing", &TrainConfig::label_smoothing, "X: label smoothing (default 0.1)"},
    {"loss_convention", &TrainConfig::loss_convention, "mindspore|torch: how smoothing spreads mass (default mindspore)"},
    {"crop_padding", &TrainConfig::crop_padding, "N: RandomCrop's zero padding in training, 0 = no random crop (default 4)"},
    {"random_flip", &TrainConfig::random_flip, "RandomHorizontalFlip in training (default on; --no-random-flip turns it off)"},
    {"seed", &TrainConfig::seed, "N: seed for init, shuffling and augmentation (default 1)"},
    {"threads", &TrainConfig::threads, "N: compute threads per rank (default cores / ranks)"},
    {"device", &TrainConfig::device, "cpu|cuda|auto: one process per device; auto takes a GPU when one is visible (default cpu)"},
    {"precision", &TrainConfig::precision, "fp32|tf32|bf16: conv/linear arithmetic on cuda; cpu computes fp32 only (default fp32)"},
    {"channels_last", &TrainConfig::channels_last, "NHWC activations inside the CUDA backend (cuDNN's fast layout for tf32/bf16)"},
    {"device_prefetch", &TrainConfig::device_prefetch, "N: batches copied ahead into device memory on a copy stream (cuda; default 2)"},
    {"ranks_per_gpu", &TrainConfig::ranks_per_gpu, "N: ranks sharing each GPU (cuda; default 1). N > 1 runs a multi-rank NCCL job on fewer GPUs, each rank its own NCCL host"},
    {"nvtx", &TrainConfig::nvtx, "also emit NVTX ranges named like our ops, for Nsight Systems (cuda, with profiling)"},
    {"reference_kernels", &TrainConfig::reference_kernels, "CPU: oneDNN's reference kernels (plain loops) instead of its fastest: the same step summed in another order, many times slower (wb estimate-noise --isa ref)"},
    {"run", &TrainConfig::run, "OUT.sqlite: the run file to write (default runs/<time>.sqlite)"},
    {"profile", &TrainConfig::profile, "record per-op ranges (default on; --no-profile turns it off)"},
    {"capture", &TrainConfig::capture, "slow:K|signal|steps:A-B: keep only some steps' events (the step table stays whole): steps over K x the running median with --capture-window steps each side; the next window after a SIGUSR1; steps A..B (default: every step)"},
    {"capture_window", &TrainConfig::capture_window, "N: steps kept each side of a slow step, or after a SIGUSR1 (default 5)"},
    {"memory_profile", &TrainConfig::memory_profile, "record every tensor allocation and free with its role and layer (default on with profiling; --no-memory-profile turns it off)"},
    {"dump_step", &TrainConfig::dump_step, "N: dump every tensor of step N into the run file"},
    {"dump_all_ranks", &TrainConfig::dump_all_ranks, "dump on every rank, not only rank 0 (also --dump-ranks all)"},
    {"dump_ranks", &TrainConfig::dump_ranks, "all|LIST: the ranks that dump, separated by commas (default 0)"},
    {"dump_kinds", &TrainConfig::dump_kinds, "LIST|all: the kinds a dump keeps, comma-separated from input, label, param, buffer, act, loss, grad, param_after, buffer_after, momentum (default all; a smaller file, and wb compare judges what is there)"},
    {"allreduce_split", &TrainConfig::allreduce_split, "a,b,...|none: allreduce split points, ascending parameter indices (all_reduce_fusion_config); none: one bucket"},
    {"calibrate_comm", &TrainConfig::calibrate_comm, "before step 0, time one allreduce per message size and the compute's slowdown while one runs, for wb suggest-split and wb tune-split (default on in multi-rank data-parallel runs; --no-calibrate-comm turns it off)"},
    {"bucket_mb", &TrainConfig::bucket_mb, "X: size-based allreduce buckets of X MB (default 25)"},
    {"nproc", &TrainConfig::nproc, "N: relaunch under mpirun with N ranks on this host"},
    {"eval", &TrainConfig::eval, "report top-1/top-5 accuracy on the test split after training"},
    {"save", &TrainConfig::save, "F.safetensors: save a checkpoint (torchvision names) at the end"},
    {"resume", &TrainConfig::resume, "F.safetensors: go on from a checkpoint (--steps stays the total count)"},
    {"sync_bn", &TrainConfig::sync_bn, "off|local|global: SyncBatchNorm, batch statistics over this host's ranks or all ranks (default off)"},
    {"shard_fc", &TrainConfig::shard_fc, "N: the classifier (fc) split on its classes over groups of N ranks, parallel cross-entropy (CPU; default 1: off)"},
    {"check_sync", &TrainConfig::check_sync, "after every step, fail unless parameters are bit-identical on all ranks (--shard-fc slices excepted)"},
    {"watchdog_s", &TrainConfig::watchdog_s, "S: abort the job when an allreduce has not completed after S seconds, naming the rank whose heartbeat stopped (default 30; 0: never)"},
    {"on_nonfinite", &TrainConfig::on_nonfinite, "stop|skip: a NaN/Inf loss stops the run (default), or skips that step's update"},
    {"check_finite", &TrainConfig::check_finite, "check every activation for NaN/Inf, so a non-finite loss names the first tensor it appeared in"},
    {"poison_step", &TrainConfig::poison_step, "N: put a NaN into rank 0's input batch of step N (testing aid)"},
    {"shard", &TrainConfig::shard, "R/N: one process trains on rank R's data shard of an N-rank job"},
    {"profile_buffer_events", &TrainConfig::profile_buffer_events, "N: cap the profiler's event buffers at N events"},
    {"pipeline_stages", &TrainConfig::pipeline_stages, "S: pipeline-parallel stages (world = S x data-parallel replicas; default 1)"},
    {"micro_batches", &TrainConfig::micro_batches, "M: micro-batches per step and stage (batch divisible by M, M >= S)"},
    {"stage_split", &TrainConfig::stage_split, "U,...: the units where stages 1.. begin (layer3, layer3.2, fc; default: equal layer counts, layer3 for S=2)"},
    {"pipeline_schedule", &TrainConfig::pipeline_schedule, "gpipe|1f1b: all forwards then all backwards, or one forward one backward (default gpipe)"},
    {"pipeline_loss", &TrainConfig::pipeline_loss, "sum|mean: the step's loss over micro-batches (default sum, the seed's PipelineCell)"},
    {"log_every", &TrainConfig::log_every, "N: progress line every N steps (default: automatic)"},
};

std::string flag_of(const char* key) {
  std::string f = "--";
  for (const char* c = key; *c; ++c) f += (*c == '_') ? '-' : *c;
  return f;
}

template <class T>
T parse_number(const std::string& text, const std::string& what) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    throw ConfigError(what + ": expected a number, got '" + text + "'");
  }
  return value;
}

// --allreduce-split's text (or a JSON string): allreduce::SplitPoints::parse, its errors as ConfigError.
allreduce::SplitPoints parse_split(const std::string& text, const std::string& what) {
  try {
    return allreduce::SplitPoints::parse(text, what);
  } catch (const allreduce::SplitError& e) {
    throw ConfigError(e.what());
  }
}

// allreduce_split in JSON: an array of points, a string in the flag's text form, or null (not given).
// [] is what earlier builds recorded for "not given" and still means that; "none" is the single bucket.
std::optional<allreduce::SplitPoints> split_from_json(const nlohmann::json& v, const std::string& what) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return parse_split(v.get<std::string>(), what);
  const std::string expected = "expected split points such as [85, 160], \"none\" for one bucket, or null for size-based buckets";
  if (!v.is_array()) throw ConfigError(what + ": " + expected + ", got " + v.dump());
  if (v.empty()) return std::nullopt;
  std::vector<int> points;
  for (const auto& item : v) {
    if (!item.is_number_integer()) throw ConfigError(what + ": " + item.dump() + " is not a whole number; " + expected);
    if (std::abs(item.get<double>()) > std::numeric_limits<int>::max())
      throw ConfigError(what + ": " + item.dump() + " is too large; " + expected);
    points.push_back(item.get<int>());
  }
  try {
    return allreduce::SplitPoints::from_points(std::move(points), what);
  } catch (const allreduce::SplitError& e) {
    throw ConfigError(e.what());
  }
}

// The JSON that split_from_json reads back: null, "none" or the array of points.
nlohmann::json split_to_json(const std::optional<allreduce::SplitPoints>& split) {
  if (!split) return nullptr;
  if (split->is_single_bucket()) return split->to_string();
  return split->points();
}

// Sets a field from text (a flag's value).
void set_from_text(TrainConfig& cfg, const Field& field, const std::string& text, const std::string& what) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(cfg.*member)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (text == "1" || text == "true" || text == "on") cfg.*member = true;
          else if (text == "0" || text == "false" || text == "off") cfg.*member = false;
          else throw ConfigError(what + ": expected true or false, got '" + text + "'");
        } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::filesystem::path>) {
          cfg.*member = text;
        } else if constexpr (std::is_same_v<T, std::optional<allreduce::SplitPoints>>) {
          cfg.*member = parse_split(text, what);
        } else {
          cfg.*member = parse_number<T>(text, what);
        }
      },
      field);
}

void set_from_json(TrainConfig& cfg, const Field& field, const nlohmann::json& v, const std::string& what) {
  try {
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(cfg.*member)>;
          if constexpr (std::is_same_v<T, std::filesystem::path>) {
            cfg.*member = v.get<std::string>();
          } else if constexpr (std::is_same_v<T, std::optional<allreduce::SplitPoints>>) {
            cfg.*member = split_from_json(v, what);
          } else if constexpr (std::is_same_v<T, bool>) {
            if (!v.is_boolean()) throw ConfigError(what + ": expected true or false");
            cfg.*member = v.get<bool>();
          } else if constexpr (std::is_same_v<T, std::string>) {
            cfg.*member = v.get<std::string>();
          } else {
            if (!v.is_number()) throw ConfigError(what + ": expected a number");
            if constexpr (std::is_integral_v<T>) {
              if (!v.is_number_integer() && !v.is_number_unsigned())
                throw ConfigError(what + ": expected an integer");
            }
            cfg.*member = v.get<T>();
          }
        },
        field);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(what + ": wrong type (" + std::string(e.what()) + ")");
  }
}

const Option* find_key(std::string_view key) {
  for (const Option& o : kOptions)
    if (key == o.key) return &o;
  return nullptr;
}

const Option* find_flag(std::string_view flag) {
  for (const Option& o : kOptions)
    if (flag == flag_of(o.key)) return &o;
  return nullptr;
}

bool is_bool(const Option& o) { return std::holds_alternative<bool TrainConfig::*>(o.field); }

}  // namespace

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const Option& o : kOptions) {
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(this->*member)>;
          if constexpr (std::is_same_v<T, std::filesystem::path>) j[o.key] = (this->*member).string();
          else if constexpr (std::is_same_v<std::remove_cv_t<T>, std::optional<allreduce::SplitPoints>>) j[o.key] = split_to_json(this->*member);
          else j[o.key] = this->*member;
        },
        o.field);
  }
  return j;
}

void apply_json(TrainConfig& cfg, const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) throw ConfigError(origin + ": expected a JSON object of settings");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().starts_with("_")) continue;  // comments: "_about": "..."
    const Option* o = find_key(it.key());
    if (!o || it.key() == "config_file") throw ConfigError(origin + ": unknown setting '" + it.key() + "'");
    set_from_json(cfg, o->field, it.value(), origin + ": " + it.key());
  }
}

TrainConfig parse_args(const std::vector<std::string>& args, bool* help) {
  TrainConfig cfg;
  if (help) *help = false;
  // The config file first, wherever --config appears, so flags override it.
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" || args[i].starts_with("--config=")) {
      std::string path = args[i] == "--config" ? (i + 1 < args.size() ? args[i + 1] : "") : args[i].substr(9);
      if (path.empty()) throw ConfigError("--config: expected a JSON file");
      std::ifstream in(path);
      if (!in) throw ConfigError("--config " + path + ": cannot open the file");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
        throw ConfigError("--config " + path + ": not valid JSON (" + std::string(e.what()) + ")");
      }
      apply_json(cfg, j, path);
      cfg.config_file = path;
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--help" || a == "-h") {
      if (help) *help = true;
      continue;
    }
    std::string value;
    bool has_value = false;
    if (auto eq = a.find('='); a.starts_with("--") && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    if (a == "--config") {
      if (!has_value) ++i;
      continue;
    }
    if (a == "--no-profile") { cfg.profile = false; continue; }
    if (a == "--no-memory-profile") { cfg.memory_profile = false; continue; }
    if (a == "--no-random-flip") { cfg.random_flip = false; continue; }
    if (a == "--no-calibrate-comm") { cfg.calibrate_comm = false; continue; }
    if (a == "--dump-ranks") {
      if (!has_value) {
        if (i + 1 >= args.size()) throw ConfigError("--dump-ranks: expected 'all' or ranks separated by commas");
        value = args[++i];
      }
      cfg.dump_all_ranks = value == "all";
      if (!cfg.dump_all_ranks) cfg.dump_ranks = value;  // checked in validate: ranks separated by commas
      continue;
    }
    const Option* o = a.starts_with("--") ? find_flag(a) : nullptr;
    if (!o || std::string_view(o->key) == "config_file") {
      throw ConfigError("unknown argument '" + args[i] + "' (see wb-train --help)");
    }
    if (is_bool(*o) && !has_value) {
      cfg.*std::get<bool TrainConfig::*>(o->field) = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) throw ConfigError(a + ": expected a value");
      value = args[++i];
    }
    set_from_text(cfg, o->field, value, a);
  }
  return cfg;
}

Shard parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  const std::string what = "--shard '" + text + "'";
  if (slash == std::string::npos) throw ConfigError(what + ": expected R/N (rank R of N ranks), e.g. 0/2");
  Shard s;
  s.rank = parse_number<int>(text.substr(0, slash), what + ": rank");
  s.count = parse_number<int>(text.substr(slash + 1), what + ": rank count");
  if (s.count < 1 || s.rank < 0 || s.rank >= s.count) {
    throw ConfigError(what + ": expected 0 <= R < N");
  }
  return s;
}

SlowStep parse_slow_step(const std::string& text) {
  const std::string what = "--slow-step '" + text + "'";
  const auto a = text.find(':');
  if (a == std::string::npos) throw ConfigError(what + ": expected S:US (step, microseconds), e.g. 40:500000");
  SlowStep s;
  s.step = parse_number<std::int64_t>(text.substr(0, a), what + ": step");
  s.us = parse_number<std::int64_t>(text.substr(a + 1), what + ": microseconds");
  if (s.step < 0 || s.us <= 0) throw ConfigError(what + ": expected a step >= 0 (counted from 0) and a positive delay");
  return s;
}

SlowRank parse_slow_rank(const std::string& text) {
  const std::string what = "--slow-rank '" + text + "'";
  const auto a = text.find(':');
  const auto b = text.rfind(':');
  if (a == std::string::npos || b == a || b == a + 1) {
    throw ConfigError(what + ": expected R:MODULE:US (rank, module, microseconds), e.g. 1:layer3.0.conv2:20000");
  }
  SlowRank s;
  s.rank = text.substr(0, a) == "all" ? SlowRank::kAll : parse_number<int>(text.substr(0, a), what + ": rank");
  s.module = text.substr(a + 1, b - a - 1);
  s.us = parse_number<std::int64_t>(text.substr(b + 1), what + ": microseconds");
  if ((s.rank < 0 && s.rank != SlowRank::kAll) || s.us <= 0)
    throw ConfigError(what + ": expected a rank >= 0 (or all) and a positive delay");
  const auto names = model::ResNet50::module_names();
  if (std::find(names.begin(), names.end(), s.module) == names.end()) {
    throw ConfigError(what + ": no module named '" + s.module + "' (torchvision names such as layer3.0.conv2)");
  }
  return s;
}

namespace {
// The ranks of a --dump-ranks list ("0", "1,3"); a ConfigError for anything else.
std::vector<int> dump_rank_list(const std::string& list) {
  std::vector<int> ranks;
  std::size_t at = 0;
  while (at <= list.size()) {
    std::size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(at, end - at);
    int r = -1;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), r);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || r < 0) {
      throw ConfigError("--dump-ranks " + list + ": expected 'all' or ranks (0, 1, ...) separated by commas");
    }
    ranks.push_back(r);
    at = end + 1;
  }
  return ranks;
}
}  // namespace

bool TrainConfig::dumps_on(int rank) const {
  if (dump_all_ranks) return true;
  const std::vector<int> ranks = dump_rank_list(dump_ranks);
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

namespace {
// --shard-fc's own checks and its combinations; the world is checked when it is known (make_fc_shard).
void validate_shard_fc(const TrainConfig& c) {
  const std::string flag = "--shard-fc " + std::to_string(c.shard_fc);
  auto need = [&](bool ok, const std::string& msg) {
    if (!ok) throw ConfigError(flag + ": " + msg);
  };
  need(c.shard_fc >= 1, "expected a number of ranks, at least 1 (1: the classifier whole on every rank)");
  if (c.shard_fc == 1) return;
  need(c.num_classes % c.shard_fc == 0, "does not divide --num-classes " + std::to_string(c.num_classes) +
                                            " (each rank holds an equal slice of the classes)");
  need(c.nproc == 0 || c.nproc % c.shard_fc == 0, "does not divide --nproc " + std::to_string(c.nproc) +
                                                     " (the ranks form groups of " + std::to_string(c.shard_fc) + ")");
  need(c.pipeline_stages <= 1 && c.micro_batches <= 1,
       "not supported with --pipeline-stages/--micro-batches (a stage's classifier would need a shard group of its "
       "own); drop one of them");
  need(!c.eval, "--eval is not supported with a sharded classifier (evaluate a --save checkpoint without --shard-fc)");
  need(c.shard.empty(), "--shard is a single-process aid; a sharded classifier needs its whole group of ranks");
}
}  // namespace

void validate(const TrainConfig& c) {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw ConfigError(msg);
  };
  need(c.data == "synthetic" || c.data == "cifar10" || c.data == "fashion-mnist" || c.data == "imagefolder",
       "--data: expected synthetic, cifar10, fashion-mnist or imagefolder, got '" + c.data + "'");
  need(c.transforms == "seed-train" || c.transforms == "torchvision-train" || c.transforms == "torchvision-eval",
       "--transforms: expected seed-train, torchvision-train or torchvision-eval, got '" + c.transforms + "'");
  need(c.data == "imagefolder" || (c.val_path.empty() && c.transforms == "seed-train" && !c.skip_bad_images),
       "--val-path, --transforms and --skip-bad-images: image folder settings (add --data imagefolder)");
  need(c.data != "imagefolder" || !c.data_path.empty(), "--data imagefolder: give --data-path ROOT (ROOT/CLASS/IMAGE)");
  need(c.data != "imagefolder" || !c.eval || !c.val_path.empty(),
       "--eval with --data imagefolder: give --val-path ROOT (the validation folder, ROOT/CLASS/IMAGE)");
  need(c.batch_size > 0, "--batch-size: expected a positive number");
  need(c.image_size >= 32 && c.image_size <= 224, "--image-size: expected 32..224, got " + std::to_string(c.image_size));
  need(c.num_classes >= 2, "--num-classes: expected at least 2");
  need(c.steps >= 0 && c.epochs >= 0 && (c.steps > 0 || c.epochs > 0), "--steps/--epochs: expected a positive count");
  need(c.data_workers >= 1, "--data-workers: expected at least 1");
  need(c.prefetch >= 1, "--prefetch: expected at least 1");
  need(c.crop_padding >= 0 && c.crop_padding <= 64, "--crop-padding: expected 0..64, got " + std::to_string(c.crop_padding));
  need(c.data_delay_us >= 0, "--data-delay-us: expected a non-negative number");
  if (!c.slow_rank.empty()) parse_slow_rank(c.slow_rank);
  if (!c.slow_step.empty()) parse_slow_step(c.slow_step);
  if (!c.capture.empty() || c.capture_window != 5) {
    try {
      profiler::parse_capture(c.capture.empty() ? "signal" : c.capture, c.capture_window);
    } catch (const profiler::ProfilerError& e) {
      throw ConfigError(e.what());
    }
    need(!c.capture.empty(), "--capture-window: only with --capture slow:K or signal");
    need(c.profile, "--capture " + c.capture + ": the capture keeps the profiler's events (drop --no-profile)");
  }
  need(c.synthetic_samples >= 1, "--synthetic-samples: expected a positive number");
  need(c.lr > 0, "--lr: expected a positive learning rate");
  need(c.lr_schedule == "constant" || c.lr_schedule == "step" || c.lr_schedule == "cosine",
       "--lr-schedule: expected constant, step or cosine, got '" + c.lr_schedule + "'");
  need(c.momentum >= 0 && c.momentum < 1, "--momentum: expected 0 <= m < 1");
  need(c.weight_decay >= 0, "--weight-decay: expected a non-negative number");
  need(c.label_smoothing >= 0 && c.label_smoothing < 1, "--label-smoothing: expected 0 <= s < 1");
  need(c.loss_convention == "mindspore" || c.loss_convention == "torch",
       "--loss-convention: expected mindspore or torch, got '" + c.loss_convention + "'");
  need(c.device == "cpu" || c.device == "cuda" || c.device == "auto",
       "--device: expected cpu, cuda or auto, got '" + c.device + "'");
  need(c.precision == "fp32" || c.precision == "tf32" || c.precision == "bf16",
       "--precision: expected fp32, tf32 or bf16, got '" + c.precision + "'");
  // The oneDNN backend computes in fp32 only; tf32 and bf16 are CUDA arithmetic. (--device auto is
  // checked once the device is known, in run_training.)
  need(c.device != "cpu" || c.precision == "fp32",
       "--precision " + c.precision + ": the CPU backend computes in fp32 only (tf32 and bf16 need --device cuda)");
  need(c.device != "cpu" || !c.channels_last,
       "--channels-last: a CUDA backend layout; the CPU backend chooses its own (drop it or use --device cuda)");
  need(c.device_prefetch >= 1, "--device-prefetch: expected at least 1 device batch buffer");
  need(c.ranks_per_gpu >= 1, "--ranks-per-gpu: expected at least 1 rank per GPU");
  need(c.device != "cpu" || c.ranks_per_gpu == 1, "--ranks-per-gpu: ranks share GPUs only with --device cuda or auto");
  need(c.device != "cpu" || !c.nvtx, "--nvtx: NVTX ranges mark GPU work for Nsight Systems (use --device cuda)");
  need(c.profile || !c.nvtx, "--nvtx: the NVTX ranges come from the profiler's ranges (drop --no-profile)");
  need(c.device == "cpu" || !c.reference_kernels,
       "--reference-kernels: oneDNN's kernels are the CPU backend's (use --device cpu)");
  need(c.threads >= 0, "--threads: expected a non-negative number");
  need(c.dump_step >= -1, "--dump-step " + std::to_string(c.dump_step) +
                              ": expected a step number counted from 0 (or -1 for no dump)");
  for (const int r : dump_rank_list(c.dump_ranks)) {
    need(c.nproc <= 0 || r < c.nproc, "--dump-ranks " + c.dump_ranks + ": rank " + std::to_string(r) +
                                          " is not in the job (ranks 0 to " + std::to_string(c.nproc - 1) + ")");
  }
  if (const std::string bad = dump::unknown_dump_kind(c.dump_kinds); !bad.empty()) {
    throw ConfigError("--dump-kinds " + c.dump_kinds + ": '" + bad + "' is no dump kind (expected all, or some of " +
                      dump::dump_kind_list() + ")");
  }
  need(c.nproc >= 0, "--nproc: expected a non-negative number");
  need(c.bucket_mb >= 0, "--bucket-mb: expected a non-negative number");
  need(c.watchdog_s >= 0 && std::isfinite(c.watchdog_s), "--watchdog-s: expected a non-negative number of seconds (0: no watchdog)");
  need(c.profile_buffer_events >= 0, "--profile-buffer-events: expected a non-negative number of events");
  need(c.sync_bn == "off" || c.sync_bn == "local" || c.sync_bn == "global",
       "--sync-bn: expected off, local or global, got '" + c.sync_bn + "'");
  need(c.on_nonfinite == "stop" || c.on_nonfinite == "skip",
       "--on-nonfinite: expected stop or skip, got '" + c.on_nonfinite + "'");
  need(c.poison_step >= -1, "--poison-step: expected a step number counted from 0 (or -1 for none)");
  need(!c.allreduce_split || c.bucket_mb == 0, "--allreduce-split and --bucket-mb: give one, not both");
  validate_pipeline_flags(c);
  need(c.sync_bn == "off" || c.pipeline_stages <= 1,
       "--sync-bn " + c.sync_bn + " and --pipeline-stages " + std::to_string(c.pipeline_stages) +
           ": SyncBatchNorm is not supported with pipeline stages (each stage's batch norms would need rank "
           "groups of their own); drop one of them");
  validate_shard_fc(c);
  if (!c.shard.empty()) {
    parse_shard(c.shard);
    need(c.nproc <= 1, "--shard: a single-process aid; drop --nproc " + std::to_string(c.nproc));
  }
  // The order was checked when the split was read; the range needs the model's parameter count.
  if (c.allreduce_split && !c.allreduce_split->fits(model::kParamTensors)) {
    try {
      c.allreduce_split->validate(model::kParamTensors);
    } catch (const allreduce::SplitError& e) {
      throw ConfigError(e.what());
    }
  }
}

std::string usage() {
  std::ostringstream o;
  o << "usage: wb-train [flags]\n"
       "Trains ResNet-50 (torchvision v1.5) data-parallel, one process per device, recording everything\n"
       "into a SQLite run file. Flags override --config; every setting is also a JSON key (flag without\n"
       "the dashes, '-' -> '_').\n\n";
  for (const Option& o2 : kOptions) {
    if (is_hidden(o2.key)) continue;
    std::string flag = std::string_view(o2.key) == "config_file" ? "--config" : flag_of(o2.key);
    if (std::string_view(o2.key) == "profile") flag = "--no-profile";
    if (std::string_view(o2.key) == "memory_profile") flag = "--no-memory-profile";
    if (std::string_view(o2.key) == "random_flip") flag = "--no-random-flip";
    if (std::string_view(o2.key) == "calibrate_comm") flag = "--no-calibrate-comm";
    o << "  " << flag;
    for (size_t n = flag.size(); n < 22; ++n) o << ' ';
    o << ' ' << o2.help << '\n';
  }
  o << "  --dump-ranks all        same as --dump-all-ranks\n";
  return o.str();
}

}  // namespace wb::trainer
