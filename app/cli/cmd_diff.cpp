// wb diff RUN_A RUN_B: per-layer time of two runs side by side (ours against an imported PyTorch trace,
// or any two runs): the step split, totals per op type, the layers that lose the most time, and every
// layer forward and backward with its kernels on GPU runs.
#include <fstream>
#include <iostream>

#include "app/cli/cli.hpp"
#include "profiler/analysis/layer_diff.hpp"
#include "store/reader.hpp"

namespace wb::cli {

namespace {

void write_file(const Args& args, const std::string& path, const std::string& text, const char* what) {
  if (path == "-") {
    std::cout << text;
    return;
  }
  std::ofstream out(path);
  if (!out) args.fail(path + ": cannot write the " + what);
  out << text;
  if (!out) args.fail(path + ": writing the " + what + " failed");
}

}  // namespace

int cmd_diff(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb diff RUN_A RUN_B [--json OUT] [--csv OUT] [--all] [--top N] [--rank R] [--skip N] [--skip-b N]\n"
            "Compares two runs layer by layer: per layer forward and backward, time per step in A and B, the ratio\n"
            "A/B and the time lost (A - B), kernels and kernel time per layer on GPU runs; the step split into\n"
            "compute, data wait, exposed communication and other; totals per op type (conv, bn, relu, pool, fc,\n"
            "loss, optimizer); and the top layers by time lost. RUN_B is typically a PyTorch trace read with\n"
            "`wb import torch-trace`; the \"match\" columns say how each layer was found (name: recorded by\n"
            "wb-train; module: record_function names; order: execution order and op type; sequence: autograd\n"
            "sequence numbers).\n"
            "  --json OUT   write everything as JSON (- for stdout, then no table)\n"
            "  --csv OUT    write the per-layer rows as CSV (- for stdout, then no table)\n"
            "  --all        list blocks (layer1.0, ...) too, not only leaf layers\n"
            "  --top N      layers in the time-lost list (default 10)\n"
            "  --rank R     the rank compared in both runs (default 0)\n"
            "  --skip N     steps left out at the start of A (default: 1 when it has 3 or more steps)\n"
            "  --skip-b N   the same for B (default: as --skip when given, else the same rule)",
            {{"--json", true}, {"--csv", true}, {"--all", false}, {"--top", true}, {"--rank", true}, {"--skip", true},
             {"--skip-b", true}});
  const auto& pos = args.positionals(2, 2);
  analysis::LayerOptions oa, ob;
  oa.rank = ob.rank = static_cast<int>(args.int_value("--rank", 0, 1 << 20).value_or(0));
  if (auto s = args.int_value("--skip", 0, 1 << 20)) oa.skip_steps = ob.skip_steps = static_cast<int>(*s);
  if (auto s = args.int_value("--skip-b", 0, 1 << 20)) ob.skip_steps = static_cast<int>(*s);
  std::size_t top = static_cast<std::size_t>(args.int_value("--top", 1, 100000).value_or(10));

  store::Reader ra(pos[0]);
  analysis::RunData a = analysis::load_run(ra);
  store::Reader rb(pos[1]);
  analysis::RunData b = analysis::load_run(rb);
  analysis::LayerDiff d = analysis::diff_layers(analysis::layer_times(a, oa), analysis::layer_times(b, ob), top);

  auto json = args.value("--json");
  auto csv = args.value("--csv");
  if (json) write_file(args, *json, analysis::to_json(d).dump(1) + "\n", "JSON report");
  if (csv) write_file(args, *csv, analysis::to_csv(d), "CSV report");
  if (json != std::optional<std::string>("-") && csv != std::optional<std::string>("-"))
    std::cout << analysis::to_text(d, args.has("--all"));
  return 0;
}

}  // namespace wb::cli
