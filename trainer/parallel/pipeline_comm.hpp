// What pipeline parallelism needs from the job's communicator: point-to-point messages between
// neighbouring stages, and one communicator per stage over that stage's data-parallel replicas (its
// gradients' allreduce). The job's ranks are laid out replica-major: rank = replica * stages + stage,
// so one replica's stages are neighbours.
//
// Messages are non-blocking: a send is posted and its buffer kept until it completes; a receive is
// posted early into its buffer and waited for when the schedule needs it. Each transfer reports its
// times (post, start of the wait, end) so the profiler can draw it and attribute the bubbles.
//
// CPU: MPI (Isend/Irecv on a duplicate of the job's communicator, MPI_Comm_split for the stage
// groups). Builds without MPI get a clear error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "trainer/parallel/communicator.hpp"

namespace wb::parallel {

// One message in flight. Waiting twice is harmless.
class Transfer {
 public:
  virtual ~Transfer() = default;
  // Blocks until the message has been delivered (a send: its buffer may be reused).
  virtual void wait() = 0;
  // True once done, without blocking.
  virtual bool test() = 0;
};

class PipelineComm {
 public:
  virtual ~PipelineComm() = default;
  // Posts a send of `count` floats at `data` (host memory, kept alive until the transfer is done).
  virtual std::unique_ptr<Transfer> send(const float* data, std::size_t count, int peer, int tag) = 0;
  // Posts a receive of exactly `count` floats into `data`.
  virtual std::unique_ptr<Transfer> recv(float* data, std::size_t count, int peer, int tag) = 0;
  // The data-parallel group of this rank's stage (every rank of the job holding the same stage).
  virtual Communicator& stage_group() = 0;
};

// Over the job's MPI communicator `world` (an MpiCommunicator). Collective over the whole job.
// Throws DistError in a build without MPI, or when `world` is not MPI.
std::unique_ptr<PipelineComm> make_pipeline_comm(Communicator& world, int stage, int replica);

}  // namespace wb::parallel
