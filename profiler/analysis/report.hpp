// The text report of `wb report RUN`: run summary, warnings, op statistics, step breakdown, input
// starvation, allreduce buckets and overlap, and the split suggestion table.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "profiler/analysis/run_data.hpp"

namespace wb::analysis {

struct Warning {
  std::string kind;     // "dropped", "incomplete", "input-bound", "empty-queue", "exposed-comm", "straggler"
  std::string message;  // one line a user can act on
};

// Rank r is a straggler when it is the slowest rank in at least 75 % of the steps all ranks share
// (at least 3 steps) and its mean step time is at least 5 % above the median of the others' means.
struct Straggler {
  int rank = -1;
  double slowest_fraction = 0.0;
  double mean_step_ns = 0.0;
  double others_median_ns = 0.0;
};
std::vector<Straggler> find_stragglers(const RunData& run);

// Exposed communication above this share of step time is worth a warning.
inline constexpr double kExposedCommWarning = 0.05;

std::vector<Warning> run_warnings(const RunData& run);

struct ReportOptions {
  std::size_t top_ops = 25;
  bool split_table = true;
};
void write_report(const RunData& run, std::ostream& out, const ReportOptions& options = {});
// The `wb suggest-split` table alone.
void write_split_suggestions(const RunData& run, std::ostream& out);

// Pipeline runs: bubble ratio per stage and step against the ideal, imbalance, the balanced split and
// the micro-batch count for a bubble under 10% (nothing for other runs).
void write_pipeline_section(const RunData& run, std::ostream& out);

// "1.234 ms", "56.7 us", "890 ns"
std::string format_ns(double ns);

}  // namespace wb::analysis
