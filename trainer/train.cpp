// wb-train's job on one rank, in phases:
//   place_rank      who am I (launcher), which device, communicators, data shard, threads (placement.cpp)
//   open_recording  the run file (Writer), the profiler (Recorder; CUPTI on GPUs), clock offset to rank 0
//   make_learner    backend, ResNet-50, SGD, LR schedule; resume; parameters broadcast from rank 0
//   make_gradients  allreduce buckets and GradientSync (allreduce overlapped with backward)
//   start_input     the data pipeline, and on a GPU the device prefetch queue: a BatchSource
//                   (these four set the job up: job.hpp, job_setup.cpp)
//   train           the steps (below), each a StepSchedule's forward_backward: DataParallelStep
//                   (data_parallel_step.hpp) or PipelineStep (pipeline_step.hpp); the testing aids that
//                   plant faults act through one FaultInjection (fault_injection.hpp)
//   finish          eval, checkpoint, end-of-run clock offset, the run file, merging the rank files
//
// The step reads like the algorithm: pop a batch, forward and loss, backward (buckets allreduce as
// gradients finish), wait for the gradients, update, record. How forward and backward run over the
// model is a StepSchedule: data parallel today; pipeline schedules and SyncBN's collectives add theirs.
//
// On a GPU the backend keeps parameters, gradients and momentum in device memory, and whatever reads
// them on the host goes through to_host (check-sync, checkpoints, dumps); the batches come from the
// device prefetch queue; the allreduce runs over NCCL, ordered after the gradient kernels. None of it
// needs a preprocessor branch here: each GPU part has a stand-in in builds without it.
#include "trainer/train.hpp"

#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "profiler/record/capture.hpp"
#include "profiler/record/clock_sync.hpp"
#include "profiler/record/recorder.hpp"
#include "store/merge.hpp"
#include "store/writer.hpp"
#include "trainer/batch_source.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/data_parallel_step.hpp"
#include "trainer/dump/dump.hpp"
#include "trainer/fault_injection.hpp"
#include "trainer/fc_shard.hpp"
#include "trainer/gpu_trace.hpp"
#include "trainer/input.hpp"
#include "trainer/job.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/memory_profile.hpp"
#include "trainer/observers.hpp"
#include "trainer/optim/lr_schedule.hpp"
#include "trainer/optim/sgd.hpp"
#include "trainer/parallel/buckets.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/world.hpp"
#include "trainer/pipeline_plan.hpp"
#include "trainer/pipeline_step.hpp"
#include "trainer/placement.hpp"
#include "trainer/progress.hpp"
#include "trainer/sync_bn.hpp"
#include "trainer/step_schedule.hpp"

