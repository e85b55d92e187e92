#include "profiler/analysis/kernel_stats.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

namespace wb::analysis {

KernelStats kernel_stats(const RunData& run) {
  KernelStats out;
  // corr id -> the host range that launched under it. Several ranges never share an id (each Range
  // draws a fresh one), so the first seen is the one.
  std::unordered_map<std::uint64_t, const store::RangeRow*> launcher;
  for (const auto& [track, rows] : run.ranges)
    for (const auto& r : rows)
      if (r.corr_id != 0) launcher.emplace(r.corr_id, &r);

  std::map<std::pair<std::uint32_t, std::uint8_t>, KernelOpStat> ops;  // (name id, category)
  std::set<const store::RangeRow*> counted;
  std::map<std::pair<std::uint32_t, std::uint8_t>, KernelNameStat> kernels;  // (name id, kind)
  for (const auto& [track, rows] : run.kernels) {
    for (const auto& k : rows) {
      const std::int64_t d = std::max<std::int64_t>(0, k.end_ns - k.start_ns);
      ++out.activities;
      out.device_ns += d;
      KernelNameStat& ks = kernels[{k.name, k.kind}];
      if (ks.count == 0) {
        ks.name = run.name(k.name);
        ks.kind = static_cast<store::KernelKind>(k.kind);
      }
      ++ks.count;
      ks.total_ns += d;
      ks.max_ns = std::max(ks.max_ns, d);
      ks.bytes += k.bytes;

      auto it = k.corr_id != 0 ? launcher.find(k.corr_id) : launcher.end();
      if (it == launcher.end()) {
        out.unlinked_ns += d;
        continue;
      }
      ++out.linked;
      const store::RangeRow& r = *it->second;
      KernelOpStat& os = ops[{r.name, r.category}];
      if (os.launches == 0) {
        os.op = run.name(r.name);
        os.category = static_cast<store::Category>(r.category);
      }
      ++os.launches;
      os.device_ns += d;
      if (counted.insert(&r).second) {
        ++os.ranges;
        os.host_ns += r.end_ns - r.start_ns;
      }
    }
  }
  for (auto& [key, s] : ops) out.by_op.push_back(std::move(s));
  for (auto& [key, s] : kernels) out.by_kernel.push_back(std::move(s));
  std::sort(out.by_op.begin(), out.by_op.end(), [](const KernelOpStat& a, const KernelOpStat& b) {
    return std::tie(b.device_ns, a.op) < std::tie(a.device_ns, b.op);
  });
  std::sort(out.by_kernel.begin(), out.by_kernel.end(), [](const KernelNameStat& a, const KernelNameStat& b) {
    return std::tie(b.total_ns, a.name) < std::tie(a.total_ns, b.name);
  });
  return out;
}

}  // namespace wb::analysis
