#pragma once
// The collectives data-parallel training needs, behind one small interface:
//   SelfCommunicator  one process, no MPI (world size 1: every collective is the identity);
//   MpiCommunicator   CPU ranks over MPI (mpi_communicator.hpp);
//   NcclCommunicator  one GPU per rank (cuda/nccl_communicator.hpp, CUDA builds).
// Buffers passed to allreduce/broadcast live where the backend's tensors live: host memory for Self
// and MPI, device memory for NCCL. allgather always works on host integers (small bookkeeping).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace wb::parallel {

enum class ReduceOp { sum, mean };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "self", "mpi" or "nccl"

  // In place: on return `data` holds the sum (or mean) over all ranks, on every rank.
  virtual void allreduce(float* data, std::size_t count, ReduceOp op) = 0;
  // In place: on return every rank holds root's `data`.
  virtual void broadcast(float* data, std::size_t count, int root) = 0;
  virtual void barrier() = 0;
  // Every rank gives the same number of integers; returns them all, rank-major.
  virtual std::vector<std::int64_t> allgather(std::span<const std::int64_t> values) = 0;
  std::vector<std::int64_t> allgather(std::int64_t value) { return allgather(std::span(&value, 1)); }

  // Ends every rank of the job now, with `exit_code`: the watchdog's last resort when a peer is lost
  // and a collective can never complete. MPI and NCCL do not return. A single process has no peer
  // to lose, so SelfCommunicator returns without doing anything.
  virtual void abort_job(int exit_code) noexcept = 0;

  // Optional, for communicators over device memory (NCCL); no-ops elsewhere.
  // Orders every collective after the work pending on `stream` (an opaque cudaStream_t; null: none).
  virtual void set_input_stream(void* stream) { (void)stream; }
  // Records, on the input stream, the point the next collective on `data` (the same pointer) waits
  // for, instead of the point of its call: GradientSync calls it when a bucket's gradients are queued.
  virtual void mark_ready(const float* data) { (void)data; }
};

class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "self"; }
  void allreduce(float*, std::size_t, ReduceOp) override {}
  void broadcast(float*, std::size_t, int root) override;
  void barrier() override {}
  std::vector<std::int64_t> allgather(std::span<const std::int64_t> values) override;
  using Communicator::allgather;
  void abort_job(int) noexcept override {}
};

// FNV-1a over the bytes of `data`: equal on two ranks when their buffers are bit-identical.
std::uint64_t fingerprint(const float* data, std::size_t count);

// True when every rank's `data` (host memory) is bit-identical to rank 0's: one small allgather of
// fingerprints. Checks the data-parallel invariant "identical parameters after every step".
bool identical_across_ranks(Communicator& comm, const float* data, std::size_t count);

}  // namespace wb::parallel
