// Pipeline messages on the GPU (pipeline_comm.hpp): ncclSend/ncclRecv on a communicator and a stream
// of their own, the stage groups as NCCL communicators, host messages over MPI.
//
// Ordering, on each rank:
//   - every post first makes the p2p stream wait for an event recorded on the compute stream: the
//     activations a send reads have been computed, and the buffers a receive overwrites have been
//     read by the work queued before (the previous step's copies out of them);
//   - the messages of one post run as one NCCL group, so a rank that sends to a neighbour and receives
//     at the same point cannot wait on its own send while its peer waits on its own (1F1B's steady
//     state: stage s sends micro-batch m's activations and receives micro-batch m-S+s+1's gradient);
//   - Transfer::wait blocks the host until the group's event has completed (polling NCCL for errors),
//     so the compute stream reads a received buffer only after it arrived, and the profiler's spans
//     are the host's waits, as on the CPU.
// PipelineStep posts each receive only where its schedule needs it (early_receives() is false): NCCL
// runs a rank's operations in issue order, and a receive posted early would hold back the sends
// behind it.
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/check.hpp"
#include "trainer/parallel/cuda/nccl_communicator.hpp"
#include "trainer/parallel/cuda/nccl_error.hpp"
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/pipeline_comm.hpp"

namespace wb::parallel {
namespace {

// The completion of one posted group: an event recorded on the p2p stream after it.
struct Group {
  cudaEvent_t event = nullptr;
  Group() { WB_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~Group() { cudaEventDestroy(event); }  // released by CUDA once the event completes
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
};

class NcclPipelineComm final : public PipelineComm {
 public:
  NcclPipelineComm(NcclCommunicator& world, int stage, int replica, void* compute_stream)
      : device_(world.device()),
        compute_(static_cast<cudaStream_t>(compute_stream)),
        host_(make_pipeline_comm(world.bootstrap(), stage, replica)) {
    if (!compute_) throw DistError("pipeline stages over NCCL: the backend has no compute stream to order the messages after");
    MpiCommunicator& boot = world.bootstrap();
    ncclUniqueId id{};
    if (boot.rank() == 0) WB_NCCL_CHECK(ncclGetUniqueId(&id));
    boot.broadcast_bytes(&id, sizeof id, 0);
    WB_CUDA_CHECK(cudaSetDevice(device_));
    WB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    WB_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    WB_NCCL_CHECK(ncclCommInitRank(&comm_, boot.size(), id, boot.rank()));
    // The stage's replicas reduce device gradients: NCCL over the MPI group of the host messages
    // (created on every rank of a group in the same order, so the inits match).
    auto* group = dynamic_cast<MpiCommunicator*>(&host_->stage_group());
    if (!group) throw DistError("pipeline stages over NCCL: the stage group is not an MPI communicator");
    if (group->size() > 1) {
      group_ = std::make_unique<NcclCommunicator>(*group, device_);
      group_->set_input_stream(compute_stream);
    }
  }

  ~NcclPipelineComm() override {
    group_.reset();
    cudaSetDevice(device_);
    if (comm_) ncclCommDestroy(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  NcclPipelineComm(const NcclPipelineComm&) = delete;
  NcclPipelineComm& operator=(const NcclPipelineComm&) = delete;

  std::vector<std::unique_ptr<Transfer>> post(std::span<const Message> messages) override;
  bool early_receives() const override { return false; }
  void send_host(const float* data, std::size_t count, int peer, int tag) override {
    host_->send_host(data, count, peer, tag);
  }
  void recv_host(float* data, std::size_t count, int peer, int tag) override { host_->recv_host(data, count, peer, tag); }
  // One replica: nothing is reduced, and the MPI group (of one rank) stands in.
  Communicator& stage_group() override { return group_ ? static_cast<Communicator&>(*group_) : host_->stage_group(); }

  // Blocks until `group` has completed, polling NCCL's asynchronous errors (a lost peer).
  void wait(const Group& group, const std::string& what) {
    WB_CUDA_CHECK(cudaSetDevice(device_));
    while (true) {
      const cudaError_t rc = cudaEventQuery(group.event);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) ::wb::cuda::check(rc, what.c_str(), __FILE__, __LINE__);
      ncclResult_t async = ncclSuccess;
      WB_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess) check_nccl(async, what.c_str(), __FILE__, __LINE__);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  bool test(const Group& group, const std::string& what) {
    WB_CUDA_CHECK(cudaSetDevice(device_));
    const cudaError_t rc = cudaEventQuery(group.event);
    if (rc != cudaSuccess && rc != cudaErrorNotReady) ::wb::cuda::check(rc, what.c_str(), __FILE__, __LINE__);
    return rc == cudaSuccess;
  }

 private:
  int device_;
  cudaStream_t compute_;
  std::unique_ptr<PipelineComm> host_;  // MPI: host messages and the stage's MPI group
  cudaStream_t stream_ = nullptr;        // the p2p stream
  cudaEvent_t ready_ = nullptr;          // recorded on the compute stream at each post
  ncclComm_t comm_ = nullptr;            // the p2p communicator, ranks as in the job
  std::unique_ptr<NcclCommunicator> group_;
};

class NcclTransfer final : public Transfer {
 public:
  NcclTransfer(NcclPipelineComm& owner, std::shared_ptr<Group> group, std::string what)
      : owner_(owner), group_(std::move(group)), what_(std::move(what)) {}
  void wait() override {
    if (!done_) owner_.wait(*group_, what_);
    done_ = true;
  }
  bool test() override {
    if (!done_) done_ = owner_.test(*group_, what_);
    return done_;
  }

 private:
  NcclPipelineComm& owner_;
  std::shared_ptr<Group> group_;  // shared by the transfers of one post
  std::string what_;
  bool done_ = false;
};

std::vector<std::unique_ptr<Transfer>> NcclPipelineComm::post(std::span<const Message> messages) {
  std::vector<std::unique_ptr<Transfer>> out;
  if (messages.empty()) return out;
  WB_CUDA_CHECK(cudaSetDevice(device_));
  WB_CUDA_CHECK(cudaEventRecord(ready_, compute_));
  WB_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  auto group = std::make_shared<Group>();
  WB_NCCL_CHECK(ncclGroupStart());
  for (const Message& m : messages) {
    const ncclResult_t rc = m.send ? ncclSend(m.data, m.count, ncclFloat, m.peer, comm_, stream_)
                                   : ncclRecv(m.data, m.count, ncclFloat, m.peer, comm_, stream_);
    if (rc != ncclSuccess) {
      ncclGroupEnd();  // leaves the group the calls before opened
      check_nccl(rc, m.send ? "ncclSend" : "ncclRecv", __FILE__, __LINE__);
    }
  }
  WB_NCCL_CHECK(ncclGroupEnd());
  WB_CUDA_CHECK(cudaEventRecord(group->event, stream_));
  for (const Message& m : messages) {
    out.push_back(std::make_unique<NcclTransfer>(
        *this, group,
        std::string(m.send ? "ncclSend to rank " : "ncclRecv from rank ") + std::to_string(m.peer) + " (tag " +
            std::to_string(m.tag) + ")"));
  }
  return out;
}

}  // namespace

std::unique_ptr<PipelineComm> make_nccl_pipeline_comm(Communicator& world, int stage, int replica, void* compute_stream) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&world);
  if (!nccl) throw DistError(std::string("pipeline stages on the GPU need the NCCL communicator; this job's is '") + world.backend() + "'");
  return std::make_unique<NcclPipelineComm>(*nccl, stage, replica, compute_stream);
}

}  // namespace wb::parallel
