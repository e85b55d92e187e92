#include "trainer/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace wb::trainer {
namespace {

// Under mpirun every rank's stdout is a pseudo-terminal, whatever the user's stdout is; the launching
// process records the truth in WB_STDOUT_TTY.
bool stdout_is_tty() {
  if (const char* v = std::getenv("WB_STDOUT_TTY")) return v[0] == '1';
  return isatty(STDOUT_FILENO) != 0;
}

}  // namespace

Progress::Progress(bool enabled, int64_t total_steps, int64_t steps_per_epoch, int64_t images_per_step, int log_every)
    : enabled_(enabled),
      tty_(stdout_is_tty()),
      total_(total_steps),
      per_epoch_(std::max<int64_t>(1, steps_per_epoch)),
      images_per_step_(images_per_step),
      every_(log_every > 0 ? log_every : (tty_ ? 1 : std::clamp<int64_t>(total_steps / 20, 1, 100))) {}

void Progress::step(int64_t step, float loss, int64_t step_ns, int64_t wait_ns) {
  if (!enabled_) return;
  window_steps_ += 1;
  window_ns_ += step_ns;
  window_wait_ns_ += wait_ns;
  elapsed_ns_ += step_ns;
  loss_ema_ = have_loss_ ? 0.9 * loss_ema_ + 0.1 * loss : loss;
  have_loss_ = true;
  const int64_t done = step + 1;
  if (done % every_ != 0 && done != total_ && done != 1) return;
  const double secs = window_ns_ * 1e-9;
  const double ips = secs > 0 ? window_steps_ * images_per_step_ / secs : 0.0;
  const double wait_pct = window_ns_ > 0 ? 100.0 * window_wait_ns_ / window_ns_ : 0.0;
  const double eta = done > 0 ? elapsed_ns_ * 1e-9 / done * (total_ - done) : 0.0;
  // Steps and epochs count from 0 everywhere a user sees them (--dump-step, the run file, wb report,
  // torch.profiler's ProfilerStep#0, msprobe's step0); [done/total] counts the steps finished.
  const int epoch = static_cast<int>(step / per_epoch_);
  if (tty_) {
    const int width = 24;
    const int fill = static_cast<int>(width * done / std::max<int64_t>(1, total_));
    std::printf("\r[%.*s%*s] step %lld [%lld/%lld]  epoch %d  loss %.4f  %.0f img/s  data-wait %.1f%%  ETA %.0fs   ",
                fill, "########################", width - fill, "", static_cast<long long>(step),
                static_cast<long long>(done), static_cast<long long>(total_), epoch, loss_ema_, ips, wait_pct, eta);
    printed_bar_ = true;
  } else {
    std::printf("step %lld [%lld/%lld]  epoch %d  loss %.4f  %.0f img/s  data-wait %.1f%%  ETA %.0fs\n",
                static_cast<long long>(step), static_cast<long long>(done), static_cast<long long>(total_), epoch,
                loss_ema_, ips, wait_pct, eta);
  }
  std::fflush(stdout);
  window_steps_ = window_ns_ = window_wait_ns_ = 0;
}

void Progress::finish() {
  if (enabled_ && printed_bar_) std::printf("\n");
  std::fflush(stdout);
}

}  // namespace wb::trainer
