#include "trainer/fc_shard.hpp"

#include <iostream>

namespace wb::trainer {

using model::FcExchange;

std::string fc_shard_range_name(FcExchange what) {
  switch (what) {
    case FcExchange::features: return "fc.shard_gather";
    case FcExchange::max: return "fc.shard_max";
    case FcExchange::sum: return "fc.shard_sum";
    case FcExchange::target: return "fc.shard_target";
    case FcExchange::grads: return "fc.shard_grad";
    case FcExchange::sync: return "fc.shard_sync";
    case FcExchange::logits: return "fc.shard_logits";
    case FcExchange::state: return "fc.shard_state";
  }
  return "fc.shard";
}

ShardedClassifier::ShardedClassifier(std::unique_ptr<parallel::GroupComm> group,
                                     std::unique_ptr<parallel::GroupComm> across, int replicas,
                                     profiler::Recorder* recorder)
    : group_(std::move(group)), across_(std::move(across)), replicas_(replicas) {
  if (!recorder) return;
  for (int e = 0; e <= static_cast<int>(FcExchange::sync); ++e) {
    names_.push_back(recorder->intern(fc_shard_range_name(static_cast<FcExchange>(e))));
  }
}

// The gathers for a step dump and a checkpoint (logits, state) are no part of the step's algorithm and
// stay unrecorded, so that `wb report` counts what every step pays.
void ShardedClassifier::record(FcExchange what, std::int64_t t0) const {
  if (names_.empty() || what == FcExchange::logits || what == FcExchange::state) return;
  profiler::record_range(names_[static_cast<std::size_t>(what)], store::Category::comm, t0, profiler::now_ns());
}

void ShardedClassifier::gather(FcExchange what, std::span<const float> mine, std::span<float> all) {
  const std::int64_t t0 = profiler::now_ns();
  group_->allgather(mine, all);
  record(what, t0);
}

void ShardedClassifier::allreduce(FcExchange what, std::span<double> values) {
  const std::int64_t t0 = profiler::now_ns();
  if (what == FcExchange::max) {
    group_->allreduce_max(values);
  } else {
    group_->allreduce_sum(values);
  }
  record(what, t0);
}

void ShardedClassifier::reduce_scatter(FcExchange what, std::span<const float> all, std::span<float> mine) {
  const std::int64_t t0 = profiler::now_ns();
  group_->reduce_scatter_sum(all, mine);
  record(what, t0);
}

void ShardedClassifier::sync_grads(std::span<float> grads) {
  if (!across_ || across_->size() == 1) return;
  const std::int64_t t0 = profiler::now_ns();
  across_->allreduce_sum(grads);
  record(FcExchange::sync, t0);
}

void check_fc_shard(const TrainConfig& cfg, int world) {
  const int n = cfg.shard_fc;
  if (n <= 1) return;
  const std::string flag = "--shard-fc " + std::to_string(n);
  if (world % n != 0) {
    throw ConfigError(flag + ": does not divide the job's " + std::to_string(world) +
                      " rank(s) (the ranks form groups of " + std::to_string(n) + "; run a multiple of " +
                      std::to_string(n) + " ranks)");
  }
}

std::unique_ptr<ShardedClassifier> make_fc_shard(const TrainConfig& cfg, int rank, int world,
                                                 parallel::Communicator& host, parallel::Communicator* device,
                                                 profiler::Recorder* recorder) {
  const int n = cfg.shard_fc;
  if (n <= 1) return nullptr;
  check_fc_shard(cfg, world);
  // Every rank takes part in both splits, in the same order.
  auto group = parallel::split_group_comm(host, rank / n, device);
  auto across = parallel::split_group_comm(host, rank % n, device);
  if (rank == 0) {
    std::cout << "wb-train: sharded classifier: fc split over groups of " << n << " ranks, " << cfg.num_classes / n
              << " of the " << cfg.num_classes << " classes each; " << world / n << " shard group(s)\n"
              << std::flush;
  }
  return std::make_unique<ShardedClassifier>(std::move(group), std::move(across), world, recorder);
}

}  // namespace wb::trainer
