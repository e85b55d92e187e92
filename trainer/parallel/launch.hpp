#pragma once
// Who am I, and how to start N of me. Rank, world size and local rank come from the launcher's
// environment (OpenMPI's mpirun, or a PMI launcher such as MPICH's hydra); without a launcher the
// process is rank 0 of 1. `wb-train --nproc N` relaunches itself under mpirun on this host so a user
// never writes a launch script:
//   mpirun -np N --oversubscribe --bind-to none [--allow-run-as-root] -x VAR... <this binary> <args minus --nproc>
// --oversubscribe lets N exceed the core count on small machines; --bind-to none keeps each rank's
// compute threads free to use every core (mpirun would otherwise pin each rank to one core). When
// running as root, OpenMPI refuses to start without --allow-run-as-root and the two
// OMPI_ALLOW_RUN_AS_ROOT* variables, so both are set. Shared memory (the vader BTL) is left to
// OpenMPI's default selection.

#include <map>
#include <span>
#include <string>
#include <vector>

namespace wb::parallel {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // index among the ranks on this host: the GPU to use
  int local_size = 1;  // ranks on this host
  std::string launcher = "none";  // "openmpi", "pmi" or "none"
};

using Environment = std::map<std::string, std::string>;

// Reads OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, else PMI_RANK/PMI_SIZE (local rank from
// MPI_LOCALRANKID/MPI_LOCALNRANKS when present, else rank/size), else rank 0 of 1. Throws DistError
// naming the variable when a value is not a valid rank or size.
LaunchInfo launch_info_from(const Environment& env);
LaunchInfo launch_info();  // from this process's environment

// Compute threads per rank: the host's hardware threads shared among the ranks on it (at least 1).
int default_threads(const LaunchInfo& info, unsigned hardware_threads);

// The arguments without "--nproc N" / "--nproc=N".
std::vector<std::string> strip_nproc(std::span<const std::string> args);

// The full mpirun command line (program first). `args` are this program's arguments (without argv[0]);
// `env` decides which variables are forwarded with -x (PATH, LD_LIBRARY_PATH, OMP_*, WB_*, NCCL_*,
// CUDA_VISIBLE_DEVICES, ... when set). The mpirun program is $WB_MPIRUN when set, else "mpirun".
std::vector<std::string> mpirun_command(int nproc, const std::string& self_exe, std::span<const std::string> args,
                                        bool as_root, const Environment& env);

// Replaces this process with `mpirun -np nproc ... /proc/self/exe argv[1..] minus --nproc`. Returns
// only by throwing DistError: nproc < 1, already running under a launcher, or mpirun cannot be run.
[[noreturn]] void relaunch_under_mpirun(int nproc, int argc, char** argv);

}  // namespace wb::parallel
