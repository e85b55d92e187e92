// What pipeline parallelism needs from the job's communicator: point-to-point messages between
// neighbouring stages, and one communicator per stage over that stage's data-parallel replicas (its
// gradients' allreduce). The job's ranks are laid out replica-major: rank = replica * stages + stage,
// so one replica's stages are neighbours.
//
// Activations and their gradients live where the backend's tensors live, and go non-blocking: a send
// is posted and its buffer kept until it completes; a receive is posted into its buffer and waited
// for when the schedule needs it. Each transfer reports its times (post, start of the wait, end) so
// the profiler can draw it and attribute the bubbles. Small host-memory messages (the step's loss, a
// dump's gathers) are blocking and always go over MPI.
//
// CPU: MPI (Isend/Irecv on a duplicate of the job's communicator, MPI_Comm_split for the stage
// groups); receives may be posted early, long before they are waited for.
// GPU (CUDA builds, the job's communicator is NCCL): ncclSend/ncclRecv on a communicator of their own,
// issued on a dedicated stream after the work queued so far on the compute stream. NCCL matches each
// pair of ranks' messages in issue order and runs one rank's operations in that order, so a receive
// is posted only when it is needed, and a rank that sends and receives at the same point posts both as
// one group (ncclGroupStart/End); the stage groups are NCCL communicators over MPI_Comm_split's groups.
// Builds without MPI get a clear error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "trainer/parallel/communicator.hpp"

namespace wb::parallel {

// One message in flight. Waiting twice is harmless.
class Transfer {
 public:
  virtual ~Transfer() = default;
  // Blocks until the message has been delivered (a send: its buffer may be reused; a receive: its
  // data may be read, by the host or by work queued on the compute stream from now on).
  virtual void wait() = 0;
  // True once done, without blocking.
  virtual bool test() = 0;
};

// A send of `count` floats at `data` to `peer`, or a receive of exactly `count` floats into `data`.
// MPI matches by tag; NCCL by order (the tag is then only for the error messages).
struct Message {
  bool send = true;
  float* data = nullptr;
  std::size_t count = 0;
  int peer = -1;
  int tag = 0;
};

class PipelineComm {
 public:
  virtual ~PipelineComm() = default;
  // Posts `messages` together and returns their transfers, in order. Buffers are backend memory (host
  // for MPI, device for NCCL) and must stay alive until their transfer is done.
  virtual std::vector<std::unique_ptr<Transfer>> post(std::span<const Message> messages) = 0;
  // Whether a receive may be posted long before it is waited for (MPI), or only where it is needed,
  // grouped with the sends of that point (NCCL).
  virtual bool early_receives() const = 0;
  // Blocking messages of host memory, over MPI whatever the device.
  virtual void send_host(const float* data, std::size_t count, int peer, int tag) = 0;
  virtual void recv_host(float* data, std::size_t count, int peer, int tag) = 0;
  // The data-parallel group of this rank's stage (every rank of the job holding the same stage), over
  // memory of the same kind as the messages.
  virtual Communicator& stage_group() = 0;
};

// Over the job's communicator `world`: MPI (an MpiCommunicator), or NCCL (an NcclCommunicator; then
// `compute_stream` is the backend's cudaStream_t, which sends and receives are ordered after).
// Collective over the whole job. Throws DistError in a build without MPI, or for another communicator.
std::unique_ptr<PipelineComm> make_pipeline_comm(Communicator& world, int stage, int replica,
                                                 void* compute_stream = nullptr);
// The NCCL half of make_pipeline_comm (cuda/pipeline_comm_nccl.cpp; a clear error without NCCL).
std::unique_ptr<PipelineComm> make_nccl_pipeline_comm(Communicator& world, int stage, int replica,
                                                      void* compute_stream);

}  // namespace wb::parallel
