// Per-operator statistics over host ranges: count, total, self time, mean, p50, p95, max; by name and
// category, and by category alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct OpStat {
  std::string name;          // the op name; the category name for by_category rows
  store::Category category = store::Category::forward;
  std::int64_t count = 0;
  std::int64_t total_ns = 0;
  std::int64_t self_ns = 0;  // total minus the time of ranges nested directly inside
  double mean_ns = 0.0;
  std::int64_t p50_ns = 0;   // nearest-rank percentiles of the durations
  std::int64_t p95_ns = 0;
  std::int64_t max_ns = 0;
};

struct OpStats {
  std::vector<OpStat> by_name;      // keyed by (name, category), by total time descending
  std::vector<OpStat> by_category;  // by total self time descending
};

// Nearest-rank percentile (p in [0, 100]) of ascending-sorted values: the ceil(p/100 * n)-th smallest.
std::int64_t percentile(const std::vector<std::int64_t>& sorted, double p);

// tracks: each track's ranges (any order). A range's parent is the innermost range of the same track
// that contains it in time; self time subtracts the durations of a range's children.
OpStats compute_op_stats(const std::vector<const std::vector<store::RangeRow>*>& tracks,
                         const std::vector<std::string>& strings);
// Over every thread track of the run, or of one rank.
OpStats op_stats(const RunData& run, std::optional<int> rank = std::nullopt);

}  // namespace wb::analysis
