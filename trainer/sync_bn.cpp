#include "trainer/sync_bn.hpp"

#include <iostream>
#include <sstream>

#include "layout/resnet50.hpp"
#include "trainer/model/resnet50.hpp"

namespace wb::trainer {

SyncBatchNorm::SyncBatchNorm(std::unique_ptr<parallel::GroupComm> group, profiler::Recorder* recorder)
    : group_(std::move(group)) {
  if (!recorder) return;
  const auto names = model::ResNet50::module_names();
  forward_names_.resize(names.size());
  backward_names_.resize(names.size());
  recorded_.assign(names.size(), false);
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!layout::is_batch_norm(static_cast<int>(i))) continue;
    recorded_[i] = true;
    forward_names_[i] = recorder->intern(sync_bn_range_name(names[i], true));
    backward_names_[i] = recorder->intern(sync_bn_range_name(names[i], false));
  }
}

void SyncBatchNorm::allreduce(int bn_module, bool forward, std::span<double> values) {
  const std::int64_t t0 = profiler::now_ns();
  group_->allreduce_sum(values);
  const auto& names = forward ? forward_names_ : backward_names_;
  const std::size_t id = static_cast<std::size_t>(bn_module);
  if (id < recorded_.size() && recorded_[id]) {
    profiler::record_range(names[id], store::Category::comm, t0, profiler::now_ns());
  }
}

std::unique_ptr<SyncBatchNorm> make_sync_bn(const TrainConfig& cfg, int rank, int world,
                                            parallel::Communicator& host, parallel::Communicator* device,
                                            profiler::Recorder* recorder) {
  if (cfg.sync_bn == "off") return nullptr;
  const auto scope = cfg.sync_bn == "local" ? parallel::GroupScope::local : parallel::GroupScope::global;
  auto group = parallel::make_group_comm(host, scope, device);
  const int size = group->size();
  // Every rank knows the sizes of all groups: a warning only when it holds for the whole job.
  const std::vector<std::int64_t> sizes = host.allgather(static_cast<std::int64_t>(size));
  if (rank == 0) {
    bool all_world = true, all_one = true;
    for (std::int64_t s : sizes) {
      all_world = all_world && s == world;
      all_one = all_one && s == 1;
    }
    std::ostringstream msg;
    if (world == 1) {
      msg << "wb-train: warning: --sync-bn " << cfg.sync_bn
          << " with one rank: batch norm already sees the whole batch (same as --sync-bn off)\n";
    } else if (all_one) {
      msg << "wb-train: warning: --sync-bn local: every host runs one rank, so each group is one rank "
             "(same as --sync-bn off)\n";
    } else if (scope == parallel::GroupScope::local && all_world) {
      msg << "wb-train: warning: --sync-bn local: all " << world
          << " ranks run on this host, so local equals global\n";
    }
    std::cerr << msg.str() << std::flush;
    std::cout << "wb-train: SyncBatchNorm (" << cfg.sync_bn << "): batch statistics over groups of "
              << size << " rank(s), over " << group->backend() << "\n" << std::flush;
  }
  return std::make_unique<SyncBatchNorm>(std::move(group), recorder);
}

}  // namespace wb::trainer
