// The comparison pipeline: match A's tensors with the reference B's, compute metrics for every pair
// (in parallel across tensors), judge each with its profile's thresholds, order the rows in walk
// order and find the first divergence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compare/divergence.hpp"
#include "compare/match.hpp"
#include "compare/metrics.hpp"
#include "compare/tensor_set.hpp"
#include "compare/verdict.hpp"

namespace wb::compare {

// skipped: a kind one side marked as not comparable, or a row whose reference is more noise than signal
// (its own float32 noise over half its norm) or fed by such a row; its metrics are shown but not judged.
enum class RowStatus { pass, fail, shape_mismatch, missing_a, missing_b, skipped };
std::string_view status_name(RowStatus status);

// One row of the report: a matched pair or a tensor present on one side only.
struct RowResult {
  std::string name;   // B's key when present (the reference names rows), else A's
  std::string a_key;  // empty when missing in A
  std::string b_key;  // empty when missing in B
  std::optional<std::size_t> a_index, b_index;  // into the sets' tensors
  TensorKind kind = TensorKind::other;
  MatchMethod method = MatchMethod::none;
  RowStatus status = RowStatus::pass;
  std::optional<store::DType> a_dtype, b_dtype;
  std::vector<std::int64_t> a_shape, b_shape;
  std::optional<Metrics> metrics;         // absent for missing tensors and shape mismatches
  // param_after: the update (after - before); momentum: momentum - grad, the optimizer's own share.
  // Present when both sides hold the base tensor.
  std::optional<Metrics> update_metrics;
  Thresholds thresholds;                  // the rule (profile, then the mapping file's overrides)
  // The numeric bounds the row was judged by: `thresholds`, or with the reference's noise applied.
  Thresholds bounds;
  // The reference's own float32 noise on this tensor (B's wb.noise), when recorded and used: its rel-L2
  // against float64, and the row's error in units of it (||a - b|| / ||b - b64||); the same for the
  // update (param_after: after - before; momentum: momentum - grad).
  bool noise_applied = false;
  bool noise_flips = false;  // the noise counts flipped ReLUs (NoiseScale::flip_l2)
  std::optional<double> noise_rel_l2, noise_ratio, update_noise_rel_l2, update_noise_ratio;
  // The largest error / bound over the row's rel-L2, cosine, max-abs and update checks: 1 is at its
  // bound, over 1 fails. Unset for rows without such checks (bit-exact, missing, shape mismatch).
  std::optional<double> bound_use;
  std::string reason;                     // why it failed, or a note (e.g. dtypes differ)
  std::int64_t walk_position = 0;         // position in the walk (rows are sorted by it)

  bool failed() const { return status == RowStatus::fail || status == RowStatus::shape_mismatch; }
  // The noise ratio of the error the walk follows: the update's when the row has one, else the value's.
  std::optional<double> error_noise_ratio() const { return update_metrics ? update_noise_ratio : noise_ratio; }
  std::optional<double> error_noise_rel_l2() const { return update_metrics ? update_noise_rel_l2 : noise_rel_l2; }
};

struct CompareOptions {
  Profile profile = Profile::migration_fp32;
  const MappingFile* mapping = nullptr;
  bool auto_match = true;
  unsigned threads = 0;           // 0: std::thread::hardware_concurrency()
  std::size_t worst_count = 5;    // worst elements listed for the first divergence
};

struct Comparison {
  std::string a_source, b_source;
  Profile profile = Profile::migration_fp32;
  std::vector<RowResult> rows;  // in walk order
  std::vector<Ambiguity> ambiguities;
  std::optional<FirstDivergence> first_divergence;
  // Whose execution order the walk follows: "A" or "B" (the side that recorded one, A first), or
  // "none" (neither did: the kind order and the ResNet-50 module order known from the names).
  std::string order_side = "none";
  std::string order_note;  // one line for the report: which side and what recorded it
  std::string noise_note;  // how the reference's noise was measured and on how many rows it was used, or why not
  // Whose noise the rows were judged against: "reference" (B's wb.noise), "ours" (A's wb estimate-noise,
  // B recording none), or "" (fixed thresholds).
  std::string noise_source;
  std::int64_t passed = 0, failed = 0, missing_a = 0, missing_b = 0, skipped = 0;

  // Missing tensors are reported but do not fail a comparison: dumps legitimately differ in extras.
  bool all_pass() const { return failed == 0; }
};

// Throws CompareError when nothing at all could be matched (a wrong file or a mapping file is needed).
Comparison compare_sets(const TensorSet& a, const TensorSet& b, const CompareOptions& options = {});

}  // namespace wb::compare
