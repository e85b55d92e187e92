// --shard-fc N: the sharded classifier in wb-train. The ranks form groups of N consecutive ranks (ranks
// [g * N, (g + 1) * N)); member s of a group holds classes [s * K/N, (s + 1) * K/N) of fc.weight and
// fc.bias (model::FcShard has the arithmetic). Its exchanges run over rank groups of their own
// (parallel::GroupComm), and each is recorded as a comm range on the training thread:
//   fc.shard_gather  the group's features and labels (forward)
//   fc.shard_max     each row's largest logit (allreduce max)
//   fc.shard_sum     each row's sum of exp(z - max)
//   fc.shard_target  each row's labelled logit and sum of logits
//   fc.shard_grad    the features' gradient, reduce-scattered back (backward)
//   fc.shard_sync    the slice's gradients over the shard groups (only when world > N)
// (a step dump's and a checkpoint's gathers of the full logits and the slices are not recorded).
// `wb report` adds them up (profiler/analysis/fc_shard.hpp). The slices' gradients stay out of the
// data-parallel buckets (trim_buckets).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "trainer/config.hpp"
#include "trainer/model/fc_shard.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/group_comm.hpp"

namespace wb::trainer {

// The range name of an exchange ("fc.shard_max").
std::string fc_shard_range_name(model::FcExchange what);

class ShardedClassifier final : public model::FcShard {
 public:
  // `across` null: a single shard group. `recorder` null: nothing recorded.
  ShardedClassifier(std::unique_ptr<parallel::GroupComm> group, std::unique_ptr<parallel::GroupComm> across,
                    int replicas, profiler::Recorder* recorder);
  int shards() const override { return group_->size(); }
  int shard() const override { return group_->rank(); }
  int replicas() const override { return replicas_; }
  void gather(model::FcExchange what, std::span<const float> mine, std::span<float> all) override;
  void allreduce(model::FcExchange what, std::span<double> values) override;
  void reduce_scatter(model::FcExchange what, std::span<const float> all, std::span<float> mine) override;
  void sync_grads(std::span<float> grads) override;
  bool full_logits() const override { return full_logits_; }
  // On every rank of the job alike: a step dump's forward gathers the full logits of each rank's rows.
  void set_full_logits(bool on) { full_logits_ = on; }
  // Issue the exchanges through `order` (GradientSync on GPUs, where the groups are NCCL ones).
  void order_with(parallel::CollectiveOrder* order) {
    group_->order_with(order);
    if (across_) across_->order_with(order);
  }

 private:
  void record(model::FcExchange what, std::int64_t t0) const;
  std::unique_ptr<parallel::GroupComm> group_, across_;
  int replicas_;
  std::vector<profiler::NameId> names_;  // by FcExchange up to sync; empty when nothing is recorded
  bool full_logits_ = false;
};

// Throws ConfigError naming --shard-fc when N does not divide the world.
void check_fc_shard(const TrainConfig& cfg, int world);

// --shard-fc's group on this rank, from the job's host communicator (and with `device`, the job's NCCL
// communicator, NCCL groups); null when off (1). Rank 0 prints the groups on stdout. Throws as
// check_fc_shard.
std::unique_ptr<ShardedClassifier> make_fc_shard(const TrainConfig& cfg, int rank, int world,
                                                 parallel::Communicator& host, parallel::Communicator* device,
                                                 profiler::Recorder* recorder);

}  // namespace wb::trainer
