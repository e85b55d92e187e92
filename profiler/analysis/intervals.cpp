#include "profiler/analysis/intervals.hpp"

#include <algorithm>

namespace wb::analysis {

Intervals merged(Intervals v) {
  std::erase_if(v, [](const Interval& i) { return i.second <= i.first; });
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const Interval& i : v) {
    if (!out.empty() && i.first <= out.back().second) out.back().second = std::max(out.back().second, i.second);
    else out.push_back(i);
  }
  return out;
}

Intervals intersect(const Intervals& a, const Intervals& b) {
  Intervals out;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const std::int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo < hi) out.emplace_back(lo, hi);
    (a[i].second < b[j].second ? i : j)++;
  }
  return out;
}

Intervals subtract(const Intervals& a, const Intervals& b) {
  Intervals out;
  std::size_t j = 0;
  for (Interval cur : a) {
    while (j < b.size() && b[j].second <= cur.first) ++j;
    for (std::size_t k = j; k < b.size() && b[k].first < cur.second; ++k) {
      if (b[k].first > cur.first) out.emplace_back(cur.first, b[k].first);
      cur.first = std::max(cur.first, b[k].second);
      if (cur.first >= cur.second) break;
    }
    if (cur.first < cur.second) out.push_back(cur);
  }
  return out;
}

std::int64_t length_of(const Intervals& v) {
  std::int64_t total = 0;
  for (const Interval& i : v) total += i.second - i.first;
  return total;
}

std::int64_t length_within(const Intervals& v, std::int64_t lo, std::int64_t hi) {
  auto it = std::upper_bound(v.begin(), v.end(), lo, [](std::int64_t t, const Interval& i) { return t < i.second; });
  std::int64_t total = 0;
  for (; it != v.end() && it->first < hi; ++it) total += std::max<std::int64_t>(0, std::min(it->second, hi) - std::max(it->first, lo));
  return total;
}

}  // namespace wb::analysis
