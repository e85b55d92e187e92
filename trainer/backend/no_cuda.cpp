// The CUDA entry points of a build without the CUDA backend: no devices, and a clear error on request.
#include "trainer/backend/backend.hpp"

namespace wb::backend {

int cuda_device_count() { return 0; }

bool have_cuda_backend() { return false; }

CudaDeviceInfo cuda_device_info(int device) {
  throw BackendError("cuda backend: built without CUDA, so device " + std::to_string(device) + " cannot be queried");
}

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) {
  (void)options;
  throw BackendError(
      "cuda backend: built without CUDA (configure with -DWB_CUDA=ON on a machine with the CUDA toolkit and cuDNN)");
}

}  // namespace wb::backend
