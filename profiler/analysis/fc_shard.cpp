#include "profiler/analysis/fc_shard.hpp"

#include <optional>

namespace wb::analysis {

namespace {
constexpr std::string_view kPrefix = "fc.shard_";

std::optional<BlockingName> fc_shard_part(const std::string& name) {
  if (!is_fc_shard_name(name)) return std::nullopt;
  // Backward: the features' gradient and the slices' gradients across the shard groups.
  return BlockingName{name, name != "fc.shard_grad" && name != "fc.shard_sync"};
}
}  // namespace

bool is_fc_shard_name(const std::string& name) { return name.starts_with(kPrefix) && name.size() > kPrefix.size(); }

std::vector<bool> fc_shard_name_ids(const RunData& run) { return blocking_name_ids(run, fc_shard_part); }

BlockingCommSummary fc_shard_summary(const RunData& run) { return blocking_comm_summary(run, fc_shard_part); }

void write_fc_shard_section(const RunData& run, std::ostream& out) {
  const BlockingCommSummary s = fc_shard_summary(run);
  if (s.ranks == 0) return;
  out << "\nSharded classifier (--shard-fc";
  if (run.config.contains("shard_fc") && run.config["shard_fc"].is_number_integer()) {
    out << " " << run.config["shard_fc"].get<int>();
  }
  auto group = run.meta.find("fc_shard_group_size");
  if (group != run.meta.end()) out << ", groups of " << group->second << " rank(s)";
  out << ")\n";
  write_blocking_lines(s, out, "by exchange", s.layers.size());
}

}  // namespace wb::analysis
