// Reports of a comparison: a console table (coloured on a terminal), JSON, CSV with msprobe's column
// names, and the comparison tables of a run file (for the app's Precision view).
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "compare/compare.hpp"

namespace wb::compare {

enum class RowOrder { failures_first, exec };
// Throws CompareError naming the flag and the valid values.
RowOrder row_order_from_name(std::string_view name);

// By default the console shows the failing rows, the passing rows nearest their bound, the counts per
// kind and the first divergence; `all` lists every row instead of the first two.
struct TableOptions {
  bool all = false;
  std::size_t nearest_rows = 10;
  RowOrder order = RowOrder::failures_first;  // of the full list (`all`)
  bool color = false;
  std::size_t max_ambiguities = 20;  // listed individually; the rest are counted
};

void print_table(std::ostream& out, const Comparison& comparison, const TableOptions& options = {});

// {"a", "b", "profile", "summary", "rows": [...], "ambiguities": [...], "first_divergence": {...}|null}.
// Non-finite numbers are written as the strings "nan", "inf", "-inf".
nlohmann::json to_json(const Comparison& comparison);
nlohmann::json metrics_to_json(const Metrics& metrics);

// msprobe's columns ("NPU Name", "Bench Name", ..., "Accuracy Reached or Not", "Err_message"), A as the
// NPU side and B as the bench, followed by ours (MeanAbsErr, EucDist, RMSE, RelL2, AllcloseRatio,
// SQNR(dB), NaN/Inf Mismatch, Kind, Status, Match, NormRatio, Scale, ScaleStdErr, ScaleZ, ScaleNoiseP,
// RelL2Bound, NoiseRelL2, NoiseRatio, UpdateNoiseRelL2, UpdateNoiseRatio, BoundUse).
std::string csv_header();
void write_csv(std::ostream& out, const Comparison& comparison);

// Throw CompareError naming the file when it cannot be written.
void write_json_file(const std::filesystem::path& path, const Comparison& comparison);
void write_csv_file(const std::filesystem::path& path, const Comparison& comparison);

// Appends the comparison to a run file's comparison tables; returns its id.
std::int64_t save_to_run(const std::filesystem::path& run, const Comparison& comparison);

}  // namespace wb::compare
