// The phases that set a rank's training job up (job.hpp): the run file and the profiler, the model and
// its optimizer, the gradients' buckets and their sync across ranks, the data set and the batch source.
#include "trainer/job.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <sstream>
#include <thread>

#include "trainer/checkpoint.hpp"
#include "trainer/comm_calibration.hpp"
#include "trainer/input.hpp"
#include "trainer/parallel/clock.hpp"
#include "trainer/parallel/world.hpp"

namespace wb::trainer {
namespace fs = std::filesystem;

namespace {

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

backend::Precision parse_precision(const std::string& text) {
  if (text == "tf32") return backend::Precision::tf32;
  if (text == "bf16") return backend::Precision::bf16;
  return backend::Precision::fp32;  // validate() admitted nothing else
}

}  // namespace

// ---- what this rank records -------------------------------------------------------------------------

namespace {

// The run file's path, agreed by every rank: --run, else runs/<UTC time>.sqlite from rank 0's clock.
fs::path run_path(const TrainConfig& cfg, parallel::Communicator& comm) {
  if (!cfg.run.empty()) return cfg.run;
  std::int64_t t = comm.allgather(static_cast<std::int64_t>(std::time(nullptr)))[0];
  std::time_t tt = static_cast<std::time_t>(t);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::gmtime(&tt));
  return fs::path("runs") / (std::string("run-") + buf + ".sqlite");
}

}  // namespace

// Clock offset of this rank to rank 0 (0 for a single process).
profiler::ClockSync measure_offset(parallel::Communicator& comm) {
  constexpr int kRoundTrips = 50;
  profiler::ClockSync sync;
  sync.local_ns = profiler::now_ns();
  if (auto mine = parallel::offset_to_rank0(comm, kRoundTrips)) {
    // offset_to_rank0: rank0_time = local - offset. The profiler adds offset_ns to local time.
    sync.offset_ns = -mine->offset_ns;
    sync.rtt_ns = mine->round_trip_ns;
    sync.local_ns = profiler::now_ns();
    sync.samples = kRoundTrips;
  }
  return sync;
}

Recording open_recording(const TrainConfig& cfg, Placement& place) {
  Recording r;
  r.run = run_path(cfg, place.comms.main());
  fs::path rank_file = r.run;
  if (place.world > 1) {
    r.run_dir = fs::path(r.run).replace_extension("");
    rank_file = r.run_dir / ("rank-" + std::to_string(place.rank) + ".sqlite");
  }
  if (!rank_file.parent_path().empty()) fs::create_directories(rank_file.parent_path());
  if (place.rank == 0 && place.world > 1 && fs::exists(r.run)) fs::remove(r.run);
  store::WriterOptions wo;
  wo.path = rank_file;
  wo.rank = place.rank;
  wo.overwrite = true;
  wo.build_indexes = place.world == 1;  // per-rank files get their indexes when merged
  r.writer = std::make_unique<store::Writer>(wo);
  store::Writer& w = *r.writer;
  const DeviceChoice& device = place.device;
  w.set_meta("config_json", cfg.to_json().dump());
  w.set_meta("world_size", std::to_string(place.world));
  w.set_meta("device", device.cuda ? "cuda" : "cpu");
  w.set_meta("device_name", device.cuda ? device.name : "cpu");
  // What the TensorBoard plugin's memory and AMP rules read (as an imported trace's deviceProperties
  // totalGlobalMem and computeMajor); a CPU has neither.
  if (device.cuda) {
    w.set_meta("device_total_memory", std::to_string(device.memory_bytes));
    w.set_meta("compute_major", std::to_string(device.compute_major));
  }
  w.set_meta("precision", device.cuda ? cfg.precision : "fp32");
  w.set_meta("channels_last", device.cuda && cfg.channels_last ? "1" : "0");
  w.set_meta("created_utc", utc_now());
  // What wb whatif needs to tell when the ranks of a host share too few CPUs (analysis::shared_cpu_caveat).
  const std::string suffix = ".rank" + std::to_string(place.rank);
  w.set_meta("host_cpus" + suffix, std::to_string(std::max(1u, std::thread::hardware_concurrency())));
  w.set_meta("threads" + suffix, std::to_string(place.threads));
  r.rank_row.rank = place.rank;
  r.rank_row.host = hostname();
  r.rank_row.device = device.description;
  r.rank_row.pid = getpid();

  r.clock_start = measure_offset(*place.comms.host);
  r.rank_row.clock_offset_ns = r.clock_start.offset_ns;
  // Local times of both offset measurements: wb merge interpolates the offset between them (clock drift).
  w.set_meta("clock_sync_start_ns", std::to_string(r.clock_start.local_ns));
  w.set_rank(r.rank_row);

  if (cfg.profile) {
    profiler::RecorderOptions ro;
    ro.clock = profiler::ClockMap(r.clock_start);
    ro = cap_recorder_pool(ro, cfg.profile_buffer_events);
    r.recorder = std::make_unique<profiler::Recorder>(w, ro);
    if (!cfg.capture.empty()) {
      const profiler::CaptureConfig cc = profiler::parse_capture(cfg.capture, cfg.capture_window);
      r.capture = std::make_unique<profiler::Capture>(w, cc, place.rank);
      r.recorder->set_capture(r.capture.get());
      w.set_meta("capture", profiler::describe(cc));
    }
    profiler::set_thread_name("main");
    // Started before the backend, so that its first kernels are traced too.
    if (device.cuda) r.gpu_trace = start_gpu_trace(*r.recorder, w, cfg.nvtx, place.rank);
    // Before the backend and the model, so that their parameters and buffers are counted too.
    if (cfg.memory_profile) r.memory = std::make_unique<MemoryProfile>(*r.recorder, place.rank);
  }
  return r;
}

