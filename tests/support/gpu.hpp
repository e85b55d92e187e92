#pragma once
// Whether GPU tests can run here. GPU test cases carry the tag [cuda]; the test main (support/main.cpp)
// skips them, with exit code kSkipExitCode when nothing else was selected, where there is no device.

#include <string>

namespace wb::test {

// CTest's SKIP_RETURN_CODE of the GPU tests (tests/CMakeLists.txt): the test did not run.
inline constexpr int kSkipExitCode = 77;

// CUDA devices the CUDA runtime sees (cudaGetDeviceCount); 0 without a driver or device, and in builds
// without CUDA.
int cuda_device_count();

// Why GPU tests cannot run here: "" when a CUDA device is present.
std::string why_no_gpu();

}  // namespace wb::test
