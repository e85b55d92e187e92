// A rank group on the GPUs (group_comm.hpp): a NCCL communicator split from the job's, on a stream of
// its own. Values come and go as host spans (SyncBatchNorm's per-channel sums, the sharded classifier's
// features and loss terms): each collective copies them into a pinned host buffer, then to device
// memory, runs, and copies the result back, all on the group's stream; the wait polls the stream and
// NCCL's asynchronous error, as the job's communicator does. Every collective goes through the
// CollectiveOrder given to order_with, so it is issued among the gradient buckets in one order on
// every rank (collective_order.hpp).
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "cuda/check.hpp"
#include "trainer/parallel/cuda/nccl_communicator.hpp"
#include "trainer/parallel/cuda/nccl_error.hpp"
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/group_comm.hpp"

namespace wb::parallel {

namespace {

class NcclGroup final : public GroupComm {
 public:
  NcclGroup(NcclCommunicator& parent, int color) : device_(parent.device()) {
    comm_ = parent.split(color);
    WB_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    WB_NCCL_CHECK(ncclCommCount(comm_, &size_));
    WB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclGroup() override {
    cudaSetDevice(device_);
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
    if (device_buffer_) cudaFree(device_buffer_);
    if (host_buffer_) cudaFreeHost(host_buffer_);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  void order_with(CollectiveOrder* order) override { order_ = order; }

  void allreduce_sum(std::span<double> values) override { allreduce(values, ncclDouble, ncclSum, "ncclAllReduce (sum)"); }
  void allreduce_sum(std::span<float> values) override { allreduce(values, ncclFloat, ncclSum, "ncclAllReduce (sum)"); }
  void allreduce_max(std::span<double> values) override { allreduce(values, ncclDouble, ncclMax, "ncclAllReduce (max)"); }

  void allgather(std::span<const float> mine, std::span<float> all) override {
    check_group_blocks(mine.size(), all.size(), size_, "allgather");
    if (size_ == 1) {
      std::memcpy(all.data(), mine.data(), mine.size_bytes());
      return;
    }
    // In place: this member's block sits at its offset in the gathered buffer.
    const std::size_t block = mine.size_bytes();
    run("ncclAllGather", all.size_bytes(), [&](char* host, char* dev) {
      std::memcpy(host + block * rank_, mine.data(), block);
      copy(dev + block * rank_, host + block * rank_, block, cudaMemcpyHostToDevice);
      WB_NCCL_CHECK(ncclAllGather(dev + block * rank_, dev, mine.size(), ncclFloat, comm_, stream_));
      copy(host, dev, all.size_bytes(), cudaMemcpyDeviceToHost);
    });
    std::memcpy(all.data(), host_buffer_, all.size_bytes());
  }

  void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) override {
    check_group_blocks(mine.size(), all.size(), size_, "reduce_scatter_sum");
    if (size_ == 1) {
      std::memcpy(mine.data(), all.data(), mine.size_bytes());
      return;
    }
    // In place: the result lands in this member's block of the input.
    const std::size_t block = mine.size_bytes();
    run("ncclReduceScatter", all.size_bytes(), [&](char* host, char* dev) {
      std::memcpy(host, all.data(), all.size_bytes());
      copy(dev, host, all.size_bytes(), cudaMemcpyHostToDevice);
      WB_NCCL_CHECK(ncclReduceScatter(dev, dev + block * rank_, mine.size(), ncclFloat, ncclSum, comm_, stream_));
      copy(host + block * rank_, dev + block * rank_, block, cudaMemcpyDeviceToHost);
    });
    std::memcpy(mine.data(), host_buffer_ + block * rank_, block);
  }

 private:
  template <typename T>
  void allreduce(std::span<T> values, ncclDataType_t type, ncclRedOp_t op, const char* what) {
    if (size_ == 1 || values.empty()) return;
    run(what, values.size_bytes(), [&](char* host, char* dev) {
      std::memcpy(host, values.data(), values.size_bytes());
      copy(dev, host, values.size_bytes(), cudaMemcpyHostToDevice);
      WB_NCCL_CHECK(ncclAllReduce(dev, dev, values.size(), type, op, comm_, stream_));
      copy(host, dev, values.size_bytes(), cudaMemcpyDeviceToHost);
    });
    std::memcpy(values.data(), host_buffer_, values.size_bytes());
  }

  // Queues `body` (copies and the collective on stream_, into buffers of `bytes`) in this rank's order
  // and waits for it on the device.
  template <typename F>
  void run(const char* what, std::size_t bytes, F&& body) {
    const std::string name = std::string(what) + " over a rank group of " + std::to_string(size_);
    auto collective = [&] {
      WB_CUDA_CHECK(cudaSetDevice(device_));  // the issuing thread may be GradientSync's
      reserve(bytes);
      body(host_buffer_, device_buffer_);
      finish(name.c_str());
    };
    if (order_) {
      order_->run_in_order(name, collective);
    } else {
      collective();
    }
  }

  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    if (device_buffer_) WB_CUDA_CHECK(cudaFree(device_buffer_));
    if (host_buffer_) WB_CUDA_CHECK(cudaFreeHost(host_buffer_));
    device_buffer_ = host_buffer_ = nullptr;
    capacity_ = 0;
    void* dev = nullptr;
    void* host = nullptr;
    WB_CUDA_CHECK(cudaMalloc(&dev, bytes));
    device_buffer_ = static_cast<char*>(dev);
    WB_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    host_buffer_ = static_cast<char*>(host);
    capacity_ = bytes;
  }

  void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) {
    WB_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, kind, stream_));
  }

  void finish(const char* what) {
    wait_for_collective(stream_, [&] {
      ncclResult_t async = ncclSuccess;
      WB_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      return async;
    }, what);
  }

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t stream_ = nullptr;
  char* device_buffer_ = nullptr;
  char* host_buffer_ = nullptr;  // pinned, so the copies are asynchronous and the wait can poll
  std::size_t capacity_ = 0;
  CollectiveOrder* order_ = nullptr;
};

}  // namespace

std::unique_ptr<GroupComm> make_nccl_group(Communicator& device, int color) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&device);
  if (!nccl) throw DistError(std::string("a NCCL rank group needs the job's NCCL communicator, got ") + device.backend());
  return std::make_unique<NcclGroup>(*nccl, color);
}

}  // namespace wb::parallel
