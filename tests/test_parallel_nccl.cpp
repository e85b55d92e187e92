// The NCCL communicator on real GPUs (CUDA builds): mpirun starts one rank per visible device (at most
// two; NCCL refuses two ranks on one GPU) running wb-parallel-check's device checks: allreduce sum/mean
// and broadcast on device buffers against host double references, and GradientSync over NCCL. [cuda]:
// skipped (CTest exit code 77) when no CUDA device is present, see tests/support/main.cpp.

#include <catch2/catch.hpp>

#ifdef WB_PARALLEL_NCCL

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda/check.hpp"
#include "support/process.hpp"
#include "trainer/parallel/cuda/nccl_communicator.hpp"

TEST_CASE("NCCL allreduce, broadcast and GradientSync on device buffers", "[cuda][mpi]") {
  const int devices = wb::cuda::device_count();
  REQUIRE(devices > 0);  // the test main skips [cuda] cases without a device
  const int np = std::min(devices, 2);
  const std::string cmd = std::string(WB_MPIEXEC) + " -np " + std::to_string(np) + " --oversubscribe --bind-to none" +
                          (geteuid() == 0 ? " --allow-run-as-root" : "") + " " + WB_PARALLEL_CHECK + " nccl";
  const wb::test::ProcessResult r = wb::test::run_command(cmd);
  const std::string& out = r.output;
  CAPTURE(out);
  REQUIRE(r.exit_code == 0);
  REQUIRE(out.find("FAIL") == std::string::npos);
  for (const char* check : {"nccl-allreduce-sum ok", "nccl-allreduce-mean ok", "nccl-broadcast ok", "nccl-sync-average ok"}) {
    CAPTURE(check);
    std::size_t n = 0;
    for (auto pos = out.find(check); pos != std::string::npos; pos = out.find(check, pos + 1)) ++n;
    REQUIRE(n == static_cast<std::size_t>(np));
  }
  std::printf("%s", out.c_str());
}

#endif  // WB_PARALLEL_NCCL
