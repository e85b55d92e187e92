// The allreduce split: where the gradient allreduce is cut into buckets. One type for wb-train (the
// --allreduce-split flag and the allreduce_split config key), the split-point model of the analysis
// and the app's tuner, so the text, the checks and the buckets are the same everywhere.
//
// A split is MindSpore's all_reduce_fusion_config: strictly ascending split points s1 < ... < sk, each
// an index into the P trainable parameters in forward order with 0 < s < P, making the buckets
// [0,s1), [s1,s2), ..., [sk,P). ResNet-50 (P = 161) with 85,160 gives [0,85), [85,160), [160,161).
// No split points at all is the single bucket [0,P): SplitPoints::single_bucket(), written "none".
//
// Text form (parse and to_string): "85,160", or "none" for the single bucket. The parser is strict:
// decimal integers separated by single commas with nothing else (no spaces, no signs); it rejects an
// empty text, empty items ("85,", ",85", "85,,160"), anything not a whole number ("abc", "8.5", "+85"),
// points below 1 (0 would leave the first bucket empty; negatives), duplicates and points out of order
// (it never sorts: "160,85" is an error, not a guess). The upper bound s < P needs P: validate(P).
//
// Errors are SplitError, one line: the flag (or file and key) given as `what`, the offending text, and
// what was expected.
//
// Depends on the standard library only.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace wb::allreduce {

// The flag the errors name unless the caller gives another.
inline constexpr std::string_view kSplitFlag = "--allreduce-split";

class SplitError : public std::invalid_argument {
 public:
  explicit SplitError(const std::string& what) : std::invalid_argument(what) {}
};

// One bucket: the parameters [first, end) in forward order.
struct BucketRange {
  int first = 0;
  int end = 0;
  int size() const { return end - first; }
  bool operator==(const BucketRange&) const = default;
};

class SplitPoints {
 public:
  // The single bucket (no split points).
  SplitPoints() = default;
  static SplitPoints single_bucket() { return SplitPoints(); }
  // Strictly ascending points, each at least 1 (an empty list is the single bucket); throws SplitError
  // naming `what` otherwise.
  static SplitPoints from_points(std::vector<int> points, std::string_view what = kSplitFlag);
  // The text form (see above); throws SplitError naming `what`.
  static SplitPoints parse(std::string_view text, std::string_view what = kSplitFlag);
  // Any list of points written the way to_string writes valid ones ("85,160"; "none" when empty),
  // for messages about lists that may be invalid.
  static std::string format(std::span<const int> points);

  const std::vector<int>& points() const { return points_; }
  bool is_single_bucket() const { return points_.empty(); }
  std::size_t bucket_count() const { return points_.size() + 1; }
  // "85,160", or "none" for the single bucket; parse(to_string()) gives the same split.
  std::string to_string() const { return format(points_); }

  // Whether every point is below `params` (and so every bucket holds at least one parameter).
  bool fits(int params) const;
  // Throws SplitError naming `what` unless params >= 1 and every point is in (0, params).
  void validate(int params, std::string_view what = kSplitFlag) const;
  // The bucket (forward order, 0-based) holding parameter `param` (>= 0): how many points are <= it.
  int bucket_of(int param) const;
  // The buckets over `params` parameters in forward order; validate(params, what) first.
  std::vector<BucketRange> ranges(int params, std::string_view what = kSplitFlag) const;

  bool operator==(const SplitPoints&) const = default;

 private:
  std::vector<int> points_;
};

}  // namespace wb::allreduce
