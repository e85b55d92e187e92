// The training loop of wb-train, one rank. Read top to bottom:
//   1. who am I (launcher), which device, communicators (MPI; NCCL on GPUs), threads
//   2. run file (Writer), profiler (Recorder, CUPTI on GPUs) with the clock offset to rank 0
//   3. data pipeline, backend, model, optimizer, LR schedule; parameters broadcast from rank 0
//   4. buckets and GradientSync (allreduce overlapped with backward)
//   5. the steps: pop batch -> forward -> backward (buckets reduce as gradients finish) -> wait -> SGD
//   6. eval, checkpoint, end-of-run clock offset, finish the run file, merge per-rank files on rank 0
//
// On a GPU (--device cuda) the backend keeps parameters, gradients and momentum in device memory, and
// everything that reads them on the host goes through to_host (check-sync, checkpoints, dumps); the
// batches reach the device through the device prefetch queue (trainer/gpu/device_queue.hpp); the
// allreduce runs over NCCL, ordered after the gradient kernels by an event recorded when each bucket
// becomes ready. CUDA appears here only behind WB_BACKEND_CUDA / WB_PARALLEL_NCCL / WB_PROFILER_CUPTI, and
// through headers without CUDA types.
#include "trainer/train.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "profiler/record/clock_sync.hpp"
#include "profiler/record/recorder.hpp"
#include "store/merge.hpp"
#include "store/writer.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/data/pipeline.hpp"
#include "trainer/parallel/buckets.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/launch.hpp"
#include "trainer/dump/dump.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/observers.hpp"
#include "trainer/optim/lr_schedule.hpp"
#include "trainer/optim/sgd.hpp"
#include "trainer/progress.hpp"
#ifdef WB_PARALLEL_MPI
#include "trainer/parallel/mpi_communicator.hpp"
#endif
#ifdef WB_BACKEND_CUDA
#include "trainer/gpu/device_queue.hpp"
#include "trainer/gpu/gpu.hpp"
#endif
#if defined(WB_BACKEND_CUDA) && defined(WB_PARALLEL_NCCL)
#include "trainer/parallel/cuda/nccl_communicator.hpp"
#define WB_TRAIN_NCCL 1
#endif
#if defined(WB_BACKEND_CUDA) && defined(WB_PROFILER_CUPTI)
#include "profiler/record/cuda/cupti_tracer.hpp"
#define WB_TRAIN_CUPTI 1
#endif

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

// Where this rank computes: the CPU, or the CUDA device of its local rank (one process per GPU).
struct DeviceChoice {
  bool cuda = false;
  int index = 0;
  std::string name;         // the GPU's name
  std::string description;  // rank row and start-up line: "cpu", "cuda:0 (NVIDIA H100 80GB HBM3, bf16)"
};

backend::Precision parse_precision(const std::string& text) {
  if (text == "tf32") return backend::Precision::tf32;
  if (text == "bf16") return backend::Precision::bf16;
  return backend::Precision::fp32;  // validate() admitted nothing else
}

DeviceChoice choose_device(const TrainConfig& cfg, const parallel::LaunchInfo& info) {
  DeviceChoice d;
  d.description = "cpu";
  if (cfg.device == "cpu") return d;
#ifdef WB_BACKEND_CUDA
  const int count = backend::cuda_device_count();
  const std::string missing = "no CUDA device found";
#else
  const int count = 0;
  const std::string missing =
      "this wb-train was built without CUDA (configure with -DWB_CUDA=ON where the CUDA toolkit and cuDNN are installed)";
#endif
  if (count == 0) {
    if (cfg.device == "cuda") throw ConfigError("--device cuda: " + missing);
    // --device auto: the CPU, which computes in fp32 with its own layouts.
    if (cfg.precision != "fp32") {
      throw ConfigError("--precision " + cfg.precision + ": --device auto found no GPU (" + missing +
                        ") and the CPU backend computes in fp32 only");
    }
    if (cfg.channels_last) {
      throw ConfigError("--channels-last: --device auto found no GPU (" + missing +
                        ") and the CPU backend chooses its own layouts");
    }
    if (info.rank == 0) std::cerr << "wb-train: --device auto: " << missing << "; training on the CPU\n";
    return d;
  }
  if (info.local_rank >= count) {
    throw ConfigError("--device " + cfg.device + ": local rank " + std::to_string(info.local_rank) + " needs CUDA device " +
                      std::to_string(info.local_rank) + " but " + std::to_string(count) +
                      " are visible (one rank per GPU: start at most " + std::to_string(count) + " ranks per host)");
  }
  d.cuda = true;
  d.index = info.local_rank;
#ifdef WB_BACKEND_CUDA
  d.name = gpu::device_info(d.index).name;
#endif
  d.description = "cuda:" + std::to_string(d.index) + " (" + d.name + ", " + cfg.precision +
                  (cfg.channels_last ? ", channels-last" : "") + ")";
  return d;
}

