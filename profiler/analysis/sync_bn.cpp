#include "profiler/analysis/sync_bn.hpp"

#include <optional>

namespace wb::analysis {

namespace {
constexpr std::string_view kStats = ".sync_stats", kGrads = ".sync_grads";

}  // namespace

bool is_sync_bn_name(const std::string& name) { return name.ends_with(kStats) || name.ends_with(kGrads); }

namespace {
std::optional<BlockingName> sync_bn_part(const std::string& name) {
  if (!is_sync_bn_name(name)) return std::nullopt;
  return BlockingName{name.substr(0, name.size() - kStats.size()), name.ends_with(kStats)};
}
}  // namespace

std::vector<bool> sync_bn_name_ids(const RunData& run) { return blocking_name_ids(run, sync_bn_part); }

SyncBnSummary sync_bn_summary(const RunData& run) { return blocking_comm_summary(run, sync_bn_part); }

void write_sync_bn_section(const RunData& run, std::ostream& out, std::size_t top_layers) {
  const SyncBnSummary s = sync_bn_summary(run);
  if (s.ranks == 0) return;
  std::string scope = "?";
  if (run.config.contains("sync_bn") && run.config["sync_bn"].is_string()) scope = run.config["sync_bn"];
  auto group = run.meta.find("sync_bn_group_size");
  out << "\nSyncBatchNorm (--sync-bn " << scope;
  if (group != run.meta.end()) out << ", groups of " << group->second << " rank(s)";
  out << ")\n";
  write_blocking_lines(s, out, "longest layers", top_layers);
}

}  // namespace wb::analysis
