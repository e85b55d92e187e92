// CUDA builds only (train.cmake adds this file when the CUDA backend is built).
#include "trainer/gpu/gpu.hpp"

#include "trainer/backend/cuda/cuda_backend.hpp"

namespace wb::gpu {

DeviceInfo device_info(int device) {
  cudaDeviceProp prop{};
  WB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

void* compute_stream_handle(backend::Backend& backend) {
  return static_cast<void*>(backend::cuda::compute_stream(backend));
}

}  // namespace wb::gpu
