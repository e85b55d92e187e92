// wb report RUN: the profile of a run as readable tables, warnings first (dropped events, input-bound
// ranks, exposed communication, stragglers, incomplete runs).
#include <iostream>

#include "app/cli/cli.hpp"
#include "profiler/analysis/report.hpp"
#include "store/reader.hpp"

namespace wb::cli {

int cmd_report(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb report RUN [--top N] [--no-split] [--json]\n"
            "Prints op statistics, the per-step breakdown (compute, data wait, exposed communication, other),\n"
            "input starvation (input-bound %, empty-queue ratio, longest spells, workers needed), allreduce\n"
            "buckets and overlap, the alpha-beta fit and split suggestions, with warnings first.\n"
            "On GPU runs and imported GPU traces, also the TensorBoard plugin's Overview (step breakdown in eight\n"
            "classes, GPU utilization, SM efficiency, occupancy, Tensor Core share, recommendations) and device\n"
            "self/total time per op.\n"
            "  --top N      ops listed by total time (default 25)\n"
            "  --no-split   leave out the split suggestion table\n"
            "  --json       the tables as JSON with stable keys (docs/guide/report-json.md)",
            {{"--top", true}, {"--no-split", false}, {"--json", false}});
  const auto& pos = args.positionals(1, 1);
  analysis::ReportOptions options;
  if (auto top = args.int_value("--top", 1, 1'000'000)) options.top_ops = static_cast<std::size_t>(*top);
  options.split_table = !args.has("--no-split");
  store::Reader reader(pos[0]);
  analysis::RunData run = analysis::load_run(reader);
  if (args.has("--json")) analysis::write_report_json(run, std::cout, options);
  else analysis::write_report(run, std::cout, options);
  return 0;
}

}  // namespace wb::cli
