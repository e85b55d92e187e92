#include "trainer/placement.hpp"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <thread>

#include "trainer/backend/backend.hpp"
#include "trainer/parallel/world.hpp"

namespace wb::trainer {
namespace {

DeviceChoice choose_device(const TrainConfig& cfg, const parallel::LaunchInfo& info) {
  DeviceChoice d;
  d.description = "cpu";
  if (cfg.device == "cpu") return d;
  const int count = backend::cuda_device_count();
  const std::string missing =
      backend::have_cuda_backend()
          ? "no CUDA device found"
          : "this wb-train was built without CUDA (configure with -DWB_CUDA=ON where the CUDA toolkit and cuDNN are "
            "installed)";
  if (count == 0) {
    if (cfg.device == "cuda") throw ConfigError("--device cuda: " + missing);
    // --device auto: the CPU, which computes in fp32 with its own layouts.
    if (cfg.precision != "fp32") {
      throw ConfigError("--precision " + cfg.precision + ": --device auto found no GPU (" + missing +
                        ") and the CPU backend computes in fp32 only");
    }
    if (cfg.channels_last) {
      throw ConfigError("--channels-last: --device auto found no GPU (" + missing +
                        ") and the CPU backend chooses its own layouts");
    }
    if (info.rank == 0) std::cerr << "wb-train: --device auto: " << missing << "; training on the CPU\n";
    return d;
  }
  const int index = info.local_rank / cfg.ranks_per_gpu;
  if (index >= count) {
    throw ConfigError("--device " + cfg.device + ": local rank " + std::to_string(info.local_rank) + " needs CUDA device " +
                      std::to_string(index) + " but " + std::to_string(count) + " are visible (" +
                      std::to_string(cfg.ranks_per_gpu) + " rank(s) per GPU: start at most " +
                      std::to_string(count * cfg.ranks_per_gpu) + " ranks per host, or raise --ranks-per-gpu)");
  }
  d.cuda = true;
  d.index = index;
  d.shared = cfg.ranks_per_gpu > 1;
  const backend::CudaDeviceInfo props = backend::cuda_device_info(d.index);
  d.name = props.name;
  d.memory_bytes = props.memory_bytes;
  d.compute_major = props.compute_major;
  d.description = "cuda:" + std::to_string(d.index) + " (" + d.name + ", " + cfg.precision +
                  (cfg.channels_last ? ", channels-last" : "") + ")";
  return d;
}

Communicators make_communicators(const parallel::LaunchInfo& info, const DeviceChoice& device) {
  Communicators c;
  if (info.world_size == 1) {
    c.host = std::make_unique<parallel::SelfCommunicator>();
    return c;
  }
  if (!parallel::have_mpi()) {
    throw ConfigError("this wb-train was built without MPI (WB_MPI=OFF) and cannot run " +
                      std::to_string(info.world_size) + " ranks");
  }
  c.host = parallel::make_mpi_communicator();
  if (device.cuda) {
    if (!parallel::have_nccl()) {
      throw ConfigError("--device cuda: this wb-train was built without NCCL and cannot run " +
                        std::to_string(info.world_size) + " ranks on GPUs");
    }
    if (device.shared) {
      // NCCL refuses two ranks of one communicator on one GPU of one host; a host id of its own per
      // rank makes each a host of its own to NCCL, and the ranks talk through its network transport.
      char host[256] = {};
      gethostname(host, sizeof host - 1);
      const std::string id = std::string(host) + "-wb-local-rank-" + std::to_string(info.local_rank);
      setenv("NCCL_HOSTID", id.c_str(), 1);
    }
    c.device = parallel::make_nccl_communicator(*c.host, device.index);
  }
  return c;
}

}  // namespace

Placement place_rank(const TrainConfig& cfg) {
  Placement p;
  p.launch = parallel::launch_info();
  p.device = choose_device(cfg, p.launch);
  p.comms = make_communicators(p.launch, p.device);
  p.rank = p.comms.main().rank();
  p.world = p.comms.main().size();
  p.shard = Shard{p.rank, p.world};
  if (!cfg.shard.empty()) {
    if (p.world > 1) {
      throw ConfigError("--shard: a single-process aid, but this job has " + std::to_string(p.world) + " ranks");
    }
    p.shard = parse_shard(cfg.shard);
  }
  p.threads = cfg.threads != 0 ? cfg.threads : parallel::default_threads(p.launch, std::thread::hardware_concurrency());
  return p;
}

}  // namespace wb::trainer
