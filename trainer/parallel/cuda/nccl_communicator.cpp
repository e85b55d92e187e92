#include "trainer/parallel/cuda/nccl_communicator.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "cuda/check.hpp"
#include "trainer/parallel/cuda/nccl_error.hpp"
#include "trainer/parallel/error.hpp"

namespace wb::parallel {

void check_nccl(ncclResult_t rc, const char* statement, const char* file, int line) {
  if (rc != ncclSuccess) ::wb::cuda::throw_error("NCCL", statement, file, line, ncclGetErrorString(rc));
}

NcclCommunicator::NcclCommunicator(MpiCommunicator& bootstrap, int device) : bootstrap_(bootstrap), device_(device) {
  const int devices = ::wb::cuda::device_count();
  if (device < 0 || device >= devices) {
    throw DistError("NCCL: rank " + std::to_string(bootstrap.rank()) + " asked for CUDA device " + std::to_string(device) +
                    " but " + std::to_string(devices) + " device(s) are visible; expected one device per rank on each host");
  }
  ncclUniqueId id{};
  if (bootstrap_.rank() == 0) WB_NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap_.broadcast_bytes(&id, sizeof id, 0);
  WB_CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t stream = nullptr;
  WB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t event = nullptr;
  WB_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  event_ = event;
  ncclComm_t comm = nullptr;
  WB_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap_.size(), id, bootstrap_.rank()));
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  for (auto& [data, mark] : marks_) cudaEventDestroy(static_cast<cudaEvent_t>(mark.event));
  if (void* comm = comm_.load()) ncclCommDestroy(static_cast<ncclComm_t>(comm));
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void NcclCommunicator::mark_ready(const float* device_data) {
  if (!input_stream_) throw DistError("NcclCommunicator::mark_ready: no input stream (set_input_stream first)");
  WB_CUDA_CHECK(cudaSetDevice(device_));  // called from whichever thread queued the kernels
  std::lock_guard lock(marks_mutex_);
  Mark& mark = marks_[device_data];
  if (!mark.event) {
    cudaEvent_t event = nullptr;
    WB_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    mark.event = event;
  }
  WB_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(mark.event), static_cast<cudaStream_t>(input_stream_)));
  mark.pending = true;
}

void NcclCommunicator::prepare(const float* device_data) {
  // The current device is per host thread, and collectives run on the communication thread.
  WB_CUDA_CHECK(cudaSetDevice(device_));
  if (input_stream_) {
    // cudaStreamWaitEvent waits for the event's most recent record as of this call, so a mark
    // re-recorded for the next step later cannot loosen this wait.
    cudaEvent_t marked = nullptr;
    {
      std::lock_guard lock(marks_mutex_);
      auto it = marks_.find(device_data);
      if (it != marks_.end() && it->second.pending) {
        marked = static_cast<cudaEvent_t>(it->second.event);
        it->second.pending = false;
        WB_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), marked, 0));
      }
    }
    if (!marked) {
      WB_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(input_stream_)));
      WB_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event_), 0));
    }
  } else {
    WB_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void NcclCommunicator::finish(const char* what) {
  wait_for_collective(static_cast<cudaStream_t>(stream_), [&] {
    ncclResult_t async = ncclSuccess;
    std::lock_guard lock(comm_mutex_);  // abort_job may free the handle from the watchdog's thread
    WB_NCCL_CHECK(ncclCommGetAsyncError(live_comm(what), &async));
    return async;
  }, what);
}

void NcclCommunicator::allreduce(float* device_data, std::size_t count, ReduceOp op) {
  prepare(device_data);
  {
    std::lock_guard lock(comm_mutex_);
    WB_NCCL_CHECK(ncclAllReduce(device_data, device_data, count, ncclFloat, op == ReduceOp::mean ? ncclAvg : ncclSum,
                                live_comm("ncclAllReduce"), static_cast<cudaStream_t>(stream_)));
  }
  finish("ncclAllReduce");
}

void NcclCommunicator::broadcast(float* device_data, std::size_t count, int root) {
  if (root < 0 || root >= size()) {
    throw DistError("broadcast: root " + std::to_string(root) + " is not a rank of a world of size " +
                    std::to_string(size()));
  }
  prepare(device_data);
  {
    std::lock_guard lock(comm_mutex_);
    WB_NCCL_CHECK(ncclBroadcast(device_data, device_data, count, ncclFloat, root, live_comm("ncclBroadcast"),
                                static_cast<cudaStream_t>(stream_)));
  }
  finish("ncclBroadcast");
}

void NcclCommunicator::barrier() {
  WB_CUDA_CHECK(cudaSetDevice(device_));
  WB_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  bootstrap_.barrier();
}

std::vector<std::int64_t> NcclCommunicator::allgather(std::span<const std::int64_t> values) {
  return bootstrap_.allgather(values);
}

void NcclCommunicator::abort_job(int exit_code) noexcept {
  // Unblocks kernels waiting on a lost peer, then ends every rank. The handle has one owner: the abort
  // takes it under the lock that finish() polls under, so the communication thread never touches a
  // freed communicator (it finds none, and fails with a clear error, until MPI ends the job).
  std::lock_guard lock(comm_mutex_);
  if (void* comm = comm_.exchange(nullptr)) ncclCommAbort(static_cast<ncclComm_t>(comm));
  bootstrap_.abort_job(exit_code);
}

ncclComm_t NcclCommunicator::split(int color) {
  WB_CUDA_CHECK(cudaSetDevice(device_));
  ncclComm_t part = nullptr;
  std::lock_guard lock(comm_mutex_);
  WB_NCCL_CHECK(ncclCommSplit(live_comm("ncclCommSplit"), color, rank(), &part, nullptr));
  return part;
}

ncclComm_t NcclCommunicator::live_comm(const char* what) const {
  void* comm = comm_.load();
  if (!comm) throw DistError(std::string(what) + ": the NCCL communicator was aborted");
  return static_cast<ncclComm_t>(comm);
}

bool have_nccl() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& mpi, int device) {
  auto* bootstrap = dynamic_cast<MpiCommunicator*>(&mpi);
  if (!bootstrap) throw DistError(std::string("NCCL: needs an MPI communicator to start, got ") + mpi.backend());
  return std::make_unique<NcclCommunicator>(*bootstrap, device);
}

}  // namespace wb::parallel
