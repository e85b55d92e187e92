// Testing aids that plant faults in a run, all in one place (their flags are parsed in config.cpp):
//   --slow-rank R:MODULE:US  rank R sleeps US microseconds at the end of MODULE's forward every step: a
//                            straggler whose cause (that op) the analyses must find
//   --slow-step S:US         every rank sleeps US microseconds at the end of step S: a slow step for
//                            triggered capture to find
//   --poison-step S          rank 0's batch of step S reads a NaN: a non-finite loss for --on-nonfinite
// The job arms it once (arm: the observer's slow-down); the training loop calls before_forward and
// end_of_step once each per step.
#pragma once

#include <cstdint>
#include <optional>

#include "trainer/batch_source.hpp"
#include "trainer/config.hpp"
#include "trainer/observers.hpp"

namespace wb::trainer {

class FaultInjection {
 public:
  FaultInjection(const TrainConfig& cfg, int rank);

  // --slow-rank on this rank: the observer sleeps at the end of the module's forward.
  void arm(StepObserver& observer) const;
  // --poison-step: poisons the batch of that step on rank 0; throws ConfigError when the batch cannot be.
  void before_forward(std::int64_t step, Batch& batch) const;
  // --slow-step: sleeps at the end of that step.
  void end_of_step(std::int64_t step) const;

 private:
  int rank_;
  std::int64_t poison_step_;
  SlowStep slow_step_;
  std::optional<SlowRank> slow_rank_;
};

}  // namespace wb::trainer
