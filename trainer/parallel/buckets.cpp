#include "trainer/parallel/buckets.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "trainer/parallel/error.hpp"

namespace wb::parallel {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

void check_params(std::span<const ParamExtent> params) {
  if (params.empty()) throw DistError("gradient buckets: the model has no trainable parameters");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].numel <= 0 || params[i].offset < 0) {
      throw DistError("gradient buckets: parameter " + std::to_string(i) + " has offset " +
                      std::to_string(params[i].offset) + " and " + std::to_string(params[i].numel) +
                      " elements; expected offset >= 0 and at least one element");
    }
    if (i > 0 && params[i].offset < params[i - 1].offset + params[i - 1].numel) {
      throw DistError("gradient buckets: parameter " + std::to_string(i) + " starts at offset " +
                      std::to_string(params[i].offset) + ", inside parameter " + std::to_string(i - 1) +
                      "; expected ascending, non-overlapping offsets in forward order");
    }
  }
}

Bucket make_bucket(std::span<const ParamExtent> params, int index, int first, int end) {
  Bucket b;
  b.index = index;
  b.first_param = first;
  b.end_param = end;
  b.offset = params[static_cast<std::size_t>(first)].offset;
  const auto& last = params[static_cast<std::size_t>(end - 1)];
  b.numel = last.offset + last.numel - b.offset;
  return b;
}

}  // namespace

std::vector<Bucket> buckets_from_split(std::span<const ParamExtent> params, const allreduce::SplitPoints& split) {
  check_params(params);
  std::vector<allreduce::BucketRange> ranges;
  try {
    ranges = split.ranges(static_cast<int>(params.size()));
  } catch (const allreduce::SplitError& e) {
    throw DistError(e.what());
  }
  std::vector<Bucket> out;
  for (const auto& r : ranges) out.push_back(make_bucket(params, static_cast<int>(out.size()), r.first, r.end));
  return out;
}

std::vector<Bucket> buckets_from_split(std::span<const ParamExtent> params, std::span<const int> split) {
  try {
    return buckets_from_split(params, allreduce::SplitPoints::from_points({split.begin(), split.end()}));
  } catch (const allreduce::SplitError& e) {
    throw DistError(e.what());
  }
}

std::vector<Bucket> buckets_by_size(std::span<const ParamExtent> params, double bucket_mb) {
  check_params(params);
  if (!(bucket_mb > 0.0) || !std::isfinite(bucket_mb)) {
    std::ostringstream msg;
    msg << "--bucket-mb " << bucket_mb << ": expected a positive size in MiB";
    throw DistError(msg.str());
  }
  const double cap = bucket_mb * kMiB;
  // Walk backward (the order gradients appear), closing a bucket once it reaches the cap; the ranges
  // come out last-first and are renumbered in forward order at the end.
  std::vector<std::pair<int, int>> ranges;
  int end = static_cast<int>(params.size());
  double bytes = 0.0;
  for (int i = end - 1; i >= 0; --i) {
    bytes += static_cast<double>(params[static_cast<std::size_t>(i)].numel) * sizeof(float);
    if (bytes >= cap) {
      ranges.emplace_back(i, end);
      end = i;
      bytes = 0.0;
    }
  }
  if (end > 0) ranges.emplace_back(0, end);
  std::vector<Bucket> out;
  for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
    out.push_back(make_bucket(params, static_cast<int>(out.size()), it->first, it->second));
  }
  return out;
}

std::vector<Bucket> plan_buckets(std::span<const ParamExtent> params, const std::optional<allreduce::SplitPoints>& split,
                                 double bucket_mb) {
  if (split && bucket_mb > 0.0) {
    throw DistError("--allreduce-split and --bucket-mb both given; expected one way to form buckets");
  }
  if (split) return buckets_from_split(params, *split);
  return buckets_by_size(params, bucket_mb > 0.0 ? bucket_mb : kDefaultBucketMb);
}

std::vector<Bucket> buckets_before(std::span<const ParamExtent> params, std::span<const Bucket> buckets, int end_param) {
  std::vector<Bucket> out;
  for (const auto& b : buckets) {
    const int end = std::min(b.end_param, end_param);
    if (b.first_param < end) out.push_back(make_bucket(params, static_cast<int>(out.size()), b.first_param, end));
  }
  if (out.empty()) throw DistError("gradient buckets: no parameter before " + std::to_string(end_param));
  return out;
}

std::vector<int> bucket_of_params(std::span<const Bucket> buckets) {
  std::vector<int> out;
  for (const auto& b : buckets) {
    if (b.first_param != static_cast<int>(out.size())) {
      throw DistError("bucket_of_params: bucket " + std::to_string(b.index) + " starts at parameter " +
                      std::to_string(b.first_param) + "; expected " + std::to_string(out.size()));
    }
    out.insert(out.end(), static_cast<std::size_t>(b.tensors()), b.index);
  }
  return out;
}

std::string format_buckets(std::span<const Bucket> buckets, std::span<const std::string> names) {
  std::int64_t total = 0;
  for (const auto& b : buckets) total += b.bytes();
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%zu gradient buckets, %.2f MiB; allreduce order %d..0 (backward produces the last bucket first)\n",
                buckets.size(), static_cast<double>(total) / kMiB, static_cast<int>(buckets.size()) - 1);
  out << line;
  std::snprintf(line, sizeof line, "%6s  %-12s %7s %10s %12s\n", "bucket", "params", "tensors", "MiB", "bytes");
  out << line;
  for (const auto& b : buckets) {
    std::snprintf(line, sizeof line, "[%d, %d)", b.first_param, b.end_param);
    const std::string range = line;
    std::snprintf(line, sizeof line, "%6d  %-12s %7d %10.3f %12lld", b.index, range.c_str(), b.tensors(),
                  static_cast<double>(b.bytes()) / kMiB, static_cast<long long>(b.bytes()));
    out << line;
    if (static_cast<std::size_t>(b.end_param) <= names.size()) {
      out << "  " << names[static_cast<std::size_t>(b.first_param)];
      if (b.tensors() > 1) out << " .. " << names[static_cast<std::size_t>(b.last_param())];
    }
    out << '\n';
  }
  return out.str();
}

}  // namespace wb::parallel
