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

// What recording cost the run: the recorder's measured ns per host event (meta.profiler_ns_per_event,
// measured by wb-train at the end of the run) times the host events (ranges and counter samples) per
// rank and step, against the mean step time.
struct ProfilerCost {
  bool known = false;           // the run has the measurement and steps
  double ns_per_event = 0.0;
  double events_per_step = 0.0;  // per rank
  double ns_per_step = 0.0;
  double mean_step_ns = 0.0;
  double percent = 0.0;          // of the mean step time
};
ProfilerCost profiler_cost(const RunData& run);

struct ReportOptions {
  std::size_t top_ops = 25;
  bool split_table = true;
};
void write_report(const RunData& run, std::ostream& out, const ReportOptions& options = {});
// The report's tables as JSON, in the stable keys docs/guide/report-json.md lists: run, warnings,
// ranks[] (the TensorBoard Overview per rank: steps with breakdown_ns, breakdown_mean_ns, gpu), ops[],
// kernels[], op_stats[], recommendations[].
void write_report_json(const RunData& run, std::ostream& out, const ReportOptions& options = {});
// The stragglers section of the report (stragglers.hpp), nothing for a single-rank run.
void write_stragglers(const RunData& run, std::ostream& out);
// The `wb suggest-split` table alone.
void write_split_suggestions(const RunData& run, std::ostream& out);

// Pipeline runs: bubble ratio per stage and step against the ideal, imbalance, the balanced split and
// the micro-batch count for a bubble under 10% (nothing for other runs).
void write_pipeline_section(const RunData& run, std::ostream& out);

// "1.234 ms", "56.7 us", "890 ns"
std::string format_ns(double ns);
// printf of one number ("%.2f").
std::string fmt(const char* format, double v);

// A text table: a left-aligned first column, right-aligned others, a rule under the header.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace wb::analysis
