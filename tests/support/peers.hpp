#pragma once
// Where tests and benchmarks find the programs, scripts and Python they run. Each is the path this build
// compiled in (WB_BUILT_<NAME>, set by CMake), unless the environment variable of the same name as the
// macro says otherwise: a test executable carried to another machine (the GPU kit, scripts/gpu-kit) finds
// its peers there. A macro is defined only where its target exists in this build.
//   WB_SOURCE_DIR      the source tree (compare/reference/, tests/*.py, scripts/, bench/*.py)
//   WB_BINARY_DIR      the build tree (bin/wb, bin/wb-train, ...)
//   WB_PYTHON          Python with torch, torchvision and numpy
//   WB_TRAIN, WB_CLI   wb-train and wb
//   WB_PARALLEL_CHECK  wb-parallel-check        WB_MPIEXEC  mpirun

#include <cstdlib>

namespace wb::test {

// $env_name when it is set and not empty, else `built`.
inline const char* configured_path(const char* env_name, const char* built) {
  const char* v = std::getenv(env_name);
  return v && *v ? v : built;
}

}  // namespace wb::test

#ifdef WB_BUILT_SOURCE_DIR
#define WB_SOURCE_DIR ::wb::test::configured_path("WB_SOURCE_DIR", WB_BUILT_SOURCE_DIR)
#endif
#ifdef WB_BUILT_BINARY_DIR
#define WB_BINARY_DIR ::wb::test::configured_path("WB_BINARY_DIR", WB_BUILT_BINARY_DIR)
#endif
#ifdef WB_BUILT_PYTHON
#define WB_PYTHON ::wb::test::configured_path("WB_PYTHON", WB_BUILT_PYTHON)
#endif
#ifdef WB_BUILT_TRAIN
#define WB_TRAIN ::wb::test::configured_path("WB_TRAIN", WB_BUILT_TRAIN)
#endif
#ifdef WB_BUILT_CLI
#define WB_CLI ::wb::test::configured_path("WB_CLI", WB_BUILT_CLI)
#endif
#ifdef WB_BUILT_PARALLEL_CHECK
#define WB_PARALLEL_CHECK ::wb::test::configured_path("WB_PARALLEL_CHECK", WB_BUILT_PARALLEL_CHECK)
#endif
#ifdef WB_BUILT_MPIEXEC
#define WB_MPIEXEC ::wb::test::configured_path("WB_MPIEXEC", WB_BUILT_MPIEXEC)
#endif