// The collectives of one rank: `host` (self or MPI) for bookkeeping, clock sync and barriers, and on
// GPUs with several ranks `device` (NCCL over the same MPI job) for parameters and gradients.
struct Communicators {
  std::unique_ptr<parallel::Communicator> host;
  std::unique_ptr<parallel::Communicator> device;  // destroyed first: it holds a reference to `host`
  parallel::Communicator& main() { return device ? *device : *host; }
};

Communicators make_communicators(const parallel::LaunchInfo& info, const DeviceChoice& device) {
  Communicators c;
  if (info.world_size == 1) {
    c.host = std::make_unique<parallel::SelfCommunicator>();
    return c;
  }
#ifdef WB_PARALLEL_MPI
  auto mpi = std::make_unique<parallel::MpiCommunicator>();
  if (device.cuda) {
#ifdef WB_TRAIN_NCCL
    c.device = std::make_unique<parallel::NcclCommunicator>(*mpi, device.index);
#else
    throw ConfigError("--device cuda: this wb-train was built without NCCL and cannot run " +
                      std::to_string(info.world_size) + " ranks on GPUs");
#endif
  }
  c.host = std::move(mpi);
  return c;
#else
  (void)device;
  throw ConfigError("this wb-train was built without MPI (WB_MPI=OFF) and cannot run " +
                    std::to_string(info.world_size) + " ranks");
#endif
}

// The run file's path, agreed by every rank: --run, else runs/<UTC time>.sqlite from rank 0's clock.
fs::path run_path(const TrainConfig& cfg, parallel::Communicator& comm) {
  if (!cfg.run.empty()) return cfg.run;
  std::int64_t t = comm.allgather(static_cast<std::int64_t>(std::time(nullptr)))[0];
  std::time_t tt = static_cast<std::time_t>(t);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::gmtime(&tt));
  return fs::path("runs") / (std::string("run-") + buf + ".sqlite");
}

// Clock offset of this rank to rank 0 (0 for a single process).
profiler::ClockSync measure_offset(parallel::Communicator& comm) {
  profiler::ClockSync sync;
  sync.local_ns = profiler::now_ns();
#ifdef WB_PARALLEL_MPI
  if (auto* mpi = dynamic_cast<parallel::MpiCommunicator*>(&comm)) {
    std::vector<parallel::ClockOffset> all = parallel::measure_clock_offsets(*mpi, 50);
    const parallel::ClockOffset& mine = all[static_cast<std::size_t>(comm.rank())];
    // measure_clock_offsets: rank0_time = local - offset. The profiler adds offset_ns to local time.
    sync.offset_ns = -mine.offset_ns;
    sync.rtt_ns = mine.round_trip_ns;
    sync.local_ns = profiler::now_ns();
    sync.samples = 50;
  }
#endif
  return sync;
}

data::Dataset load_data(const TrainConfig& cfg, data::Split split, const fs::path& run) {
  data::DatasetKind kind = data::parse_dataset_kind(cfg.data);
  fs::path path = cfg.data_path;
  data::SyntheticOptions syn;
  syn.seed = cfg.seed;
  syn.train_images = cfg.synthetic_samples;
  syn.test_images = std::max<int64_t>(cfg.batch_size, cfg.synthetic_samples / 5);
  if (path.empty()) {
    if (kind == data::DatasetKind::kFashionMnist) path = "/usr/share/datasets/fashion-mnist";
    else if (kind == data::DatasetKind::kSynthetic) path = fs::path(run).replace_extension("") += "-synthetic-data";
    else throw ConfigError("--data cifar10: give --data-path (the cifar-10-batches-bin folder)");
  }
  return data::load_dataset(kind, path, split, syn);
}

