#pragma once
// CPU data parallelism over MPI (Debian's OpenMPI), and the MPI-only services the other layers need:
// clock-offset measurement for the profiler and the byte broadcast NCCL bootstraps with.
//
// Threading: MPI is initialised with MPI_THREAD_MULTIPLE. During a step every bucket allreduce is made
// by GradientSync's communication thread; the main thread makes MPI calls (broadcast, allgather,
// barrier, clock sync) only while no bucket is in flight (before begin_step, after wait_all), so two
// collectives never run at once and every rank issues them in the same order. MULTIPLE is still
// requested because the watchdog calls MPI_Abort from its own thread while the communication thread
// is blocked inside a collective that can never complete.
//
// Errors: the communicator uses MPI_ERRORS_RETURN, so a failed call becomes a DistError naming the
// call, file:line and MPI's message instead of MPI's default abort.

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/world.hpp"

namespace wb::parallel {

// Throws DistError for a non-success MPI return code: "MPI_Allreduce(...) failed at file:line: msg".
void check_mpi(int rc, const char* statement, const char* file, int line);
#define WB_MPI_CHECK(call) ::wb::parallel::check_mpi((call), #call, __FILE__, __LINE__)

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI unless something else already has (then MPI stays theirs to finalise). Works
  // under mpirun and as a singleton (world size 1) without it. Works on a duplicate of
  // MPI_COMM_WORLD, so its collectives never match anybody else's.
  MpiCommunicator();
  // The ranks of `parent` that pass the same `color`, ordered by `key` (MPI_Comm_split; collective
  // over `parent`): a pipeline stage's data-parallel replicas.
  MpiCommunicator(const MpiCommunicator& parent, int color, int key);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  void allreduce(float* data, std::size_t count, ReduceOp op) override;
  void broadcast(float* data, std::size_t count, int root) override;
  void barrier() override;
  std::vector<std::int64_t> allgather(std::span<const std::int64_t> values) override;
  using Communicator::allgather;
  void abort_job(int exit_code) noexcept override;

  void broadcast_bytes(void* data, std::size_t bytes, int root);
  MPI_Comm handle() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool owns_mpi_ = false;
};

// Ping-pong between rank 0 and every other rank (collective: every rank must call it). For each
// peer, `round_trips` times: rank 0 sends t0, the peer answers with its time t1, rank 0 receives at
// t2. The sample with the smallest round trip gives offset = t1 - (t0 + t2) / 2. Returns every
// rank's offset (rank 0's is 0), on every rank. `clock` defaults to now_ns (CLOCK_MONOTONIC).
std::vector<ClockOffset> measure_clock_offsets(MpiCommunicator& comm, int round_trips = 50,
                                               const std::function<std::int64_t()>& clock = {});

}  // namespace wb::parallel