// ---- what it trains ---------------------------------------------------------------------------------

namespace {

std::unique_ptr<backend::Backend> make_backend(const TrainConfig& cfg, const Placement& place) {
  if (!place.device.cuda) return backend::make_cpu_backend({place.threads, cfg.reference_kernels});
  if (cfg.reference_kernels) throw ConfigError("--reference-kernels: --device auto found a GPU; use --device cpu");
  backend::CudaOptions co;
  co.device = place.device.index;
  co.precision = parse_precision(cfg.precision);
  co.channels_last = cfg.channels_last;
  return backend::make_cuda_backend(co);
}

optim::LrScheduleConfig lr_schedule_config(const TrainConfig& cfg, std::int64_t total_steps, int world) {
  optim::LrScheduleConfig lc;
  lc.kind = optim::parse_lr_schedule_kind(cfg.lr_schedule);
  lc.lr = cfg.lr_schedule == "cosine" && cfg.lr_max > 0 ? cfg.lr_max : cfg.lr;
  lc.step_size = cfg.lr_step_size > 0 ? cfg.lr_step_size : std::max<int64_t>(1, total_steps);
  lc.gamma = cfg.lr_gamma;
  lc.lr_init = cfg.lr_init;
  lc.lr_end = cfg.lr_end;
  lc.total_steps = total_steps;
  if (lc.kind == optim::LrScheduleKind::cosine && cfg.warmup_steps >= total_steps) {
    throw ConfigError("--warmup-steps " + std::to_string(cfg.warmup_steps) + ": the cosine schedule needs fewer warm-up " +
                      "steps than the run's " + std::to_string(total_steps) + " steps (pass a smaller --warmup-steps)");
  }
  lc.warmup_steps = cfg.warmup_steps;
  lc.scale_by_world_size = cfg.scale_lr;
  lc.world_size = world;
  return lc;
}

}  // namespace

// The parameters every rank holds alike: all of them, or all but a sharded classifier's slices (the
// last two tensors, fc.weight and fc.bias), whose members hold different rows.
std::size_t replicated_params(const model::ResNet50& m) {
  return m.fc_sharded() ? m.params()[m.params().size() - 2].offset : m.param_count();
}

