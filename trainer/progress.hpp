// The progress line of rank 0: a live bar on a terminal, plain periodic lines otherwise (logs, CI).
#pragma once

#include <cstdint>
#include <cstdio>

namespace wb::trainer {

class Progress {
 public:
  Progress(bool enabled, int64_t total_steps, int64_t steps_per_epoch, int64_t images_per_step, int log_every);
  void step(int64_t step, float loss, int64_t step_ns, int64_t wait_ns);
  void finish();

 private:
  bool enabled_;
  bool tty_;
  int64_t total_, per_epoch_, images_per_step_;
  int64_t every_;
  int64_t window_steps_ = 0, window_ns_ = 0, window_wait_ns_ = 0;
  int64_t elapsed_ns_ = 0;
  double loss_ema_ = 0.0;
  bool have_loss_ = false;
  bool printed_bar_ = false;
};

}  // namespace wb::trainer