std::vector<float> eval_accuracy(const TrainConfig& cfg, model::ResNet50& model, parallel::Communicator& comm,
                                 const fs::path& run, int rank) {
  data::Dataset test = load_data(cfg, data::Split::kTest, run);
  data::PipelineConfig pc;
  pc.batch_size = cfg.batch_size;
  pc.workers = cfg.data_workers;
  pc.prefetch = cfg.prefetch;
  pc.num_shards = comm.size();
  pc.shard_id = rank;
  pc.seed = cfg.seed;
  pc.shuffle = false;
  pc.transform.image_size = cfg.image_size;
  pc.transform.train = false;
  pc.transform.norm = data::default_normalization(data::parse_dataset_kind(cfg.data));
  pc.total_steps = data::ShardSampler(test.size(), comm.size(), rank, cfg.batch_size, cfg.seed, false).steps_per_epoch();
  data::Pipeline eval_pipe(test, pc);
  model.set_training(false);
  model.set_observer(nullptr);
  std::int64_t top1 = 0, top5 = 0, seen = 0;
  const int k = cfg.num_classes;
  while (data::BatchRef b = eval_pipe.pop()) {
    model.forward(b->images, b->labels);
    std::vector<float> logits = model.logits_to_host();
    for (int i = 0; i < cfg.batch_size; ++i) {
      const float* row = logits.data() + static_cast<std::size_t>(i) * k;
      int label = b->labels[static_cast<std::size_t>(i)];
      int higher = 0;
      for (int c = 0; c < k; ++c) higher += row[c] > row[label];
      top1 += higher == 0;
      top5 += higher < 5;
      ++seen;
    }
  }
  model.set_training(true);
  std::vector<std::int64_t> all = comm.allgather(std::vector<std::int64_t>{top1, top5, seen});
  std::int64_t t1 = 0, t5 = 0, n = 0;
  for (std::size_t r = 0; r < all.size(); r += 3) {
    t1 += all[r];
    t5 += all[r + 1];
    n += all[r + 2];
  }
  return {n ? 100.0f * t1 / n : 0.0f, n ? 100.0f * t5 / n : 0.0f, static_cast<float>(n)};
}

}  // namespace

