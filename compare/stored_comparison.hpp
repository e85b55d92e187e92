// Comparisons saved in a run file by `wb compare` (save_to_run in report.hpp: the comparison and
// comparison_row tables), read back into a Comparison so that wb-view's Precision view shows their
// table, verdicts and first divergence without the reference file and without recomputing anything.
// Only the per-tensor plots need the tensors; attach_sets() links the rows to them when both sides can
// still be loaded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "compare/compare.hpp"
#include "store/rows.hpp"

namespace wb::compare {

// The rows as `wb compare` saved them (row JSON from compare/report: name, a_name, b_name, kind,
// status, shapes, metrics, thresholds, reason), the first divergence from the header. Throws
// CompareError naming the comparison when a row is not such JSON.
Comparison comparison_from_stored(const store::ComparisonRow& header, const std::vector<store::ComparisonEntryRow>& rows);

// Reads comparison `id` of a run file; throws store::StoreError for a bad file and CompareError naming
// the run and the ids it holds when there is no such comparison.
struct StoredComparison {
  store::ComparisonRow header;
  Comparison comparison;
};
StoredComparison read_stored_comparison(const std::filesystem::path& run, std::int64_t id);

// Sets every row's a_index / b_index from its keys in the loaded sets (rows whose keys are absent keep
// none, so their details say so).
void attach_sets(Comparison& comparison, const TensorSet& a, const TensorSet& b);

// Where a side of a saved comparison is now: the path as saved, else (relative paths) next to the run
// file, else the run file itself when the saved side named it; nullopt when it is gone.
std::optional<std::filesystem::path> locate_side(const std::string& saved, const std::filesystem::path& run);

}  // namespace wb::compare
