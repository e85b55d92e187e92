// Triggered capture (wb-train --capture): the recorder's event rows (ranges, counters, kernels,
// allreduce spans) are held in memory per step, and only the steps of a captured window reach the run
// file; the step table is written in full whatever is captured.
//
//   slow:K     a step longer than K x the running median of the steps before it keeps the N steps
//              before it, itself and the N steps after it (N = --capture-window). Step S's events stay
//              in memory until step S+N has ended (a ring of about N+1 steps), then are written or freed.
//   signal     SIGUSR1 (the handler only sets a flag) keeps the N steps after the one it arrived in.
//   steps:A-B  keeps steps A..B.
//
// Windows that overlap merge into one. Every rank takes the same decision: the trainer ORs the ranks'
// triggers of a step (Capture::triggers) in one tiny allreduce and hands the result to end_step, so each
// rank file keeps the same windows. Rows outside any step (step -1: before the first step) are dropped.
// Memory rows (trainer/memory_profile.hpp) do not come here: what is alive at a step is the sum of every
// allocation before it, so they are written whole, like the step table.
// Each window becomes a capture_window row (store/schema.sql) once all its steps are decided.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "store/rows.hpp"

namespace wb::store {
class Writer;
}

namespace wb::profiler {

enum class CaptureMode : std::uint8_t { full, slow, signal, steps };

struct CaptureConfig {
  CaptureMode mode = CaptureMode::full;
  double factor = 0.0;        // slow:K
  std::int64_t first = 0;     // steps:A-B
  std::int64_t last = 0;
  std::int64_t window = 5;    // --capture-window N: steps kept on each side (slow) or after (signal)
};

// Parses --capture's value and --capture-window; throws ProfilerError, one line naming the flag, unless
// the text is slow:K (K > 1), signal or steps:A-B (0 <= A <= B) and the window is at least 1.
CaptureConfig parse_capture(std::string_view text, std::int64_t window);
// "slow:3 (window 5)", "signal (window 5)", "steps:10-20"; "full" for CaptureMode::full.
std::string describe(const CaptureConfig& config);

// Trigger bits of a step, ORed over the ranks.
inline constexpr unsigned kTriggerSlow = 1;
inline constexpr unsigned kTriggerSignal = 2;

class Capture {
 public:
  // Installs the SIGUSR1 handler for CaptureMode::signal (and restores the previous one when destroyed).
  Capture(store::Writer& writer, CaptureConfig config, int rank);
  ~Capture();
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  // Event rows from the recorder (any thread): written at once when their step is decided, else held.
  void hold(std::span<const store::RangeRow> rows);
  void hold(std::span<const store::CounterRow> rows, std::span<const std::int32_t> steps);  // a step per row
  void hold(std::span<const store::KernelRow> rows);  // no step: placed by time among the steps' spans
  void hold(const store::AllreduceRow& row);

  // This rank's triggers at the end of `step`, which took duration_ns (steps in increasing order). Slow:
  // against the median of up to the last 100 steps before it, once 5 steps are behind it.
  unsigned triggers(std::int64_t step, std::int64_t duration_ns);
  // The job's triggers of `step` (this rank's ORed with the others') and the step's end on rank 0's
  // clock: opens or extends windows, writes the events of decided steps in a window, frees the others.
  void end_step(std::int64_t step, unsigned triggers, std::int64_t end_ns);
  // After the last step (and after the recorder's last drain): windows are cut at the last step, what
  // they hold is written, with a capture_window row each. Idempotent.
  void finish();

  // Windows so far (complete after finish()).
  std::vector<store::CaptureWindowRow> windows() const;
  // Steps whose events were written so far.
  std::int64_t steps_kept() const;

 private:
  struct Bucket {
    std::vector<store::RangeRow> ranges;
    std::vector<store::CounterRow> counters;
    std::vector<store::KernelRow> kernels;
    std::vector<store::AllreduceRow> allreduces;
  };
  struct Window {
    store::CaptureWindowRow row;
    int merged = 0;       // further triggers merged into it
    bool written = false;
  };
  bool kept(std::int64_t step) const;
  bool decided(std::int64_t step) const { return step <= decided_through_; }
  // The step a kernel starting at t_ns belongs to (-2: after the last ended step, not placed yet).
  std::int64_t step_at(std::int64_t t_ns) const;
  void open_window(std::int64_t first, std::int64_t last, const char* trigger, std::int64_t trigger_step,
                   const std::string& detail);
  void release_decided();
  void write(Bucket& bucket);

  store::Writer& writer_;
  const CaptureConfig config_;
  const int rank_;
  mutable std::mutex mutex_;
  std::map<std::int64_t, Bucket> held_;                 // undecided steps' rows
  std::vector<store::KernelRow> unplaced_;              // kernels later than the last ended step
  std::deque<std::pair<std::int64_t, std::int64_t>> spans_;  // (step, end_ns) of recent steps, ascending
  std::vector<Window> windows_;
  std::deque<std::int64_t> history_;                    // recent step times, oldest first
  std::string slow_detail_;                             // this rank's view of its last step
  bool local_slow_ = false;                             // this rank's triggers of its last step
  bool local_signal_ = false;
  std::int64_t decided_through_ = -1;                   // every step <= this is decided
  std::int64_t first_step_ = -1;                        // the first step ended (a resumed run starts later)
  std::int64_t last_step_ = -1;                         // the last step ended
  bool finished_ = false;
  bool handler_installed_ = false;
};

}  // namespace wb::profiler