namespace wb::trainer {
namespace fs = std::filesystem;
namespace {

// ---- the step ---------------------------------------------------------------------------------------

// Everything the loop touches.
struct Job {
  const TrainConfig& cfg;
  Placement& place;
  Recording& rec;
  Learner& learner;
  Input& input;
  StepObserver& observer;
  StepSchedule& schedule;
  ShardedClassifier* fc_shard;  // null without --shard-fc
  const FaultInjection& faults;
};

// The step-N dump, when this is its step and rank: the batch and the state the step starts from.
// A sharded classifier's slices are gathered on every rank of its group, dumping or not, and the step's
// forward gathers the full logits of each rank's rows (the dump's act.fc).
std::unique_ptr<dump::StepDump> start_dump(Job& job, std::int64_t step, Batch& batch) {
  if (step != job.cfg.dump_step) return nullptr;
  const model::ResNet50& model = *job.learner.model;
  const bool dumping = job.cfg.dumps_on(job.place.rank);
  if (!dumping && !model.fc_sharded()) return nullptr;
  if (job.fc_shard) job.fc_shard->set_full_logits(true);
  const std::vector<float> params = model.full_to_host(model.param_buffer());
  if (!dumping) return nullptr;
  auto dump = std::make_unique<dump::StepDump>(*job.rec.writer, static_cast<int>(step), job.place.rank,
                                               job.cfg.dump_kinds);
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  batch.to_host(images, labels);
  dump->before_step(model, params, images, labels);
  if (job.input.train_set.kind == data::DatasetKind::kImageFolder) {
    job.rec.writer->set_meta("dump_input.rank" + std::to_string(job.place.rank),
                             describe_image_batch(job.input.train_set, *job.input.pipeline, step).dump());
  }
  return dump;
}

// The end of the dumped step: the gradients, parameters and momentum the step left (a sharded
// classifier's gathered on every rank of its group, as in start_dump).
void finish_dump(Job& job, dump::StepDump* dump, float loss) {
  model::ResNet50& model = *job.learner.model;
  if (!dump && !model.fc_sharded()) return;
  if (job.fc_shard) job.fc_shard->set_full_logits(false);
  const std::vector<float> grads = model.full_to_host(model.grad_buffer());
  const std::vector<float> params = model.full_to_host(model.param_buffer());
  const std::vector<float> momentum = model.full_to_host(model.momentum_buffer());
  if (dump) dump->after_step(model, loss, grads, params, momentum);
}

// Data parallelism's invariant: every rank holds the same parameters after every step (BN running
// statistics are per rank by design and not checked; a sharded classifier's slices differ by design).
// A collective on all ranks; false on a mismatch.
bool parameters_agree(Job& job, std::int64_t step) {
  parallel::Communicator& comm = job.place.comms.main();
  std::vector<float> params = job.learner.model->params_to_host();  // the buffer may live on a GPU
  params.resize(replicated_params(*job.learner.model));
  if (parallel::identical_across_ranks(comm, params.data(), params.size())) return true;
  // One write, so the ranks' lines do not interleave on the shared stderr.
  std::ostringstream msg;
  msg << "wb-train: rank " << job.place.rank << ": --check-sync: parameters differ across ranks after step " << step
      << " (this rank's fingerprint " << parallel::fingerprint(params.data(), params.size()) << ")\n";
  std::cerr << msg.str() << std::flush;
  return false;
}

void record_step(Job& job, const store::StepRow& row) {
  if (job.rec.memory) job.rec.memory->flush();
  if (job.rec.recorder) {
    job.rec.recorder->add(row);
    return;
  }
  store::StepRow r = row;
  const profiler::ClockMap clock(job.rec.clock_start);
  r.start_ns = clock.to_rank0(row.start_ns);
  r.end_ns = clock.to_rank0(row.end_ns);
  job.rec.writer->add(r);
}

// Batch-norm running statistics before a step, so --on-nonfinite skip can undo what a poisoned
// forward did to them.
struct SavedStatistics {
  std::vector<float> running;
  std::vector<std::int64_t> tracked;
  void take(model::ResNet50& model) {
    running = model.running_stats_to_host();
    tracked.assign(model.num_batches_tracked().begin(), model.num_batches_tracked().end());
  }
  void restore(model::ResNet50& model) {
    model.running_stats_from_host(running);
    std::copy(tracked.begin(), tracked.end(), model.num_batches_tracked().begin());
  }
};

// Whether `mine` holds on any rank (one tiny allreduce on the host communicator).
bool any_rank(parallel::Communicator& comm, bool mine) {
  float flag = mine ? 1.0f : 0.0f;
  if (comm.size() > 1) comm.allreduce(&flag, 1, parallel::ReduceOp::sum);
  return flag > 0.0f;
}

// Triggered capture: this rank's triggers of the step ORed with every other rank's (one tiny allreduce),
// so every rank file keeps the same windows; then the capture decides what the step's events become.
void end_capture_step(Job& job, const store::StepRow& row) {
  profiler::Capture& capture = *job.rec.capture;
  const unsigned mine = capture.triggers(row.step, row.end_ns - row.start_ns);
  float flags[2] = {(mine & profiler::kTriggerSlow) ? 1.0f : 0.0f, (mine & profiler::kTriggerSignal) ? 1.0f : 0.0f};
  parallel::Communicator& comm = *job.place.comms.host;
  if (comm.size() > 1) comm.allreduce(flags, 2, parallel::ReduceOp::sum);
  const unsigned all = (flags[0] > 0.0f ? profiler::kTriggerSlow : 0u) | (flags[1] > 0.0f ? profiler::kTriggerSignal : 0u);
  const profiler::ClockMap clock = job.rec.recorder->clock();
  capture.end_step(row.step, all, clock.to_rank0(row.end_ns));
}

// A non-finite loss: one line naming the step, the loss and where it first appeared, and a record in
// the run file (meta.nonfinite: a JSON array with an entry per rank and step).
void report_nonfinite(Job& job, std::int64_t step, float loss, nlohmann::json& log) {
  const int rank = job.place.rank;
  const bool skip = job.cfg.on_nonfinite == "skip";
  const std::string& tensor = job.observer.first_nonfinite();
  const bool mine = !std::isfinite(loss) || !tensor.empty();
  const std::string loss_text = std::isnan(loss) ? "nan" : !std::isfinite(loss) ? (loss > 0 ? "inf" : "-inf")
                                                                                 : std::to_string(loss);
  std::ostringstream msg;
  if (mine) {
    msg << "wb-train: rank " << rank << ": " << (std::isfinite(loss) ? "non-finite values" : "loss is " + loss_text)
        << " at step " << step;
    if (!tensor.empty()) {
      msg << "; first non-finite tensor: " << tensor;
      if (std::isfinite(loss)) msg << " (the loss, " << loss_text << ", stayed finite)";
    } else if (job.cfg.check_finite) {
      msg << "; every activation was finite: it appeared in the loss";
    } else {
      msg << "; rerun with --check-finite (or --dump-step " << step << ") to find the first non-finite tensor";
    }
  } else if (rank == 0) {
    msg << "wb-train: step " << step << ": another rank met non-finite values";
  }
  if (mine || rank == 0) {
    msg << (skip ? "; the step's update is skipped (--on-nonfinite skip)\n"
                 : "; stopping (--on-nonfinite stop; lower --lr, or skip such steps with --on-nonfinite skip)\n");
    std::cerr << msg.str() << std::flush;  // one write, so the ranks' lines do not interleave
  }
  nlohmann::json entry = {{"step", step}, {"rank", rank}, {"action", skip ? "skip" : "stop"}};
  entry["loss"] = std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(loss_text);
  if (!tensor.empty()) {
    entry["first_tensor"] = tensor;
  } else if (mine && job.cfg.check_finite) {
    entry["first_tensor"] = "loss";
  } else {
    entry["first_tensor"] = nullptr;  // unknown without --check-finite, or another rank's
  }
  log.push_back(entry);
  job.rec.writer->set_meta("nonfinite", log.dump());
}

struct TrainResult {
  int exit_code = 0;
  std::int64_t steps_done = 0;
};

// The steps. On a GPU the host runs at most about one step ahead of the device: forward reads the
// loss back, so the step rows' host times track the device's pace without a synchronize per step.
TrainResult train(Job& job) {
  const TrainConfig& cfg = job.cfg;
  const int rank = job.place.rank, world = job.place.world;
  model::ResNet50& model = *job.learner.model;
  BatchSource& batches = *job.input.source;
  profiler::Recorder* recorder = job.rec.recorder.get();
  const profiler::NameId step_name = recorder ? recorder->intern("step") : 0;
  Progress progress(rank == 0, job.input.total_steps, job.input.steps_per_epoch,
                    cfg.batch_size * (world / cfg.pipeline_stages), cfg.log_every);
  int64_t last_trace_flush = profiler::now_ns();
  TrainResult result;
  const bool skip_nonfinite = cfg.on_nonfinite == "skip";
  SavedStatistics saved;
  nlohmann::json nonfinite_log = nlohmann::json::array();
  job.observer.set_check_finite(cfg.check_finite);
  int64_t step = job.learner.start_step;
  for (; step < job.input.total_steps; ++step) {
    if (store::Writer::stop_requested()) {
      if (rank == 0) std::cerr << "wb-train: stopping on signal after step " << step << "; the run stays incomplete\n";
      result.exit_code = 1;
      break;
    }
    profiler::set_step(static_cast<int32_t>(step));
    const double lr = job.learner.schedule->lr_at(step);
    store::StepRow row{rank, static_cast<int32_t>(step), profiler::now_ns(), 0, 0, 0, 0.0, lr, cfg.batch_size};
    float loss = 0.0f;
    bool nonfinite = false;
    {
      profiler::Range step_range(step_name, store::Category::step);
      Batch& batch = batches.pop(step);                                     // wait for data
      row.data_wait_ns = batches.take_wait_ns();
      if (step == cfg.dump_step) job.schedule.before_dump(step);
      job.faults.before_forward(step, batch);
      std::unique_ptr<dump::StepDump> dump = start_dump(job, step, batch);
      job.observer.set_dump(job.schedule.dumps_activations() ? nullptr : dump.get());
      job.observer.reset_nonfinite();
      if (skip_nonfinite) saved.take(model);
      loss = job.schedule.forward_backward(batch, step, row.comm_exposed_ns);   // forward, loss, backward, gradients
      job.observer.set_dump(nullptr);
      // Every rank takes the same decision: a non-finite loss anywhere has poisoned the averaged gradients.
      // With --check-finite a non-finite activation counts too, even where a later op hid it (the CPU
      // backend's ReLU turns a NaN into 0, where PyTorch's keeps it).
      nonfinite = any_rank(*job.place.comms.host,
                           !std::isfinite(loss) || !job.observer.first_nonfinite().empty());
      if (!nonfinite) {
        job.learner.sgd->step(model, static_cast<float>(lr), job.schedule.own_segments(model));  // update
      } else if (skip_nonfinite) {
        saved.restore(model);  // the forward's batch-norm statistics go too
      }
      batch.step_done();
      if (step == cfg.dump_step) {
        job.schedule.after_dump(step, dump.get());
        finish_dump(job, dump.get(), loss);
      }
      job.faults.end_of_step(step);
    }
    row.end_ns = profiler::now_ns();
    row.loss = loss;
    if (job.rec.capture) end_capture_step(job, row);
    if (cfg.check_sync && world > 1 && !parameters_agree(job, step)) result.exit_code = 1;
    if (nonfinite) {
      report_nonfinite(job, step, loss, nonfinite_log);
      if (!skip_nonfinite) result.exit_code = 1;
    }
    record_step(job, row);
    progress.step(step, loss, row.end_ns - row.start_ns, row.data_wait_ns);
    // CUPTI hands its buffers over when they fill; flushing about once a second keeps a killed run's
    // loss of kernel rows small, as the host events' flush interval does.
    if (job.rec.gpu_trace && row.end_ns - last_trace_flush > 1'000'000'000) {
      job.rec.gpu_trace->flush();
      last_trace_flush = row.end_ns;
    }
    if (result.exit_code) {
      ++step;
      break;
    }
  }
  result.steps_done = step;
  job.input.source->finish(*job.rec.writer);
  if (job.cfg.skip_bad_images) {
    const data::PipelineStats st = job.input.pipeline->stats();
    job.rec.writer->set_meta("bad_images.rank" + std::to_string(job.place.rank), std::to_string(st.bad_images));
    if (st.bad_images > 0) {
      std::fprintf(stderr, "wb-train: rank %d skipped %lld bad image(s) (--skip-bad-images); the first: %s\n",
                   job.place.rank, static_cast<long long>(st.bad_images), st.first_bad_image.c_str());
    }
  }
  job.learner.backend->synchronize();  // the last step's kernels have run (their CUPTI rows exist)
  progress.finish();
  return result;
}

// ---- the end ----------------------------------------------------------------------------------------

int finish(const TrainConfig& cfg, Placement& place, Recording& rec, Learner& learner, const TrainResult& result) {
  store::Writer& writer = *rec.writer;
  const int rank = place.rank;
  if (cfg.eval && result.exit_code == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    const Accuracy acc = evaluate(cfg, *learner.model, place.comms.main(), rec.run);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0) {
      std::printf("wb-train: eval on %lld %s images: top-1 %.2f%%, top-5 %.2f%% (%.1f s)\n",
                  static_cast<long long>(acc.images), cfg.data == "imagefolder" ? "validation" : "test", acc.top1,
                  acc.top5, seconds);
      writer.add(store::EvaluationRow{static_cast<std::int32_t>(result.steps_done), acc.top1, acc.top5, acc.images,
                                      seconds});
    }
    writer.set_meta("eval_top1", std::to_string(acc.top1));
    writer.set_meta("eval_top5", std::to_string(acc.top5));
  }
  // A checkpoint holds the whole model: a sharded classifier's slices are gathered on every rank.
  const model::ResNet50& model = *learner.model;
  if (!cfg.save.empty() && (rank == 0 || model.fc_sharded())) {
    const std::vector<float> params = model.full_to_host(model.param_buffer());
    const std::vector<float> momentum = model.full_to_host(model.momentum_buffer());
    if (rank == 0) {
      save_checkpoint(cfg.save, model, *learner.sgd, params, momentum);
      std::cout << "wb-train: checkpoint saved to " << cfg.save.string() << "\n";
    }
  }
  const profiler::ClockSync clock_end = measure_offset(*place.comms.host);
  rec.rank_row.clock_offset_end_ns = clock_end.offset_ns;
  writer.set_meta("clock_sync_end_ns", std::to_string(clock_end.local_ns));
  if (rec.gpu_trace) {
    learner.backend->synchronize();
    rec.gpu_trace.reset();  // hands over every remaining buffer; the Writer counts what CUPTI dropped
  }
  if (rec.recorder) {
    // The recorder's own cost per host event on this machine now (wb report: x events per step).
    char ns[32];
    std::snprintf(ns, sizeof ns, "%.2f", profiler::measure_ns_per_event());
    writer.set_meta("profiler_ns_per_event", ns);
    rec.memory.reset();  // its last rows; what is freed from here on is not recorded
    rec.recorder->stop();
    if (rec.capture) {
      rec.capture->finish();  // after the recorder's last drain: the windows are cut at the last step
      if (rank == 0) {
        std::cout << "wb-train: --capture " << cfg.capture << ": kept the events of " << rec.capture->steps_kept()
                  << " of " << result.steps_done - learner.start_step << " steps in " << rec.capture->windows().size()
                  << " window(s); the step table holds every step\n";
      }
    }
    rec.rank_row.dropped_events = static_cast<int64_t>(rec.recorder->dropped() + writer.dropped());
  }
  writer.set_rank(rec.rank_row);
  writer.set_meta("steps_done", std::to_string(result.steps_done));
  const bool complete = result.exit_code == 0 ? writer.finish() : (writer.flush(), false);
  if (rank == 0 && writer.dropped() > 0) std::cerr << "wb-train: " << writer.dropped() << " events were dropped\n";

