// --sync-bn off|local|global: SyncBatchNorm in wb-train. Every batch norm of a training step takes its
// statistics over a group of ranks (local: this host's ranks; global: all of them), through a rank
// group of its own (parallel::GroupComm), and every exchange is recorded as a comm range on the training
// thread named after its layer: "<bn>.sync_stats" in forward (sum of x, of x^2 and the count),
// "<bn>.sync_grads" in backward (sum of dy and of dy * (x - mean)). `wb report` adds them up.
//
// On the CPU the group is an MPI communicator. On CUDA the backend computes the sums on the GPU and
// hands them over as host doubles (2C + 1 values a layer), and they go over a NCCL communicator split
// from the job's. NCCL kernels of two communicators queued in different orders on different ranks can
// wait on each other for good (NCCL's documented cross-communicator deadlock), so on CUDA each exchange
// is issued by GradientSync's communication thread, in turn with the gradient buckets
// (parallel::CollectiveOrder, given by order_with): the same order on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "trainer/config.hpp"
#include "trainer/model/batch_norm_sync.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/group_comm.hpp"

namespace wb::trainer {

// The range names of one layer's exchanges.
inline std::string sync_bn_range_name(std::string_view bn, bool forward) {
  return std::string(bn) + (forward ? ".sync_stats" : ".sync_grads");
}

class SyncBatchNorm final : public model::BatchNormSync {
 public:
  // `recorder` null: nothing recorded.
  SyncBatchNorm(std::unique_ptr<parallel::GroupComm> group, profiler::Recorder* recorder);
  void allreduce(int bn_module, bool forward, std::span<double> values) override;
  int group_size() const { return group_->size(); }
  const char* backend() const { return group_->backend(); }
  // Issue the exchanges through `order` (GradientSync on GPUs, where the group is a NCCL one).
  void order_with(parallel::CollectiveOrder* order) { group_->order_with(order); }

 private:
  std::unique_ptr<parallel::GroupComm> group_;
  std::vector<profiler::NameId> forward_names_, backward_names_;  // by module id
  std::vector<bool> recorded_;                                    // by module id: a batch norm, recorded
};

// cfg.sync_bn's group on this rank, from the job's host communicator (and with `device`, the job's NCCL
// communicator, a NCCL group); null for "off". Rank 0 prints the group on stdout, and a warning on
// stderr where the scope changes nothing (local on a single host equals global; a group of one equals
// off).
std::unique_ptr<SyncBatchNorm> make_sync_bn(const TrainConfig& cfg, int rank, int world,
                                            parallel::Communicator& host, parallel::Communicator* device,
                                            profiler::Recorder* recorder);

}  // namespace wb::trainer
