// wb compare A B: tensor-by-tensor precision comparison of a dump against a reference, naming the
// first divergence. Exit 0 when every compared tensor passes, 1 when any fails, 2 on bad input.
#include <unistd.h>

#include <cstdio>
#include <future>
#include <iostream>

#include "app/cli/cli.hpp"
#include "compare/compare.hpp"
#include "compare/load.hpp"
#include "compare/report.hpp"

namespace wb::cli {

int cmd_compare(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb compare A B [--profile P] [--map F] [--json OUT] [--csv OUT] [--order failures|exec]\n"
            "                      [--all] [--step N] [--rank R] [--source S] [--no-auto] [--no-save] [--threads N] [--no-color]\n"
            "Compares every tensor of A with the reference B and names the first divergence. A and B are each a run\n"
            "file, a .safetensors file, an .npz, an .npy, a directory of .npy files (TroubleShooter's ts.save) or an\n"
            "msprobe dump directory (dump.json). A torch.save .pt/.pth: convert it with\n"
            "compare/reference/torch_save_to_safetensors.py first. The walk follows the execution order A recorded,\n"
            "else B's, else the ResNet-50 module order known from the names; steps count from 0.\n"
            "  --profile P   migration-fp32 (default), strict (torch.testing.assert_close) or msprobe\n"
            "  --map F       mapping file (JSON): exact pairs, regex rename rules, per-tensor thresholds; or\n"
            "                TroubleShooter's weight map (ts.migrator.get_weight_map)\n"
            "  --json OUT    write all rows and first_divergence as JSON\n"
            "  --csv OUT     write all rows as CSV with msprobe's column names\n"
            "  --all         list every row (default: the failing rows, the 10 passing rows nearest their bound,\n"
            "                the counts per kind and the first divergence)\n"
            "  --order O     order of --all's rows: failures first (default) or exec (execution order)\n"
            "  --step/--rank/--source  which dump of a run file (default: the only or smallest one, source 'run')\n"
            "  --no-auto     do not match leftover tensors by execution order and shape\n"
            "  --no-save     do not save the result into the run file (A, or else B)\n"
            "  --threads N   threads for the metrics (default: all cores)\n"
            "  --no-color    plain table even on a terminal\n"
            "A float tensor passes when its rel-L2 is within max(floor, 5x the reference's own float32 noise), which\n"
            "torch_step.py measures by replaying the step in float64 too; without it, fixed thresholds apply.\n"
            "Exit status: 0 all compared tensors pass, 1 some fail, 2 bad input.",
            {{"--profile"}, {"--map"}, {"--json"}, {"--csv"}, {"--order"}, {"--step"}, {"--rank"}, {"--source"},
             {"--no-auto", false}, {"--all", false}, {"--no-save", false}, {"--threads"}, {"--no-color", false}});
  const auto& pos = args.positionals(2, 2);
  compare::CompareOptions options;
  options.profile = compare::profile_from_name(args.value_or("--profile", "migration-fp32"));
  compare::TableOptions table;
  table.order = compare::row_order_from_name(args.value_or("--order", "failures"));
  table.all = args.has("--all");
  table.color = !args.has("--no-color") && ::isatty(STDOUT_FILENO) == 1;
  options.auto_match = !args.has("--no-auto");
  if (auto t = args.int_value("--threads", 1, 1024)) options.threads = static_cast<unsigned>(*t);
  std::optional<compare::MappingFile> mapping;
  if (auto m = args.value("--map")) {
    mapping = compare::load_mapping(*m);
    options.mapping = &*mapping;
  }
  compare::LoadOptions load;
  load.source = args.value("--source");
  if (auto s = args.int_value("--step", 0, INT32_MAX)) load.step = static_cast<std::int32_t>(*s);
  if (auto r = args.int_value("--rank", 0, INT32_MAX)) load.rank = static_cast<std::int32_t>(*r);

  // Both sides load at once: reading the files is most of the time of a large comparison.
  auto b_future = std::async(std::launch::async, [&] { return compare::load_tensor_set(pos[1], load); });
  // When A fails to load, the future's destructor still waits for B before the error propagates.
  const compare::TensorSet a = compare::load_tensor_set(pos[0], load);
  const compare::TensorSet b = b_future.get();

  const compare::Comparison result = compare::compare_sets(a, b, options);
  compare::print_table(std::cout, result, table);
  std::cout.flush();
  if (auto j = args.value("--json")) compare::write_json_file(*j, result);
  if (auto c = args.value("--csv")) compare::write_csv_file(*c, result);

  if (!args.has("--no-save")) {
    for (const auto& path : {pos[0], pos[1]}) {
      if (compare::detect_format(path) != compare::SetFormat::run_file) continue;
      try {
        const std::int64_t id = compare::save_to_run(path, result);
        std::fprintf(stderr, "saved as comparison %lld in %s\n", static_cast<long long>(id), path.c_str());
      } catch (const std::exception& e) {
        // The comparison itself succeeded; a read-only run file only loses the saved copy.
        std::fprintf(stderr, "wb compare: could not save the result into %s: %s\n", path.c_str(), e.what());
      }
      break;
    }
  }
  return result.all_pass() ? 0 : 1;
}

}  // namespace wb::cli
