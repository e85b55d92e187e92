// A short calibration of the communicator before the first step (wb-train --calibrate-comm): what one
// allreduce costs per message size when nothing else runs, what it costs while the backend computes, and
// how much the compute slows while a collective runs. The split model (profiler/analysis/split_model.hpp)
// predicts from these rows instead of fitting the run's own allreduce spans, which include the wait for
// the slowest rank.
//
// Every measurement starts after a barrier, so no rank's lateness is in it. Rows, per rank:
//   allreduce                 bytes = message size; the collective alone
//   compute                   bytes = 0; one calibration convolution (forward and both backwards), alone
//   allreduce_during_compute  bytes = bucket size (4 KiB, 64 KiB, 1 MiB, 16 MiB and the largest message,
//                             those up to it); as in backward: between two convolutions the compute
//                             thread marks a bucket ready and a communication thread, woken, allreduces
//                             it; from the mark (or the previous collective's end) to the collective's end
//   compute_during_allreduce  bytes = bucket size; the convolutions meanwhile
//   compute_while_waiting     bytes = 4096; a convolution while this rank's communication thread waits in
//                             a collective that the other ranks join one convolution later (as the rank
//                             that joins a bucket first waits in backward)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/rows.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/parallel/communicator.hpp"

namespace wb::trainer {

struct CalibrationOptions {
  std::int64_t max_bytes = 0;       // the largest message (the job's gradient bytes); sizes x4 from 4 KiB
                                    // to 1 MiB, x2 above
  int batch = 8;                    // the calibration convolution's batch
  int image = 16;                   // and its input size: 64 -> 64 channels, 3x3
  double budget_s = 3.0;            // rough cap on the whole calibration
};

// Runs the calibration on every rank (a collective call: every rank must call it, in the same order as
// its other collectives) and returns this rank's rows. `comm` speaks `backend`'s memory.
std::vector<store::CommCalibrationRow> calibrate_comm(parallel::Communicator& comm, backend::Backend& backend,
                                                      const CalibrationOptions& options);

// One line for the log: "allreduce 4 KiB 31 us, ...; while computing: 4 KiB 2.1 ms, ...; compute x1.02 (4 KiB), ...".
std::string describe_calibration(const std::vector<store::CommCalibrationRow>& rows);

}  // namespace wb::trainer
