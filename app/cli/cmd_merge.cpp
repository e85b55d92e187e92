// wb merge RUNDIR [--out F] [--overwrite]: per-rank files into one run file.
#include <cstdio>
#include <string>

#include "app/cli/cli.hpp"
#include "store/merge.hpp"

namespace wb::cli {

int cmd_merge(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb merge RUNDIR [--out F] [--overwrite] [--partial]\n"
            "Merges RUNDIR/rank-<r>.sqlite into one run file (default: RUNDIR with .sqlite appended).\n"
            "A missing, truncated or foreign rank file is named and stops the merge, unless --partial.\n"
            "  --out F        write the merged run to F\n"
            "  --overwrite    replace F if it exists\n"
            "  --partial      merge the rank files that can be read, leave out (and name) the others;\n"
            "                 the merged run is marked incomplete",
            {{"--out", true}, {"--overwrite", false}, {"--partial", false}});
  const auto& pos = args.positionals(1, 1);
  auto result = store::merge_run(pos[0], args.value_or("--out", ""), args.has("--overwrite"), args.has("--partial"));
  for (const auto& why : result.skipped) std::fprintf(stderr, "wb merge: left out %s\n", why.c_str());
  const int merged = result.world_size - static_cast<int>(result.skipped.size());
  const std::string count = result.skipped.empty() ? std::to_string(merged)
                                                   : std::to_string(merged) + " of " + std::to_string(result.world_size);
  std::printf("merged %s rank file%s into %s (%s)\n", count.c_str(), result.world_size == 1 ? "" : "s",
              result.out.c_str(),
              result.complete ? "complete"
              : result.skipped.empty() ? "incomplete: a rank did not finish cleanly"
                                       : "incomplete: rank files were left out");
  return 0;
}

}  // namespace wb::cli
