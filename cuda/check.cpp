#include "cuda/check.hpp"

namespace wb::cuda {

void throw_error(const char* library, const char* statement, const char* file, int line, const char* message) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  cudaGetLastError();  // leave no sticky error behind for the next check
  throw CudaError(std::string(library) + " call " + statement + " failed at " + file + ":" + std::to_string(line) +
                  " (device " + std::to_string(device) + "): " + message);
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return count;
}

}  // namespace wb::cuda