int run_training(const TrainConfig& cfg_in) {
  TrainConfig cfg = cfg_in;
  // 1. who am I, and where do I compute
  parallel::LaunchInfo info = parallel::launch_info();
  const DeviceChoice device = choose_device(cfg, info);
  Communicators comms = make_communicators(info, device);
  parallel::Communicator* comm = &comms.main();
  const int rank = comm->rank();
  const int world = comm->size();
  // The data shard: this rank's, or the one --shard names for a single process.
  Shard shard{rank, world};
  if (!cfg.shard.empty()) {
    if (world > 1) throw ConfigError("--shard: a single-process aid, but this job has " + std::to_string(world) + " ranks");
    shard = parse_shard(cfg.shard);
  }
  if (cfg.threads == 0) cfg.threads = parallel::default_threads(info, std::thread::hardware_concurrency());

  // 2. run file and profiler
  fs::path run = run_path(cfg, *comm);
  fs::path rank_file = run;
  fs::path run_dir;
  if (world > 1) {
    run_dir = fs::path(run).replace_extension("");
    rank_file = run_dir / ("rank-" + std::to_string(rank) + ".sqlite");
  }
  if (!rank_file.parent_path().empty()) fs::create_directories(rank_file.parent_path());
  if (rank == 0 && world > 1 && fs::exists(run)) fs::remove(run);
  store::WriterOptions wo;
  wo.path = rank_file;
  wo.rank = rank;
  wo.overwrite = true;
  wo.build_indexes = world == 1;  // per-rank files get their indexes when merged
  store::Writer writer(wo);
  writer.set_meta("config_json", cfg.to_json().dump());
  writer.set_meta("world_size", std::to_string(world));
  writer.set_meta("device", device.cuda ? "cuda" : "cpu");
  writer.set_meta("device_name", device.cuda ? device.name : "cpu");
  writer.set_meta("precision", device.cuda ? cfg.precision : "fp32");
  writer.set_meta("channels_last", device.cuda && cfg.channels_last ? "1" : "0");
  writer.set_meta("created_utc", utc_now());
  store::RankRow rank_row;
  rank_row.rank = rank;
  rank_row.host = hostname();
  rank_row.device = device.description;
  rank_row.pid = getpid();

  profiler::ClockSync clock_start = measure_offset(*comms.host);
  rank_row.clock_offset_ns = clock_start.offset_ns;
  // Local times of both offset measurements: wb merge interpolates the offset between them (clock drift).
  writer.set_meta("clock_sync_start_ns", std::to_string(clock_start.local_ns));
  writer.set_rank(rank_row);

  std::unique_ptr<profiler::Recorder> recorder;
  if (cfg.profile) {
    profiler::RecorderOptions ro;
    ro.clock = profiler::ClockMap(clock_start);
    ro = cap_recorder_pool(ro, cfg.profile_buffer_events);
    recorder = std::make_unique<profiler::Recorder>(writer, ro);
    profiler::set_thread_name("main");
  }
#ifdef WB_TRAIN_CUPTI
  // GPU kernels, copies and memsets, each linked to the host range that launched it. Started before
  // the backend so its first kernels are traced too. Profiling never takes training down: a CUPTI that
  // refuses (no permission for the activity API, another profiler attached) leaves a note and a
  // warning, and the run goes on with host ranges only.
  std::unique_ptr<profiler::cuda::CuptiTracer> cupti;
  if (recorder && device.cuda) {
    profiler::cuda::CuptiOptions co;
    co.nvtx = cfg.nvtx;
    try {
      cupti = std::make_unique<profiler::cuda::CuptiTracer>(*recorder, co);
      writer.set_meta("gpu_trace", cfg.nvtx ? "cupti+nvtx" : "cupti");
    } catch (const std::exception& e) {
      std::cerr << "wb-train: rank " << rank << ": GPU kernel tracing is off: " << e.what() << "\n";
      writer.set_meta("gpu_trace", std::string("off: ") + e.what());
    }
  }
#endif

  // 3. data, model, optimizer
  data::Dataset train_set = load_data(cfg, data::Split::kTrain, run);
  if (train_set.num_classes > cfg.num_classes) {
    throw ConfigError("--num-classes " + std::to_string(cfg.num_classes) + ": the data set has " +
                      std::to_string(train_set.num_classes) + " classes");
  }
  data::PipelineConfig pc;
  pc.batch_size = cfg.batch_size;
  pc.workers = cfg.data_workers;
  pc.prefetch = cfg.prefetch;
  pc.num_shards = shard.count;
  pc.shard_id = shard.rank;
  pc.seed = cfg.seed;
  pc.delay_us = cfg.data_delay_us;
  pc.transform.image_size = cfg.image_size;
  pc.transform.crop_padding = cfg.crop_padding;
  pc.transform.flip_prob = cfg.random_flip ? 0.5 : 0.0;
  pc.transform.norm = data::default_normalization(train_set.kind);
  int64_t steps_per_epoch =
      data::ShardSampler(train_set.size(), shard.count, shard.rank, cfg.batch_size, cfg.seed, true).steps_per_epoch();
  const int64_t total_steps = cfg.total_steps(steps_per_epoch);
  pc.total_steps = total_steps;

  std::unique_ptr<backend::Backend> backend;
  if (device.cuda) {
    backend::CudaOptions co;
    co.device = device.index;
    co.precision = parse_precision(cfg.precision);
    co.channels_last = cfg.channels_last;
    backend = backend::make_cuda_backend(co);
  } else {
    backend = backend::make_cpu_backend({cfg.threads});
  }
#ifdef WB_TRAIN_NCCL
  // Collectives wait for the compute stream's work (see NcclCommunicator's ordering note).
  auto* nccl = dynamic_cast<parallel::NcclCommunicator*>(comm);
  if (nccl) nccl->set_input_stream(gpu::compute_stream_handle(*backend));
#endif
  model::ModelConfig mc;
  mc.num_classes = cfg.num_classes;
  mc.image_size = cfg.image_size;
  mc.batch_size = cfg.batch_size;
  mc.seed = cfg.seed;
  mc.loss.convention = cfg.loss_convention == "torch" ? backend::LossConvention::torch : backend::LossConvention::mindspore;
  mc.loss.smoothing = static_cast<float>(cfg.label_smoothing);
  model::ResNet50 model(*backend, mc);
  optim::Sgd sgd({static_cast<float>(cfg.momentum), static_cast<float>(cfg.weight_decay), cfg.nesterov});
  // A checkpoint carries the number of steps behind it; --steps/--epochs remain the schedule's total,
  // so the LR schedule and the data order go on exactly where the saved run stopped.
  int64_t start_step = 0;
  if (!cfg.resume.empty()) {
    load_checkpoint(cfg.resume, model, sgd);
    start_step = sgd.steps();
    if (start_step >= total_steps) {
      throw ConfigError("--resume " + cfg.resume.string() + ": the checkpoint is at step " + std::to_string(start_step) +
                        ", so " + std::to_string(total_steps) +
                        " total steps leave nothing to train (--steps counts from the start of training)");
    }
  }

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
  optim::LrSchedule schedule(lc);

  // Parameters and BN buffers from rank 0 (MindSpore's parameter_broadcast). The buffers live where
  // the backend keeps them, and the communicator speaks the same memory: MPI host, NCCL device.
  if (world > 1) {
    comm->broadcast(model.param_buffer().data_as<float>(), model.param_count(), 0);
    comm->broadcast(model.running_stats().data_as<float>(), static_cast<std::size_t>(model.running_stats().numel()), 0);
    backend->params_written();  // drop weight copies cached from the pre-broadcast values
  }

  // 4. buckets
  std::vector<parallel::ParamExtent> extents = parallel::param_extents(model.params());
  std::vector<parallel::Bucket> buckets = parallel::plan_buckets(extents, cfg.allreduce_split, cfg.bucket_mb);
  std::vector<int> bucket_of = parallel::bucket_of_params(buckets);
  {
    std::vector<std::string> names;
    for (const auto& p : model.params()) names.push_back(p.name);
    if (rank == 0) {
      std::cout << "wb-train: " << world << " rank(s), " << cfg.threads << " thread(s) each, " << device.description << ", "
                << cfg.data << " (" << train_set.size() << " images), batch " << cfg.batch_size << ", "
                << cfg.image_size << "x" << cfg.image_size << ", " << total_steps << " steps\n"
                << "wb-train: allreduce buckets (" << buckets.size() << "):\n"
                << parallel::format_buckets(buckets, names) << std::flush;
    }
    for (std::size_t i = 0; i < model.params().size(); ++i) {
      const auto& p = model.params()[i];
      writer.add(store::ParamRow{static_cast<int32_t>(i), p.name, p.shape, static_cast<int64_t>(p.numel),
                                 bucket_of[i], p.decay});
    }
  }
  std::unique_ptr<parallel::GradientSync> sync;
  if (world > 1) {
    parallel::SyncOptions so;
    profiler::Recorder* rec = recorder.get();
    so.on_span = [rec](const parallel::BucketSpan& s) {
      if (rec) rec->add(store::AllreduceRow{s.rank, s.step, s.bucket, s.first_param, s.last_param, s.bytes, s.ready_ns,
                                            s.start_ns, s.end_ns});
    };
#ifdef WB_TRAIN_NCCL
    if (nccl) so.on_ready = [nccl](const parallel::Bucket&, float* data) { nccl->mark_ready(data); };
#endif
    sync = std::make_unique<parallel::GradientSync>(*comm, buckets, model.grad_buffer().data_as<float>(), so);
  }

  StepObserver step_observer(recorder.get(), sync.get(), *backend);
  model.set_observer(&step_observer);
  // On a GPU the host queue's consumer is the device queue's copy thread: its waits are not the
  // training loop's, so they get their own name; "data_wait" stays the loop's wait for input.
  DataObserver data_observer(recorder.get(), "batch queue", device.cuda ? "host_queue_wait" : "data_wait");
  data::Pipeline pipe(train_set, pc, &data_observer);
  // The pipeline always starts at batch 0; a resumed run passes over the batches already trained on
  // so batch k still meets step k (augmentation is keyed by epoch and sample, not by time).
  for (int64_t skipped = 0; skipped < start_step; ++skipped) {
    if (!pipe.pop()) throw std::runtime_error("the data pipeline ended while skipping to step " + std::to_string(start_step));
  }
  DataObserver* wait_observer = &data_observer;  // whose waits the step rows count
#ifdef WB_BACKEND_CUDA
  std::unique_ptr<DataObserver> device_observer;
  std::unique_ptr<gpu::DeviceQueue> device_queue;  // after `pipe`: it must go first
  if (device.cuda) {
    device_observer = std::make_unique<DataObserver>(recorder.get(), "device_queue", "data_wait");
    device_queue = std::make_unique<gpu::DeviceQueue>(pipe, *backend, gpu::DeviceQueueOptions{device.index, cfg.device_prefetch},
                                                      device_observer.get());
    wait_observer = device_observer.get();
  }
#endif
  profiler::NameId step_name = recorder ? recorder->intern("step") : 0;
  profiler::NameId comm_wait_name = recorder ? recorder->intern("allreduce_wait") : 0;

  // 5. the steps. On a GPU the host runs at most about one step ahead of the device: forward reads the
  // loss back, so the step rows' host times track the device's pace without a synchronize per step.
#ifdef WB_TRAIN_CUPTI
  int64_t last_cupti_flush = profiler::now_ns();
#endif
  Progress progress(rank == 0, total_steps, steps_per_epoch, cfg.batch_size * world, cfg.log_every);
  int exit_code = 0;
  int64_t step = start_step;
  for (; step < total_steps; ++step) {
    if (store::Writer::stop_requested()) {
      if (rank == 0) std::cerr << "wb-train: stopping on signal after step " << step << "; the run stays incomplete\n";
      exit_code = 1;
      break;
    }
    profiler::set_step(static_cast<int32_t>(step));
    const int64_t t0 = profiler::now_ns();
    double lr = schedule.lr_at(step);
    float loss = 0.0f;
    int64_t wait_ns = 0, comm_ns = 0;
    {
      profiler::Range step_range(step_name, store::Category::step);
      // The batch: host memory from the pipeline (CPU), or device memory from the device queue (GPU).
      data::BatchRef batch;
#ifdef WB_BACKEND_CUDA
      gpu::DeviceBatchRef device_batch;
      if (device_queue) {
        device_batch = device_queue->pop();
        if (!device_batch) throw std::runtime_error("the device queue ended before step " + std::to_string(step));
      } else
#endif
      {
        batch = pipe.pop();
        if (!batch) throw std::runtime_error("the data pipeline ended before step " + std::to_string(step));
      }
      wait_ns = wait_observer->take_wait_ns();

      std::unique_ptr<dump::StepDump> dump;
      if (step == cfg.dump_step && (rank == 0 || cfg.dump_all_ranks)) {
        dump = std::make_unique<dump::StepDump>(writer, static_cast<int>(step), rank);
        if (batch) {
          dump->before_step(model, batch->images, batch->labels);
        } else {
#ifdef WB_BACKEND_CUDA
          // The dump holds exactly the bytes the model reads: the device copy, brought back.
          std::vector<float> images(static_cast<std::size_t>(device_batch.images().numel()));
          std::vector<std::int32_t> labels(static_cast<std::size_t>(device_batch.labels().numel()));
          backend->to_host(device_batch.images(), images);
          backend->to_host(device_batch.labels(), labels);
          dump->before_step(model, images, labels);
#endif
        }
        step_observer.set_dump(dump.get());
      }
      if (sync) sync->begin_step(static_cast<int>(step));
#ifdef WB_BACKEND_CUDA
      if (device_batch) loss = model.forward(device_batch.images(), device_batch.labels());
      else
#endif
        loss = model.forward(batch->images, batch->labels);
      step_observer.set_dump(nullptr);
      batch.release();
      model.backward();
      if (sync) {
        const int64_t c0 = profiler::now_ns();
        sync->wait_all();
        comm_ns = profiler::now_ns() - c0;
        profiler::record_range(comm_wait_name, store::Category::comm, c0, c0 + comm_ns);
      }
      sgd.step(model, static_cast<float>(lr));
#ifdef WB_BACKEND_CUDA
      // Every kernel reading the device batch (conv1's weight gradient reads the images) is queued:
      // its slot may be refilled once they have run.
      device_batch.release();
#endif
      if (dump) dump->after_step(model, loss);
    }
    const int64_t t1 = profiler::now_ns();
    // Data parallelism's invariant: every rank holds the same parameters after every step (BN running
    // statistics are per rank by design and not checked). Outside the timed step, a collective on all ranks.
    if (cfg.check_sync && world > 1) {
      const std::vector<float> params = model.params_to_host();  // host copy: the buffer may live on a GPU
      if (!parallel::identical_across_ranks(*comm, params.data(), params.size())) {
        // One write, so the ranks' lines do not interleave on the shared stderr.
        std::ostringstream msg;
        msg << "wb-train: rank " << rank << ": --check-sync: parameters differ across ranks after step " << step
            << " (this rank's fingerprint " << parallel::fingerprint(params.data(), params.size()) << ")\n";
        std::cerr << msg.str() << std::flush;
        exit_code = 1;
      }
    }
    if (!std::isfinite(loss)) {
      std::cerr << "wb-train: rank " << rank << ": loss is " << loss << " at step " << step
                << " (diverged: lower --lr?)\n";
      exit_code = 1;
    }
    store::StepRow row{rank, static_cast<int32_t>(step), t0, t1, wait_ns, comm_ns, loss, lr, cfg.batch_size};
    if (recorder) recorder->add(row);
    else {
      row.start_ns = profiler::ClockMap(clock_start).to_rank0(t0);
      row.end_ns = profiler::ClockMap(clock_start).to_rank0(t1);
      writer.add(row);
    }
    progress.step(step, loss, t1 - t0, wait_ns);
#ifdef WB_TRAIN_CUPTI
    // CUPTI hands its buffers over when they fill; flushing about once a second keeps a killed
    // run's loss of kernel rows small, as the host events' flush interval does.
    if (cupti && t1 - last_cupti_flush > 1'000'000'000) {
      try {
        cupti->flush();
      } catch (const std::exception& e) {
        std::cerr << "wb-train: rank " << rank << ": CUPTI flush failed (" << e.what() << "); kernel rows may be missing\n";
      }
      last_cupti_flush = t1;
    }
#endif
    if (exit_code) {
      ++step;
      break;
    }
  }
#ifdef WB_BACKEND_CUDA
  if (device_queue) {
    const gpu::DeviceQueueStats qs = device_queue->stats();
    writer.set_meta("device_queue_pinned", qs.pinned ? "1" : "0");
    device_queue.reset();  // stops the pipeline too, and unpins its buffers before they are freed
  }
#endif
  pipe.stop();
  backend->synchronize();  // the last step's kernels have run (their CUPTI rows exist)
  progress.finish();

  // 6. eval, checkpoint, clocks, finish
  if (cfg.eval && exit_code == 0) {
    std::vector<float> acc = eval_accuracy(cfg, model, *comm, run, rank);
    if (rank == 0) {
      std::printf("wb-train: eval on %lld test images: top-1 %.2f%%, top-5 %.2f%%\n", static_cast<long long>(acc[2]),
                  acc[0], acc[1]);
    }
    writer.set_meta("eval_top1", std::to_string(acc[0]));
    writer.set_meta("eval_top5", std::to_string(acc[1]));
  }
  if (!cfg.save.empty() && rank == 0) {
    save_checkpoint(cfg.save, model, sgd);
    std::cout << "wb-train: checkpoint saved to " << cfg.save.string() << "\n";
  }
  profiler::ClockSync clock_end = measure_offset(*comms.host);
  rank_row.clock_offset_end_ns = clock_end.offset_ns;
  writer.set_meta("clock_sync_end_ns", std::to_string(clock_end.local_ns));
#ifdef WB_TRAIN_CUPTI
  if (cupti) {
    backend->synchronize();
    cupti.reset();  // hands over every remaining buffer; the Writer counts what CUPTI dropped
  }
#endif
  if (recorder) {
    recorder->stop();
    rank_row.dropped_events = static_cast<int64_t>(recorder->dropped() + writer.dropped());
  }
  writer.set_rank(rank_row);
  writer.set_meta("steps_done", std::to_string(step));
  bool complete = exit_code == 0 ? writer.finish() : (writer.flush(), false);
  if (rank == 0 && writer.dropped() > 0) std::cerr << "wb-train: " << writer.dropped() << " events were dropped\n";

  if (world > 1) {
    comm->barrier();
    if (rank == 0) {
      std::error_code ec;
      if (fs::exists(run_dir / "rank-1.sqlite", ec)) {
        writer.flush();
        store::merge_run(run_dir, run);
        std::cout << "wb-train: merged " << world << " rank files into " << run.string() << "\n";
      } else {
        std::cout << "wb-train: rank files are in " << run_dir.string() << "/ (merge them with: wb merge "
                  << run_dir.string() << ")\n";
      }
    }
  } else if (rank == 0) {
    std::cout << "wb-train: run file " << run.string() << (complete ? "" : " (incomplete)") << "\n";
  }
  return exit_code;
}

}  // namespace wb::trainer