Learner make_learner(const TrainConfig& cfg, Placement& place, std::int64_t total_steps,
                     ShardedClassifier* fc_shard) {
  Learner l;
  l.backend = make_backend(cfg, place);
  // Device collectives (NCCL) wait for the compute stream's work; a no-op elsewhere.
  place.comms.main().set_input_stream(l.backend->native_stream());
  model::ModelConfig mc;
  mc.num_classes = cfg.num_classes;
  mc.image_size = cfg.image_size;
  mc.batch_size = cfg.batch_size / cfg.micro_batches;  // a pipeline's model runs one micro-batch at a time
  mc.seed = cfg.seed;
  mc.loss.convention = cfg.loss_convention == "torch" ? backend::LossConvention::torch : backend::LossConvention::mindspore;
  mc.loss.smoothing = static_cast<float>(cfg.label_smoothing);
  if (fc_shard) {
    mc.fc_shards = fc_shard->shards();
    mc.fc_shard = fc_shard->shard();
  }
  l.model = std::make_unique<model::ResNet50>(*l.backend, mc);
  l.model->set_fc_shard(fc_shard);
  l.sgd = std::make_unique<optim::Sgd>(
      optim::SgdConfig{static_cast<float>(cfg.momentum), static_cast<float>(cfg.weight_decay), cfg.nesterov});
  // A checkpoint carries the number of steps behind it; --steps/--epochs remain the schedule's total,
  // so the LR schedule and the data order go on exactly where the saved run stopped.
  if (!cfg.resume.empty()) {
    load_checkpoint(cfg.resume, *l.model, *l.sgd);
    l.start_step = l.sgd->steps();
    if (l.start_step >= total_steps) {
      throw ConfigError("--resume " + cfg.resume.string() + ": the checkpoint is at step " +
                        std::to_string(l.start_step) + ", so " + std::to_string(total_steps) +
                        " total steps leave nothing to train (--steps counts from the start of training)");
    }
  }
  l.schedule = std::make_unique<optim::LrSchedule>(
      lr_schedule_config(cfg, total_steps, place.world / cfg.pipeline_stages));  // data-parallel replicas
  // Parameters and BN buffers from rank 0 (MindSpore's parameter_broadcast). The buffers live where
  // the backend keeps them, and the communicator speaks the same memory: MPI host, NCCL device. A
  // sharded classifier's slices are not broadcast: every rank drew (or loaded) the whole classifier
  // alike and kept its own rows.
  if (place.world > 1) {
    model::ResNet50& m = *l.model;
    place.comms.main().broadcast(m.param_buffer().data_as<float>(), replicated_params(m), 0);
    place.comms.main().broadcast(m.running_stats().data_as<float>(), static_cast<std::size_t>(m.running_stats().numel()),
                                 0);
    l.backend->params_written();  // drop weight copies cached from the pre-broadcast values
  }
  return l;
}

// ---- gradients across ranks -------------------------------------------------------------------------

// The communicator's calibration (comm_calibration.hpp) into the run file, with a line on rank 0.
void calibrate(parallel::Communicator& comm, backend::Backend& be, const std::vector<parallel::Bucket>& buckets,
               store::Writer& writer) {
  CalibrationOptions o;
  for (const auto& b : buckets) o.max_bytes += b.bytes();
  const std::int64_t t0 = parallel::now_ns();
  const auto rows = calibrate_comm(comm, be, o);
  writer.add(std::span<const store::CommCalibrationRow>(rows));
  if (comm.rank() != 0) return;
  std::printf("wb-train: communicator calibrated in %.1f s: %s\n", static_cast<double>(parallel::now_ns() - t0) * 1e-9,
              describe_calibration(rows).c_str());
  std::fflush(stdout);
}

