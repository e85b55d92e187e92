#include "trainer/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace wb::optim {

LrScheduleKind parse_lr_schedule_kind(std::string_view name) {
  if (name == "constant") return LrScheduleKind::constant;
  if (name == "step") return LrScheduleKind::step;
  if (name == "multistep") return LrScheduleKind::multistep;
  if (name == "cosine") return LrScheduleKind::cosine;
  throw LrScheduleError("lr schedule: unknown kind '" + std::string(name) +
                        "', expected constant, step, multistep or cosine");
}

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) {
  const auto& c = config_;
  if (!std::isfinite(c.lr) || c.lr < 0.0) throw LrScheduleError("lr schedule: lr must be finite and >= 0");
  if (c.world_size < 1) throw LrScheduleError("lr schedule: world_size must be >= 1, got " + std::to_string(c.world_size));
  switch (c.kind) {
    case LrScheduleKind::constant: break;
    case LrScheduleKind::step:
      if (c.step_size < 1) throw LrScheduleError("lr schedule step: step_size must be >= 1, got " + std::to_string(c.step_size));
      break;
    case LrScheduleKind::multistep:
      if (!std::is_sorted(c.milestones.begin(), c.milestones.end())) {
        throw LrScheduleError("lr schedule multistep: milestones must be ascending");
      }
      break;
    case LrScheduleKind::cosine:
      if (c.warmup_steps < 0 || c.total_steps <= c.warmup_steps) {
        throw LrScheduleError("lr schedule cosine: need 0 <= warmup_steps < total_steps, got warmup " +
                              std::to_string(c.warmup_steps) + " total " + std::to_string(c.total_steps));
      }
      break;
  }
}

double LrSchedule::unscaled(std::int64_t step) const {
  const auto& c = config_;
  if (step < 0) step = 0;
  switch (c.kind) {
    case LrScheduleKind::constant: return c.lr;
    case LrScheduleKind::step: return c.lr * std::pow(c.gamma, static_cast<double>(step / c.step_size));
    case LrScheduleKind::multistep: {
      auto passed = std::upper_bound(c.milestones.begin(), c.milestones.end(), step) - c.milestones.begin();
      return c.lr * std::pow(c.gamma, static_cast<double>(passed));
    }
    case LrScheduleKind::cosine: {
      const std::int64_t i = std::min(step, c.total_steps - 1);
      if (i < c.warmup_steps) {
        const double inc = (c.lr - c.lr_init) / static_cast<double>(c.warmup_steps);
        return c.lr_init + inc * static_cast<double>(i + 1);
      }
      const double decay_steps = static_cast<double>(c.total_steps - c.warmup_steps);
      const double linear_decay = static_cast<double>(c.total_steps - i) / decay_steps;
      const double cosine_decay =
          0.5 * (1.0 + std::cos(std::numbers::pi * 2.0 * 0.47 * static_cast<double>(i) / decay_steps));
      return c.lr * (linear_decay * cosine_decay + 0.00001);
    }
  }
  return c.lr;
}

double LrSchedule::lr_at(std::int64_t step) const {
  const double lr = unscaled(step);
  return config_.scale_by_world_size ? lr * config_.world_size : lr;
}

}  // namespace wb::optim
