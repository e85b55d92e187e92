// Merging per-rank run files (RUN/rank-<r>.sqlite) into one run file (RUN.sqlite).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace wb::store {

struct MergeResult {
  std::filesystem::path out;
  int world_size = 0;
  bool complete = false;  // every rank file was complete (and none was left out)
  // With `partial`: the ranks left out, each "rank-<r>.sqlite: why" (missing, truncated, foreign, ...).
  std::vector<std::string> skipped;
};

// The default output of merge_run: the run directory with ".sqlite" appended (runs/x/ -> runs/x.sqlite).
std::filesystem::path default_merge_output(const std::filesystem::path& run_dir);

// Merges run_dir/rank-<r>.sqlite for r in [0, world_size) into out (default_merge_output when empty).
// Tracks and interned strings are remapped into one id space; meta comes from rank 0 plus world_size,
// and complete = 1 only when every rank file is complete. world_size is rank 0's meta.world_size, else
// the number of rank files. Throws StoreError when the directory has no rank files, when rank files are
// missing (listing them), when out exists (unless overwrite), or when rank files are invalid (a
// truncated or foreign file, one that fails while being copied: every one is named).
// With `partial`, missing and invalid rank files are left out instead (MergeResult::skipped, and
// meta.skipped_ranks in the merged file, which is then incomplete); at least one rank must merge.
// The rank files are only read: a merge that fails or is killed leaves them as they were, and
// out appears only once it is whole (it is built as out + ".partial" and renamed).
MergeResult merge_run(const std::filesystem::path& run_dir, std::filesystem::path out = {},
                      bool overwrite = false, bool partial = false);

}  // namespace wb::store
