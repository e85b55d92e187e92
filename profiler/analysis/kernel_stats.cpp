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

std::vector<OpDeviceStat> op_device_stats(const RunData& run) {
  std::unordered_map<std::uint64_t, std::int64_t> device_by_corr;
  for (const auto& [track, rows] : run.kernels)
    for (const auto& k : rows)
      if (k.corr_id != 0) device_by_corr[k.corr_id] += std::max<std::int64_t>(0, k.end_ns - k.start_ns);
  std::map<std::uint32_t, OpDeviceStat> by_name;
  for (const auto& track_rows : run.ranges) {
    const std::vector<store::RangeRow>& rows = track_rows.second;  // a plain reference: lambdas capture it
    const store::TrackRow* t = run.track(track_rows.first);
    if (t && std::string_view(run.name(t->name)).ends_with(store::kPythonTrackSuffix)) continue;
    // Enclosing ranges first: by start, then the longer one.
    std::vector<std::size_t> order(rows.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::make_pair(rows[a].start_ns, rows[b].end_ns) < std::make_pair(rows[b].start_ns, rows[a].end_ns);
    });
    std::vector<std::ptrdiff_t> parent(rows.size(), -1);
    std::vector<std::size_t> open;
    for (std::size_t i : order) {
      while (!open.empty() && rows[open.back()].end_ns <= rows[i].start_ns && rows[open.back()].end_ns > rows[open.back()].start_ns) open.pop_back();
      while (!open.empty() && rows[open.back()].end_ns < rows[i].end_ns) open.pop_back();
      if (!open.empty()) parent[i] = static_cast<std::ptrdiff_t>(open.back());
      open.push_back(i);
    }
    std::vector<std::int64_t> dev_total(rows.size(), 0), child_host(rows.size(), 0);
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (rows[i].corr_id != 0)
        if (auto it = device_by_corr.find(rows[i].corr_id); it != device_by_corr.end()) dev_total[i] = it->second;
    // Children come after their parents in `order`: accumulate in reverse.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const std::size_t i = *it;
      const store::RangeRow& r = rows[i];
      OpDeviceStat& s = by_name[r.name];
      const std::int64_t self_dev = r.corr_id != 0 && device_by_corr.count(r.corr_id) ? device_by_corr.at(r.corr_id) : 0;
      ++s.calls;
      s.device_self_ns += self_dev;
      s.device_total_ns += dev_total[i];
      s.host_total_ns += r.end_ns - r.start_ns;
      s.host_self_ns += std::max<std::int64_t>(0, r.end_ns - r.start_ns - child_host[i]);
      if (parent[i] >= 0) {
        dev_total[static_cast<std::size_t>(parent[i])] += dev_total[i];
        child_host[static_cast<std::size_t>(parent[i])] += r.end_ns - r.start_ns;
      }
    }
  }
  std::vector<OpDeviceStat> out;
  for (auto& [name, s] : by_name) {
    s.name = run.name(name);
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const OpDeviceStat& a, const OpDeviceStat& b) {
    return std::tie(b.device_self_ns, b.device_total_ns, b.host_total_ns, a.name) <
           std::tie(a.device_self_ns, a.device_total_ns, a.host_total_ns, b.name);
  });
  return out;
}

}  // namespace wb::analysis
