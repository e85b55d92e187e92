// The NCCL communicator on real GPUs (CUDA builds): mpirun starts two ranks running wb-parallel-check's
// device checks: allreduce sum/mean and broadcast on device buffers against host double references,
// GradientSync over NCCL, and the ordering after the compute stream that training relies on
// (set_input_stream / mark_ready). With two or more devices each rank has its own; with one, both ranks
// share it: NCCL refuses two ranks of one communicator on one GPU of one host, so each rank gets its
// own NCCL_HOSTID and the two talk through NCCL's network transport on the loopback, a real two-rank
// collective rather than the identity a one-rank world would be. [cuda]: skipped (CTest exit code 77)
// when no CUDA device is present, see tests/support/main.cpp.

#include <catch2/catch.hpp>

#ifdef WB_PARALLEL_NCCL

#include <unistd.h>

#include <cstdio>
#include <string>

#include "cuda/check.hpp"
#include "support/process.hpp"
#include "trainer/parallel/cuda/nccl_communicator.hpp"
#include "support/peers.hpp"

TEST_CASE("NCCL allreduce, broadcast and GradientSync on device buffers", "[cuda][mpi]") {
  const int devices = wb::cuda::device_count();
  REQUIRE(devices > 0);  // the test main skips [cuda] cases without a device
  const int np = 2;
  std::string cmd = std::string(WB_MPIEXEC) + " --oversubscribe --bind-to none" + (geteuid() == 0 ? " --allow-run-as-root" : "");
  if (devices >= 2) {
    cmd += " -np 2 " + std::string(WB_PARALLEL_CHECK) + " nccl";
  } else {
    // One app context per rank, each with its own host id (MPMD: "-np 1 A : -np 1 B").
    for (int r = 0; r < np; ++r) {
      cmd += std::string(r ? " :" : "") + " -np 1 env NCCL_HOSTID=wb-test-host-" + std::to_string(r) + " " +
             WB_PARALLEL_CHECK + " nccl";
    }
  }
  INFO("devices: " << devices << "; " << cmd);
  const wb::test::ProcessResult r = wb::test::run_command(cmd);
  const std::string& out = r.output;
  CAPTURE(out);
  REQUIRE(r.exit_code == 0);
  REQUIRE(out.find("FAIL") == std::string::npos);
  for (const char* check : {"nccl-allreduce-sum ok", "nccl-allreduce-mean ok", "nccl-broadcast ok", "nccl-sync-average ok",
                            "nccl-ordered-marked ok", "nccl-ordered-unmarked ok", "nccl-sync-ordered ok",
                            "nccl-group-sum ok", "nccl-group-max ok", "nccl-group-allgather ok",
                            "nccl-group-reduce-scatter ok", "nccl-group-local ok", "nccl-group-ordered ok"}) {
    CAPTURE(check);
    std::size_t n = 0;
    for (auto pos = out.find(check); pos != std::string::npos; pos = out.find(check, pos + 1)) ++n;
    REQUIRE(n == static_cast<std::size_t>(np));
  }
  std::printf("%s", out.c_str());
}

#endif  // WB_PARALLEL_NCCL
