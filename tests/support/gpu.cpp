#include "support/gpu.hpp"

#if WB_TEST_CUDA
#include <cuda_runtime_api.h>

#include "cuda/check.hpp"
#endif

namespace wb::test {

#if WB_TEST_CUDA

int cuda_device_count() { return ::wb::cuda::device_count(); }

// The runtime's own words for why there is no device.
std::string why_no_gpu() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
  }
  return count > 0 ? "" : "no CUDA device (cudaGetDeviceCount found none)";
}

#else

int cuda_device_count() { return 0; }

std::string why_no_gpu() { return "no CUDA device: this build has no CUDA (configure with -DWB_CUDA=ON)"; }

#endif

}  // namespace wb::test
