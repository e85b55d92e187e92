#include "trainer/observers.hpp"

#include <chrono>
#include <thread>

#include <algorithm>
#include <cmath>
#include <string>

namespace wb::trainer {
namespace {

store::Category category_of(model::Phase phase) {
  switch (phase) {
    case model::Phase::forward: return store::Category::forward;
    case model::Phase::backward: return store::Category::backward;
    case model::Phase::loss: return store::Category::loss;
    case model::Phase::optimizer: return store::Category::optimizer;
  }
  return store::Category::forward;
}

}  // namespace

profiler::RecorderOptions cap_recorder_pool(profiler::RecorderOptions options, std::int64_t events) {
  if (events <= 0) return options;
  const auto n = static_cast<std::uint64_t>(events);
  options.chunk_records = static_cast<std::uint32_t>(std::min<std::uint64_t>(options.chunk_records, n));
  options.max_chunks = static_cast<std::uint32_t>(
      std::clamp<std::uint64_t>(n / options.chunk_records, 1, options.max_chunks));
  options.initial_chunks = std::min(options.initial_chunks, options.max_chunks);
  return options;
}

StepObserver::StepObserver(profiler::Recorder* recorder, parallel::GradientSync* sync, backend::Backend& backend)
    : profiling_(recorder != nullptr), sync_(sync), backend_(backend) {
  if (recorder) {
    for (const std::string& name : model::ResNet50::module_names()) names_.push_back(recorder->intern(name));
  }
}

void StepObserver::on_module_begin(int module_id, model::Phase phase) {
  if (!profiling_) return;
  if (depth_ < kMaxDepth) open_[static_cast<std::size_t>(depth_)].emplace(names_[static_cast<std::size_t>(module_id)], category_of(phase));
  ++depth_;
}

void StepObserver::on_module_end(int module_id, model::Phase phase) {
  if (module_id == slow_module_ && phase == model::Phase::forward) {
    std::this_thread::sleep_for(std::chrono::microseconds(slow_us_));
  }
  if (!profiling_ || depth_ == 0) return;
  --depth_;
  if (depth_ < kMaxDepth) open_[static_cast<std::size_t>(depth_)].reset();
}

void StepObserver::on_output(std::string_view dump_name, const backend::Tensor& output) {
  if (dump_) dump_->activation(backend_, dump_name, output);
  if (check_finite_ && first_nonfinite_.empty()) {
    host_.resize(static_cast<std::size_t>(output.numel()));
    backend_.to_host(output, host_);
    for (float v : host_) {
      if (!std::isfinite(v)) {
        first_nonfinite_ = "act." + std::string(dump_name);
        break;
      }
    }
  }
}

void StepObserver::on_grads_ready(int first_param, int last_param_exclusive) {
  if (sync_) sync_->on_grads_ready(first_param, last_param_exclusive);
}

DataObserver::DataObserver(profiler::Recorder* recorder, std::string_view queue_name, std::string_view wait_name)
    : profiling_(recorder != nullptr) {
  if (!recorder) return;
  queue_ = recorder->add_counter_track(queue_name);
  wait_name_ = recorder->intern(wait_name);
  batch_name_ = recorder->intern("batch");
  for (std::string_view n : data::transform_names()) transform_names_.push_back(recorder->intern(n));
}

void DataObserver::name_worker(int worker) {
  thread_local int named = -1;
  if (named != worker) {
    profiler::set_thread_name("data-worker-" + std::to_string(worker));
    named = worker;
  }
}

void DataObserver::on_push(int64_t t_ns, int depth_after) {
  if (profiling_) profiler::counter(queue_, depth_after, t_ns);
}

void DataObserver::on_pop(int64_t t_ns, int depth_after) {
  if (profiling_) profiler::counter(queue_, depth_after, t_ns);
}

void DataObserver::on_wait(int64_t begin_ns, int64_t end_ns) {
  wait_ns_.fetch_add(end_ns - begin_ns, std::memory_order_relaxed);
  if (profiling_) profiler::record_range(wait_name_, store::Category::data, begin_ns, end_ns);
}

void DataObserver::on_transform(int worker, int transform_id, int64_t begin_ns, int64_t end_ns) {
  if (!profiling_) return;
  name_worker(worker);
  // Inside the batch range that on_batch records once the batch is assembled: one level deeper.
  profiler::record_range(transform_names_[static_cast<std::size_t>(transform_id)], store::Category::data, begin_ns,
                         end_ns, -1, 1);
}

void DataObserver::on_batch(int worker, int64_t batch_index, int64_t begin_ns, int64_t end_ns) {
  if (!profiling_) return;
  name_worker(worker);
  profiler::record_range(batch_name_, store::Category::data, begin_ns, end_ns, static_cast<std::int32_t>(batch_index));
}

}  // namespace wb::trainer
