// The communicators of a job, whatever this build was compiled with: every function exists in every
// build, and says what the build lacks instead of leaving the caller to test macros.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "trainer/parallel/communicator.hpp"

namespace wb::parallel {

// Whether this build has the MPI communicator (WB_MPI) and the NCCL one (CUDA toolkit with NCCL).
bool have_mpi();
bool have_nccl();

// The MPI communicator over the whole job. Throws DistError in a build without MPI.
std::unique_ptr<Communicator> make_mpi_communicator();
// NCCL over the ranks of `mpi` (which broadcasts NCCL's id and must outlive the result), one CUDA
// device per rank. Throws DistError in a build without NCCL, or when `mpi` is not an MPI communicator.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& mpi, int device);

// One rank's clock relative to rank 0's: rank0_time = local_time - offset_ns.
struct ClockOffset {
  std::int64_t offset_ns = 0;
  std::int64_t round_trip_ns = 0;  // smallest round trip seen; |error| of offset_ns <= round_trip_ns / 2
};

// This rank's clock offset to rank 0, from `round_trips` ping-pongs (measure_clock_offsets); a
// collective. nullopt where there is nothing to measure: a single process, or not MPI.
std::optional<ClockOffset> offset_to_rank0(Communicator& comm, int round_trips);

}  // namespace wb::parallel
