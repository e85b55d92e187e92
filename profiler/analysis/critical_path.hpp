// The critical path of a data-parallel step across ranks: the chain of work that set the step's end.
//
// Built from a wb-train run's rows: each rank's main-thread ranges directly under the step (module
// forward and backward, loss, the wait for the allreduces, the optimizer, the data wait), and every
// bucket's allreduce on every rank. Dependencies:
//   - program order on a rank's main thread;
//   - the wait for the allreduces ends with the rank's last collective;
//   - a collective completes once the last rank has joined it: it starts at the latest of the ranks'
//     start times; that rank joined when its bucket's last gradient was ready (the backward range that
//     produced it) or, when its communication thread was still busy, when the previous collective ended.
// The walk starts at the end of the step on the rank that ended last and goes back along whichever
// dependency was the latest, until the step's start. Time on a rank's thread that no range covers is a
// segment of its own ("(gap)"), so the segments cover the whole path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct PathSegment {
  int rank = 0;
  std::string name;      // "layer3.0.conv2", "allreduce bucket 2", "(gap)"
  std::string kind;      // forward, backward, loss, optimizer, data, comm, collective, gap, ...
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::uint32_t track = 0;  // its thread or stream track (device_critical_path); 0: the rank's main thread
};

struct StepPath {
  int step = 0;
  std::int64_t start_ns = 0;  // the earliest rank's step start
  std::int64_t end_ns = 0;    // the latest rank's step end
  std::vector<PathSegment> segments;  // in time order
};

struct PathOp {
  std::string name;
  std::string kind;
  int steps = 0;             // steps whose path holds it
  std::int64_t total_ns = 0; // its time on the path, over those steps
};

struct CriticalPath {
  std::vector<StepPath> steps;
  std::vector<PathOp> ops;   // by time on the path, descending
  std::int64_t path_ns = 0;  // all steps' path time
};

// Every step that each rank recorded with allreduce rows. A pipeline run (pipeline_span rows) gets
// pipeline_critical_path's instead, and a run with device activity but no allreduce rows (a GPU trace)
// device_critical_path's; empty for a run with none of them.
CriticalPath critical_path(const RunData& run);

// The critical path of each step of a pipeline run (wb-train --pipeline-stages), across its stages.
// Built from pipeline_span: a stage's forwards, backwards and receive waits in program order, and each
// message from its send to its receive. The walk starts at the end of the stage that finished the step
// last and goes back through the stage's work; at a receive whose message was posted after the stage
// began to wait for it, it goes on at the sender, from the moment the sender posted it (the transfer is
// a "comm" segment on the receiver); a receive whose message was already posted is the stage's own
// "comm" time. Time on a stage that nothing covers is a "gap" segment named "(bubble)": the segments
// cover the step from its first stage's start to its last stage's end.
CriticalPath pipeline_critical_path(const RunData& run);

// The critical path of each step of a GPU trace (an imported PyTorch profile, or a wb-train CUDA run
// without allreduce rows), across its ranks. Each step (every rank's step row) ends on the rank whose
// step range, or the last device activity launched in it, ended last. The walk goes back from there:
//   - on a host thread, through the innermost range at each moment (its self time: "runtime" for CUDA
//     calls), and a stretch no range covers is a "(gap)";
//   - a synchronising call (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, a
//     blocking cudaMemcpy) waited for the device: the walk goes on at the device activity of that rank,
//     launched before the call, that ended last before it returned ("sync" segment);
//   - a device activity (named after the op that launched it, kind "kernel" or "memcpy") started after
//     whichever came later, the previous activity on its stream or its launch: the launching runtime
//     call's end, and the wait between them is a "(launch)" segment; the walk goes on at the call on the
//     host, or at the previous activity ("(gap)" between them when neither explains its start);
//   - an NCCL kernel ("collective") completes once the last rank has joined: its peers on the other
//     ranks are the NCCL kernels of the same name that overlap it, the one ending nearest to it on each
//     rank (sampled traces lose collectives, so matching by order would pair the wrong ones); the walk
//     goes on at the peer that started last.
// Dependencies the trace does not record (cudaStreamWaitEvent across streams) leave "(gap)" segments.
CriticalPath device_critical_path(const RunData& run);

// Per op (name and kind) the time on the steps' paths and in how many steps, the ops by that time.
CriticalPath summarize_paths(std::vector<StepPath> steps);

}  // namespace wb::analysis