Gradients make_gradients(const TrainConfig& cfg, Placement& place, Learner& learner, Recording& rec,
                         const std::string& banner) {
  const model::ResNet50& model = *learner.model;
  Gradients g;
  const auto extents = parallel::param_extents(model.params());
  g.buckets = parallel::plan_buckets(extents, cfg.allreduce_split, cfg.bucket_mb);
  // A sharded classifier's slices (fc.weight, fc.bias) are reduced by their own rank groups.
  if (model.fc_sharded()) {
    g.buckets = parallel::buckets_before(extents, g.buckets, static_cast<int>(model.params().size()) - 2);
  }
  const std::vector<int> bucket_of = parallel::bucket_of_params(g.buckets);
  std::vector<std::string> names;
  for (const auto& p : model.params()) names.push_back(p.name);
  if (place.rank == 0) {
    std::cout << banner << "wb-train: allreduce buckets (" << g.buckets.size() << "):\n"
              << parallel::format_buckets(g.buckets, names)
              << (model.fc_sharded() ? "wb-train: fc.weight and fc.bias: sharded, reduced over their shard groups\n" : "")
              << std::flush;
  }
  for (std::size_t i = 0; i < model.params().size(); ++i) {
    const auto& p = model.params()[i];
    const int bucket = i < bucket_of.size() ? bucket_of[i] : -1;  // -1: a sharded slice, in no bucket
    rec.writer->add(store::ParamRow{static_cast<int32_t>(i), p.name, p.shape, static_cast<int64_t>(p.numel),
                                    bucket, p.decay});
  }
  if (place.world > 1 && cfg.pipeline_stages == 1 && cfg.micro_batches == 1) {  // a pipeline syncs per stage
    parallel::SyncOptions so;
    so.param_count = static_cast<int>(model.params().size());
    profiler::Recorder* recorder = rec.recorder.get();
    so.on_span = [recorder](const parallel::BucketSpan& s) {
      if (recorder) {
        recorder->add(store::AllreduceRow{s.rank, s.step, s.bucket, s.first_param, s.last_param, s.bytes, s.ready_ns,
                                          s.start_ns, s.end_ns});
      }
    };
    parallel::Communicator* comm = &place.comms.main();
    if (cfg.calibrate_comm) calibrate(*comm, *learner.backend, g.buckets, *rec.writer);
    so.on_ready = [comm](const parallel::Bucket&, float* data) { comm->mark_ready(data); };
    so.watchdog_timeout_s = cfg.watchdog_s;
    if (cfg.watchdog_s > 0) {
      g.heartbeat = std::make_unique<parallel::Heartbeat>(rec.run_dir, place.rank, place.world,
                                                          parallel::Heartbeat::interval_for(cfg.watchdog_s));
      so.heartbeat = g.heartbeat.get();
    }
    g.sync = std::make_unique<parallel::GradientSync>(*comm, g.buckets, learner.model->grad_buffer().data_as<float>(), so);
  }
  return g;
}

// ---- the input --------------------------------------------------------------------------------------

// The data set and the length of the run; the workers start later (start_input).
Input open_input(const TrainConfig& cfg, const Placement& place, const fs::path& run) {
  Input in;
  in.train_set = load_data(cfg, data::Split::kTrain, run);
  if (in.train_set.num_classes > cfg.num_classes) {
    throw ConfigError("--num-classes " + std::to_string(cfg.num_classes) + ": the data set has " +
                      std::to_string(in.train_set.num_classes) + " classes");
  }
  in.steps_per_epoch = data::ShardSampler(in.train_set.size(), place.shard.count, place.shard.rank, cfg.batch_size,
                                          cfg.seed, true)
                           .steps_per_epoch();
  in.total_steps = cfg.total_steps(in.steps_per_epoch);
  if (in.train_set.kind == data::DatasetKind::kImageFolder && place.rank == 0) {
    std::printf("wb-train: image folder %s: %lld images in %d classes, transforms %s at %dx%d\n",
                cfg.data_path.c_str(), static_cast<long long>(in.train_set.size()), in.train_set.num_classes,
                cfg.transforms.c_str(), cfg.image_size, cfg.image_size);
  }
  return in;
}

void start_input(const TrainConfig& cfg, const Placement& place, Input& in, Learner& learner, Recording& rec) {
  // On a GPU the host queue's consumer is the device queue's copy thread: its waits are not the
  // training loop's, so they get their own name; "data_wait" stays the loop's wait for input.
  in.observer = std::make_unique<DataObserver>(rec.recorder.get(), "batch queue",
                                               place.device.cuda ? "host_queue_wait" : "data_wait");
  in.pipeline = std::make_unique<data::Pipeline>(
      in.train_set, train_pipeline_config(cfg, in.train_set, place.shard, in.total_steps), in.observer.get());
  // The pipeline always starts at batch 0; a resumed run passes over the batches already trained on
  // so batch k still meets step k (augmentation is keyed by epoch and sample, not by time).
  for (int64_t skipped = 0; skipped < learner.start_step; ++skipped) {
    if (!in.pipeline->pop()) {
      throw std::runtime_error("the data pipeline ended while skipping to step " + std::to_string(learner.start_step));
    }
  }
  in.source = place.device.cuda ? make_device_batch_source(*in.pipeline, *learner.backend, place.device.index,
                                                           cfg.device_prefetch, rec.recorder.get())
                                : make_host_batch_source(*in.pipeline, *in.observer);
}

}  // namespace wb::trainer
