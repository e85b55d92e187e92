#include "trainer/fault_injection.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "layout/resnet50.hpp"

namespace wb::trainer {

FaultInjection::FaultInjection(const TrainConfig& cfg, int rank)
    : rank_(rank),
      poison_step_(cfg.poison_step),
      slow_step_(cfg.slow_step.empty() ? SlowStep{} : parse_slow_step(cfg.slow_step)) {
  if (!cfg.slow_rank.empty()) slow_rank_ = parse_slow_rank(cfg.slow_rank);
}

void FaultInjection::arm(StepObserver& observer) const {
  if (!slow_rank_ || (slow_rank_->rank != rank_ && slow_rank_->rank != SlowRank::kAll)) return;
  const int module = layout::module_id(slow_rank_->module);  // validate() checked the name
  if (module >= 0) observer.slow_down(module, slow_rank_->us);
}

void FaultInjection::before_forward(std::int64_t step, Batch& batch) const {
  if (step == poison_step_ && rank_ == 0 && !batch.poison()) {
    throw ConfigError("--poison-step: this run's batches cannot be poisoned (a testing aid for CPU runs)");
  }
}

void FaultInjection::end_of_step(std::int64_t step) const {
  if (step == slow_step_.step) std::this_thread::sleep_for(std::chrono::microseconds(slow_step_.us));
}

}  // namespace wb::trainer
