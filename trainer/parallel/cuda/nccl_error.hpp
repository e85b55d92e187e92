#pragma once
// NCCL return codes as exceptions, for the NCCL communicators (CUDA builds; includes nccl.h).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "cuda/check.hpp"

namespace wb::parallel {

// Throws a CUDA-style error naming the call, file:line and NCCL's message for a result other than ncclSuccess.
void check_nccl(ncclResult_t rc, const char* statement, const char* file, int line);

// Waits until `stream` has run everything queued on it, calling `async_error()` (which returns
// ncclCommGetAsyncError's result for the communicator whose collective is queued) between looks, so a
// NCCL failure becomes an error instead of a hang. `what` names the collective in the error.
template <typename AsyncError>
void wait_for_collective(cudaStream_t stream, AsyncError&& async_error, const char* what) {
  while (true) {
    const cudaError_t rc = cudaStreamQuery(stream);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) ::wb::cuda::check(rc, what, __FILE__, __LINE__);
    const ncclResult_t async = async_error();
    if (async != ncclSuccess) check_nccl(async, what, __FILE__, __LINE__);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace wb::parallel

#define WB_NCCL_CHECK(call) ::wb::parallel::check_nccl((call), #call, __FILE__, __LINE__)
