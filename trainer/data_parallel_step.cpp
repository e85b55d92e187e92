#include "trainer/data_parallel_step.hpp"

namespace wb::trainer {

float DataParallelStep::forward_backward(Batch& batch, std::int64_t step, std::int64_t& comm_ns) {
  if (sync_) sync_->begin_step(static_cast<int>(step));
  const float loss = batch.forward(model_);
  batch.forward_done();
  model_.backward();
  if (sync_) {
    const std::int64_t c0 = profiler::now_ns();
    sync_->wait_all();
    comm_ns = profiler::now_ns() - c0;
    profiler::record_range(wait_name_, store::Category::comm, c0, c0 + comm_ns);
  }
  return loss;
}

}  // namespace wb::trainer
