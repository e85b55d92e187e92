// How wb-train watches itself: one ModelObserver that turns module begin/end into profiler ranges,
// hands finished gradients to the allreduce buckets and copies forward outputs into a step dump; and
// one data::Observer that records a batch queue's depth, the consumer's waits and each worker's
// transforms. On a GPU two queues are watched: the host pipeline's ("batch queue", consumed by the
// device queue's copy thread) and the device queue's ("device_queue", consumed by the training loop).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "trainer/data/observer.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/dump/dump.hpp"
#include "trainer/model/observer.hpp"
#include "trainer/model/resnet50.hpp"

namespace wb::trainer {

// --profile-buffer-events N (a diagnosis aid): caps the recorder's chunk pool at N events in all, so a
// run outgrowing it drops events and counts them (rank.dropped_events, `wb report`'s warning).
// N <= 0 leaves the options as they are.
profiler::RecorderOptions cap_recorder_pool(profiler::RecorderOptions options, std::int64_t events);

class StepObserver final : public model::ModelObserver {
 public:
  // `recorder` null: no ranges. `sync` null: single process, nothing to reduce.
  StepObserver(profiler::Recorder* recorder, parallel::GradientSync* sync, backend::Backend& backend);

  void set_dump(dump::StepDump* dump) { dump_ = dump; }
  // --slow-rank: sleep `us` microseconds at the end of module `module_id`'s forward, inside its range.
  void slow_down(int module_id, std::int64_t us) {
    slow_module_ = module_id;
    slow_us_ = us;
  }
  // --check-finite: every output is copied to the host and checked for NaN/Inf; the first one of a
  // step is kept (its dump name, "act.<module>") until reset_nonfinite().
  void set_check_finite(bool on) { check_finite_ = on; }
  void reset_nonfinite() { first_nonfinite_.clear(); }
  const std::string& first_nonfinite() const { return first_nonfinite_; }

  void on_module_begin(int module_id, model::Phase phase) override;
  void on_module_end(int module_id, model::Phase phase) override;
  bool wants_outputs() const override { return dump_ != nullptr || check_finite_; }
  void on_output(std::string_view dump_name, const backend::Tensor& output) override;
  void on_grads_ready(int first_param, int last_param_exclusive) override;

 private:
  static constexpr int kMaxDepth = 16;
  bool profiling_ = false;
  std::vector<profiler::NameId> names_;  // module id -> interned name
  std::array<std::optional<profiler::Range>, kMaxDepth> open_;
  int depth_ = 0;
  parallel::GradientSync* sync_;
  backend::Backend& backend_;
  dump::StepDump* dump_ = nullptr;
  int slow_module_ = -1;
  std::int64_t slow_us_ = 0;
  bool check_finite_ = false;
  std::string first_nonfinite_;
  std::vector<float> host_;  // scratch for the finiteness check
};

class DataObserver final : public data::Observer {
 public:
  // queue_name: the counter track of the queue's depth; wait_name: the ranges of the consumer's waits.
  explicit DataObserver(profiler::Recorder* recorder, std::string_view queue_name = "batch queue",
                        std::string_view wait_name = "data_wait");

  void on_push(int64_t t_ns, int depth_after) override;
  void on_pop(int64_t t_ns, int depth_after) override;
  void on_wait(int64_t begin_ns, int64_t end_ns) override;
  void on_transform(int worker, int transform_id, int64_t begin_ns, int64_t end_ns) override;
  void on_batch(int worker, int64_t batch_index, int64_t begin_ns, int64_t end_ns) override;

  // Consumer time blocked on the queue since the last call. Atomic: on a GPU the host queue's
  // consumer is the device queue's copy thread, not the thread that reads this.
  int64_t take_wait_ns() { return wait_ns_.exchange(0, std::memory_order_relaxed); }

 private:
  void name_worker(int worker);
  bool profiling_ = false;
  profiler::CounterTrack queue_;
  profiler::NameId wait_name_ = 0;
  profiler::NameId batch_name_ = 0;
  std::vector<profiler::NameId> transform_names_;
  std::atomic<int64_t> wait_ns_{0};
};

}  // namespace wb::trainer
