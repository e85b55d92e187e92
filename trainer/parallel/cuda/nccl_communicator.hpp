#pragma once
// One GPU per rank over NCCL (CUDA builds). Rank 0 creates the ncclUniqueId and broadcasts it over
// MPI; each rank uses the device given (the launcher's local rank). allreduce/broadcast take device
// pointers and return once the result is in place; barrier, allgather and clock sync go over MPI.
// No CUDA or NCCL type appears here, so the header is safe to include from host-only code.
//
// Ordering with compute: a collective first waits for the work enqueued on the input stream
// (set_input_stream), through an event; without one it synchronises the device. The event is the one
// mark_ready(data) recorded for the same buffer when there is one (GradientSync records it the moment a
// bucket's last gradient kernel was queued), else one recorded at the time of the call. The optimizer
// needs no event: allreduce returns only once the collective has completed on the device.
// The wait for completion polls the stream and ncclCommGetAsyncError, so a NCCL failure surfaces as a
// DistError and the watchdog's abort_job (ncclCommAbort, then MPI_Abort) can end a hang.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

struct ncclComm;  // NCCL's handle type (ncclComm_t is a pointer to it)

#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/mpi_communicator.hpp"

namespace wb::parallel {


class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MpiCommunicator& bootstrap, int device);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  const char* backend() const override { return "nccl"; }
  void allreduce(float* device_data, std::size_t count, ReduceOp op) override;
  void broadcast(float* device_data, std::size_t count, int root) override;
  void barrier() override;
  std::vector<std::int64_t> allgather(std::span<const std::int64_t> values) override;
  using Communicator::allgather;
  void abort_job(int exit_code) noexcept override;

  int device() const { return device_; }
  // The MPI communicator over the same ranks that started this one.
  MpiCommunicator& bootstrap() const { return bootstrap_; }
  // Splits this communicator (ncclCommSplit, collective over every rank): the ranks passing the same
  // `color`, ordered by rank. The caller owns the new ncclComm_t. No collective of this one may be in
  // flight meanwhile.
  ::ncclComm* split(int color);
  // A cudaStream_t (passed as void*) whose pending work every collective waits for; nullptr: none.
  void set_input_stream(void* cuda_stream) override { input_stream_ = cuda_stream; }
  // Records, on the input stream, the point the next collective on `device_data` (the same pointer)
  // waits for, instead of the point of its call. Any thread; needs an input stream.
  void mark_ready(const float* device_data) override;

 private:
  void prepare(const float* device_data);  // on the calling thread: select the device, order after the input stream
  void finish(const char* what);  // wait for the collective, polling for NCCL errors

  // comm_, or a DistError naming `what` once abort_job has taken it. Call with comm_mutex_ held.
  ::ncclComm* live_comm(const char* what) const;

  MpiCommunicator& bootstrap_;
  int device_ = 0;
  std::mutex comm_mutex_;   // guards comm_ against abort_job on the watchdog's thread
  std::atomic<void*> comm_{nullptr};  // ncclComm_t; null once aborted
  void* stream_ = nullptr;  // cudaStream_t the collectives run on
  void* event_ = nullptr;   // cudaEvent_t for ordering after the input stream
  void* input_stream_ = nullptr;
  // mark_ready's events, one per buffer (a bucket), and whether one is recorded and not yet waited on.
  struct Mark {
    void* event = nullptr;  // cudaEvent_t
    bool pending = false;
  };
  std::mutex marks_mutex_;
  std::map<const float*, Mark> marks_;
};

}  // namespace wb::parallel
