// wb suggest-split RUN: allreduce split points predicted by the alpha-beta model of the recorded run,
// next to the run's own split, MG-WFBP, DDP's 25 MB default and MindSpore's [85,160].
#include <iostream>

#include "app/cli/cli.hpp"
#include "profiler/analysis/report.hpp"
#include "store/reader.hpp"

namespace wb::cli {

int cmd_suggest_split(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb suggest-split RUN\n"
            "Fits t = alpha + beta * bytes to RUN's allreduce spans, averages per-parameter gradient-ready times\n"
            "over its steps, and prints the predicted communication end, exposed time and step time of the\n"
            "optimal contiguous split (dynamic programming) and of the usual heuristics.",
            {});
  const auto& pos = args.positionals(1, 1);
  store::Reader reader(pos[0]);
  analysis::RunData run = analysis::load_run(reader);
  analysis::write_split_suggestions(run, std::cout);
  return 0;
}

}  // namespace wb::cli
