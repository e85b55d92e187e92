// Checked CUDA runtime calls, for every library that makes them (the CUDA backend, the NCCL
// communicator, the device queue, the CUPTI tracer): one macro, one error type, one device count.
//
//   WB_CUDA_CHECK(cudaMemcpyAsync(...));   // throws wb::cuda::CudaError naming the statement,
//                                          // file:line, device and CUDA's own message
//
// Libraries with vendor calls of their own (cuDNN, cuBLAS, NCCL, CUPTI) report them through
// throw_error with their name, so every vendor failure reads the same. Builds with the CUDA toolkit only.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace wb::cuda {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws CudaError: "<library> call <statement> failed at <file>:<line> (device <d>): <message>", with
// the calling thread's current device; clears CUDA's sticky error first.
[[noreturn]] void throw_error(const char* library, const char* statement, const char* file, int line,
                              const char* message);

inline void check(cudaError_t rc, const char* statement, const char* file, int line) {
  if (rc != cudaSuccess) throw_error("CUDA", statement, file, line, cudaGetErrorString(rc));
}

// Usable CUDA devices: 0 when no driver or device is present. Never throws.
int device_count();

}  // namespace wb::cuda

#define WB_CUDA_CHECK(call) ::wb::cuda::check((call), #call, __FILE__, __LINE__)
