// wb merge RUNDIR [--out F] [--overwrite]: per-rank files into one run file.
#include <cstdio>

#include "app/cli/cli.hpp"
#include "store/merge.hpp"

namespace wb::cli {

int cmd_merge(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb merge RUNDIR [--out F] [--overwrite]\n"
            "Merges RUNDIR/rank-<r>.sqlite into one run file (default: RUNDIR with .sqlite appended).\n"
            "  --out F        write the merged run to F\n"
            "  --overwrite    replace F if it exists",
            {{"--out", true}, {"--overwrite", false}});
  const auto& pos = args.positionals(1, 1);
  auto result = store::merge_run(pos[0], args.value_or("--out", ""), args.has("--overwrite"));
  std::printf("merged %d rank file%s into %s (%s)\n", result.world_size, result.world_size == 1 ? "" : "s",
              result.out.c_str(), result.complete ? "complete" : "incomplete: a rank did not finish cleanly");
  return 0;
}

}  // namespace wb::cli
