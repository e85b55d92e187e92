#include "profiler/analysis/op_stats.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace wb::analysis {

std::int64_t percentile(const std::vector<std::int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto n = static_cast<double>(sorted.size());
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * n));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

namespace {

struct Acc {
  std::vector<std::int64_t> durations;
  std::int64_t total = 0;
  std::int64_t self = 0;
};

OpStat finish(std::string name, store::Category category, Acc& acc) {
  std::sort(acc.durations.begin(), acc.durations.end());
  OpStat s;
  s.name = std::move(name);
  s.category = category;
  s.count = static_cast<std::int64_t>(acc.durations.size());
  s.total_ns = acc.total;
  s.self_ns = acc.self;
  s.mean_ns = s.count > 0 ? static_cast<double>(acc.total) / static_cast<double>(s.count) : 0.0;
  s.p50_ns = percentile(acc.durations, 50);
  s.p95_ns = percentile(acc.durations, 95);
  s.max_ns = acc.durations.empty() ? 0 : acc.durations.back();
  return s;
}

}  // namespace

OpStats compute_op_stats(const std::vector<const std::vector<store::RangeRow>*>& tracks,
                         const std::vector<std::string>& strings) {
  std::map<std::pair<std::uint32_t, std::uint8_t>, Acc> by_name;
  std::map<std::uint8_t, Acc> by_category;
  std::vector<store::RangeRow> rows;
  std::vector<std::int64_t> self;
  std::vector<std::size_t> stack;
  for (const auto* track : tracks) {
    rows = *track;
    // Parents before children: by start, then longer first, then outer depth first.
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return std::make_tuple(a.start_ns, b.end_ns, a.depth) < std::make_tuple(b.start_ns, a.end_ns, b.depth);
    });
    self.assign(rows.size(), 0);
    stack.clear();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      while (!stack.empty() && !(rows[stack.back()].start_ns <= r.start_ns && r.end_ns <= rows[stack.back()].end_ns))
        stack.pop_back();
      std::int64_t d = r.end_ns - r.start_ns;
      self[i] += d;
      if (!stack.empty()) self[stack.back()] -= d;
      stack.push_back(i);
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::int64_t d = r.end_ns - r.start_ns;
      for (Acc* acc : {&by_name[{r.name, r.category}], &by_category[r.category]}) {
        acc->durations.push_back(d);
        acc->total += d;
        acc->self += self[i];
      }
    }
  }
  OpStats out;
  for (auto& [key, acc] : by_name) {
    std::string name = key.first < strings.size() ? strings[key.first] : concat("#", std::to_string(key.first));
    out.by_name.push_back(finish(std::move(name), static_cast<store::Category>(key.second), acc));
  }
  for (auto& [cat, acc] : by_category) {
    auto c = static_cast<store::Category>(cat);
    std::string name = cat <= static_cast<std::uint8_t>(store::Category::step) ? std::string(store::category_name(c))
                                                                               : concat("category ", std::to_string(cat));
    out.by_category.push_back(finish(std::move(name), c, acc));
  }
  std::sort(out.by_name.begin(), out.by_name.end(), [](const auto& a, const auto& b) {
    return std::tie(b.total_ns, a.name) < std::tie(a.total_ns, b.name);
  });
  std::sort(out.by_category.begin(), out.by_category.end(), [](const auto& a, const auto& b) {
    return std::tie(b.self_ns, a.name) < std::tie(a.self_ns, b.name);
  });
  return out;
}

OpStats op_stats(const RunData& run, std::optional<int> rank) {
  std::vector<const std::vector<store::RangeRow>*> tracks;
  for (const auto& [id, rows] : run.ranges) {
    const store::TrackRow* t = run.track(id);
    if (t == nullptr || (rank && t->rank != *rank)) continue;
    tracks.push_back(&rows);
  }
  return compute_op_stats(tracks, run.strings);
}

}  // namespace wb::analysis
