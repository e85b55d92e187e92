#pragma once
// Learning-rate schedules, evaluated per optimizer step (0-based):
//   constant:   lr
//   step:       lr * gamma^floor(step / step_size)                     (torch StepLR)
//   multistep:  lr * gamma^(number of milestones <= step)             (torch MultiStepLR)
//   cosine:     the seed guide's warm-up + cosine, MindSpore's _generate_cosine_lr(lr_init, lr_end,
//               lr_max = lr, total_steps, warmup_steps): linear warm-up from lr_init to lr over
//               warmup_steps, then lr * ((total - i) / decay * 0.5 * (1 + cos(2 * pi * 0.47 * i / decay))
//               + 1e-5) with decay = total - warmup. Steps past the end keep the last step's value.
// With scale_by_world_size the result is multiplied by world_size (the linear scaling rule).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace wb::optim {

class LrScheduleError : public std::invalid_argument {
 public:
  explicit LrScheduleError(const std::string& what) : std::invalid_argument(what) {}
};

enum class LrScheduleKind { constant, step, multistep, cosine };

// "constant", "step", "multistep", "cosine"; throws LrScheduleError naming the accepted values.
LrScheduleKind parse_lr_schedule_kind(std::string_view name);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::constant;
  double lr = 0.1;                       // base rate; lr_max for cosine
  std::int64_t step_size = 1;            // step
  double gamma = 0.1;                    // step, multistep
  std::vector<std::int64_t> milestones;  // multistep, ascending
  double lr_init = 0.0;                  // cosine: warm-up start
  double lr_end = 0.0;                   // cosine: part of MindSpore's signature; its formula ignores it
  std::int64_t total_steps = 0;          // cosine
  std::int64_t warmup_steps = 0;         // cosine
  bool scale_by_world_size = false;
  int world_size = 1;
};

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleConfig& config);  // validates; throws LrScheduleError
  double lr_at(std::int64_t step) const;
  const LrScheduleConfig& config() const { return config_; }

 private:
  double unscaled(std::int64_t step) const;
  LrScheduleConfig config_;
};

}  // namespace wb::optim
