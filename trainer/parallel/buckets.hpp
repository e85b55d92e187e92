#pragma once
// Gradient buckets: contiguous ranges of the forward-ordered trainable parameters, each a slice of the
// contiguous gradient buffer, so a bucket's allreduce is one in-place call with no fusion-buffer copy.
//
// Buckets are numbered in forward order (bucket 0 holds parameter 0). Backward produces the last
// bucket first, so allreduces run from the highest bucket index down to 0.
//
// Two ways to choose them:
//  - split points (--allreduce-split), MindSpore's all_reduce_fusion_config: an allreduce::SplitPoints
//    (allreduce/split_points.hpp: the text form, the checks, the ranges). ResNet-50 (P = 161) with
//    85,160 gives [0,85), [85,160), [160,161); "none" is the single bucket [0,161).
//  - a size cap (--bucket-mb, MiB like DDP's bucket_cap_mb): walk the parameters from last to first
//    and close the bucket as soon as it holds at least the cap. Default: 25 MiB.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "allreduce/split_points.hpp"

namespace wb::parallel {

inline constexpr double kDefaultBucketMb = 25.0;

// Where one parameter's gradient lives in the gradient buffer, in floats.
struct ParamExtent {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

// Reads .offset and .numel from any forward-ordered table (the model's ParamInfo).
template <class Table>
std::vector<ParamExtent> param_extents(const Table& table) {
  std::vector<ParamExtent> out;
  out.reserve(table.size());
  for (const auto& p : table) {
    out.push_back({static_cast<std::int64_t>(p.offset), static_cast<std::int64_t>(p.numel)});
  }
  return out;
}

struct Bucket {
  int index = 0;
  int first_param = 0;  // forward index of its first parameter
  int end_param = 0;    // one past its last parameter
  std::int64_t offset = 0;  // slice of the gradient buffer, in floats
  std::int64_t numel = 0;
  int tensors() const { return end_param - first_param; }
  int last_param() const { return end_param - 1; }
  std::int64_t bytes() const { return numel * static_cast<std::int64_t>(sizeof(float)); }
  bool operator==(const Bucket&) const = default;
};

// All of these throw DistError naming the flag and what was expected. `params` must be in forward order
// with ascending, non-overlapping extents.
std::vector<Bucket> buckets_from_split(std::span<const ParamExtent> params, const allreduce::SplitPoints& split);
// The same from a plain list of points (checked as allreduce::SplitPoints::from_points does).
std::vector<Bucket> buckets_from_split(std::span<const ParamExtent> params, std::span<const int> split);
std::vector<Bucket> buckets_by_size(std::span<const ParamExtent> params, double bucket_mb);
// wb-train's rule: split points when given (allreduce::SplitPoints::single_bucket() included), else
// --bucket-mb when > 0, else 25 MiB buckets. Giving both is an error.
std::vector<Bucket> plan_buckets(std::span<const ParamExtent> params, const std::optional<allreduce::SplitPoints>& split,
                                 double bucket_mb);

// `buckets` without the parameters from `end_param` on: each range cut there, the emptied ones dropped,
// the rest renumbered (a sharded classifier's slices stay out of the data-parallel allreduce).
std::vector<Bucket> buckets_before(std::span<const ParamExtent> params, std::span<const Bucket> buckets, int end_param);

// For every parameter, the index of the bucket holding it (the store's param.bucket).
std::vector<int> bucket_of_params(std::span<const Bucket> buckets);

// The start-up table: one line per bucket with its index range, tensor count, MiB and, when names
// are given (forward order), its first and last parameter names.
std::string format_buckets(std::span<const Bucket> buckets, std::span<const std::string> names = {});

}  // namespace wb::parallel
