// What wb-train needs to know about its GPU, without CUDA types, so train.cpp stays host-only code:
// the device's name and size for the run file, and the CUDA backend's compute stream as an opaque
// handle for the NCCL communicator's ordering (NcclCommunicator::set_input_stream). CUDA builds only
// (WB_BACKEND_CUDA); implemented in gpu.cpp.
#pragma once

#include <cstddef>
#include <string>

#include "trainer/backend/backend.hpp"

namespace wb::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;              // "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;      // compute capability
  std::size_t memory_bytes = 0;  // global memory
};

// Throws backend::BackendError when the device cannot be queried.
DeviceInfo device_info(int device);

// The cudaStream_t every op of `backend` (a CUDA backend) is queued on, as void*.
void* compute_stream_handle(backend::Backend& backend);

}  // namespace wb::gpu