  if (place.world > 1) {
    place.comms.main().barrier();
    if (rank == 0) {
      std::error_code ec;
      if (fs::exists(rec.run_dir / "rank-1.sqlite", ec)) {
        writer.flush();
        store::merge_run(rec.run_dir, rec.run);
        std::cout << "wb-train: merged " << place.world << " rank files into " << rec.run.string() << "\n";
      } else {
        std::cout << "wb-train: rank files are in " << rec.run_dir.string() << "/ (merge them with: wb merge "
                  << rec.run_dir.string() << ")\n";
      }
    }
  } else if (rank == 0) {
    std::cout << "wb-train: run file " << rec.run.string() << (complete ? "" : " (incomplete)") << "\n";
  }
  return result.exit_code;
}

}  // namespace

// --save: a checkpoint file in a folder that exists. Checked on every rank before training, so a bad
// path is one line at the start, not a failure of rank 0 alone after the last step.
void check_save_path(const fs::path& save) {
  if (save.empty()) return;
  std::error_code ec;
  if (fs::is_directory(save, ec))
    throw ConfigError("--save " + save.string() + ": is a folder, expected the checkpoint's file (F.safetensors)");
  const fs::path dir = save.has_parent_path() ? save.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw ConfigError("--save " + save.string() + ": the folder " + dir.string() + " does not exist");
}

int run_training(const TrainConfig& cfg_in) {
  TrainConfig cfg = cfg_in;
  check_save_path(cfg.save);
  Placement place = place_rank(cfg);
  cfg.threads = place.threads;  // the run file records the threads that ran
  check_fc_shard(cfg, place.world);  // before anything is written
  const PipelinePlan plan = plan_pipeline(cfg, place.world);
  if (plan.stages > 1) place.shard = Shard{seat_of(plan, place.rank).replica, plan.replicas};  // a replica's stages read one shard
  Recording rec = open_recording(cfg, place);
  // --shard-fc: the classifier's slice and its rank groups (null: off), before the model is built.
  std::unique_ptr<ShardedClassifier> fc_shard =
      make_fc_shard(cfg, place.rank, place.world, *place.comms.host, place.comms.device.get(), rec.recorder.get());
  if (fc_shard) rec.writer->set_meta("fc_shard_group_size", std::to_string(fc_shard->shards()));
  Input input = open_input(cfg, place, rec.run);
  Learner learner = make_learner(cfg, place, input.total_steps, fc_shard.get());
  // Steps count from 0 everywhere a user sees them (--dump-step, the run file, wb report).
  if (cfg.dump_step >= 0 && (cfg.dump_step < learner.start_step || cfg.dump_step >= input.total_steps)) {
    throw ConfigError("--dump-step " + std::to_string(cfg.dump_step) + ": this run trains steps " +
                      std::to_string(learner.start_step) + " to " + std::to_string(input.total_steps - 1) +
                      " (counted from 0), so that step would never be dumped");
  }
  std::ostringstream banner;
  banner << "wb-train: " << place.world << " rank(s), " << place.threads << " thread(s) each, "
         << place.device.description << ", " << cfg.data << " (" << input.train_set.size() << " images), batch "
         << cfg.batch_size << ", " << cfg.image_size << "x" << cfg.image_size << ", " << input.total_steps << " steps\n";
  Gradients gradients = make_gradients(cfg, place, learner, rec, banner.str());
  // --sync-bn: each batch norm's statistics over a group of ranks (null: off).
  std::unique_ptr<SyncBatchNorm> sync_bn =
      make_sync_bn(cfg, place.rank, place.world, *place.comms.host, place.comms.device.get(), rec.recorder.get());
  if (sync_bn) rec.writer->set_meta("sync_bn_group_size", std::to_string(sync_bn->group_size()));
  // On GPUs their NCCL exchanges take turns with the gradient buckets (parallel::CollectiveOrder).
  if (gradients.sync && place.comms.device) {
    if (sync_bn) sync_bn->order_with(gradients.sync.get());
    if (fc_shard) fc_shard->order_with(gradients.sync.get());
  }
  learner.model->set_batchnorm_sync(sync_bn.get());
  StepObserver observer(rec.recorder.get(), gradients.sync.get(), *learner.backend);
  const FaultInjection faults(cfg, place.rank);
  faults.arm(observer);
  learner.model->set_observer(&observer);
  start_input(cfg, place, input, learner, rec);
  std::unique_ptr<StepSchedule> schedule;
  if (plan.active()) {
    rec.writer->set_meta("pipeline_json", pipeline_json(plan));
    if (place.rank == 0) std::cout << "wb-train: pipeline " << describe_pipeline(plan) << "\n" << std::flush;
    schedule = std::make_unique<PipelineStep>(cfg, plan, place.rank, place.comms.main(), *learner.model, &observer,
                                              PipelineRecording{rec.writer.get(), rec.recorder.get(), rec.clock_start.offset_ns});
  } else {
    schedule = std::make_unique<DataParallelStep>(*learner.model, gradients.sync.get(), rec.recorder.get());
  }
  Job job{cfg, place, rec, learner, input, observer, *schedule, fc_shard.get(), faults};
  const TrainResult result = train(job);
  // A checkpoint holds the whole model: a pipeline's stages first hand rank 0 their parts.
  if (plan.active() && !cfg.save.empty()) schedule->after_dump(result.steps_done, nullptr);
  try {
    return finish(cfg, place, rec, learner, result);
  } catch (const std::exception& e) {
    if (place.world <= 1) throw;
    // One rank failed after training (its checkpoint could not be written, say): the others would wait
    // for it in the closing collectives. Say why, naming the rank, and end the whole job.
    std::cerr << "wb-train: rank " << place.rank << ": " << e.what() << "\n" << std::flush;
    place.comms.main().abort_job(1);
    throw;
  }
}

}  // namespace wb::trainer
