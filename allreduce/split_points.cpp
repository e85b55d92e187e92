#include "allreduce/split_points.hpp"

#include <algorithm>
#include <charconv>

namespace wb::allreduce {

namespace {

constexpr std::string_view kNone = "none";
constexpr std::string_view kExpected =
    "expected strictly ascending parameter indices of at least 1 separated by commas, such as 85,160 "
    "(or none for one bucket)";

// 'text' (appended piece by piece: GCC 12 warns falsely about `"'" + std::string(...)`).
std::string quoted(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '\'';
  out.append(text);
  out += '\'';
  return out;
}

// "--allreduce-split '85,,160': <why>; <expected>"
[[noreturn]] void fail_text(std::string_view what, std::string_view text, std::string_view why) {
  std::string msg(what);
  msg.append(" ").append(quoted(text)).append(": ").append(why).append("; ").append(kExpected);
  throw SplitError(msg);
}

// The order checks shared by parse and from_points; returns the reason, or "" when the list is valid.
std::string order_problem(std::span<const int> points) {
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (points[i] < 1) {
      return "split point " + std::to_string(points[i]) +
             (points[i] == 0 ? " would leave the first bucket empty" : " is negative");
    }
    if (i > 0 && points[i] == points[i - 1]) return "split point " + std::to_string(points[i]) + " appears twice";
    if (i > 0 && points[i] < points[i - 1]) {
      return "split point " + std::to_string(points[i]) + " follows " + std::to_string(points[i - 1]) +
             " (out of order)";
    }
  }
  return {};
}

}  // namespace

SplitPoints SplitPoints::from_points(std::vector<int> points, std::string_view what) {
  if (const std::string why = order_problem(points); !why.empty()) {
    throw SplitError(std::string(what) + " " + format(points) + ": " + why + "; " + std::string(kExpected));
  }
  SplitPoints s;
  s.points_ = std::move(points);
  return s;
}

SplitPoints SplitPoints::parse(std::string_view text, std::string_view what) {
  if (text == kNone) return single_bucket();
  if (text.empty()) fail_text(what, text, "no split points given");
  std::vector<int> points;
  std::size_t pos = 0;
  for (int item_no = 1;; ++item_no) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    if (item.empty()) fail_text(what, text, "item " + std::to_string(item_no) + " is empty");
    int value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec == std::errc::result_out_of_range) fail_text(what, text, quoted(item).append(" is too large"));
    if (ec != std::errc() || ptr != item.data() + item.size()) {
      fail_text(what, text, quoted(item).append(" is not a whole number"));
    }
    points.push_back(value);
    if (comma == text.size()) break;
    pos = comma + 1;
  }
  if (const std::string why = order_problem(points); !why.empty()) fail_text(what, text, why);
  SplitPoints s;
  s.points_ = std::move(points);
  return s;
}

std::string SplitPoints::format(std::span<const int> points) {
  if (points.empty()) return std::string(kNone);
  std::string out;
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(points[i]);
  }
  return out;
}

bool SplitPoints::fits(int params) const {
  return params >= 1 && (points_.empty() || points_.back() < params);
}

void SplitPoints::validate(int params, std::string_view what) const {
  if (fits(params)) return;
  const std::string head = std::string(what) + " " + to_string() + ": ";
  if (params < 1) throw SplitError(head + "expected a model with trainable parameters, got " + std::to_string(params));
  if (params == 1) {
    throw SplitError(head + "the only trainable parameter makes one bucket; expected none (no split points)");
  }
  const auto bad = std::find_if(points_.begin(), points_.end(), [&](int s) { return s >= params; });
  throw SplitError(head + "expected ascending split points in [1, " + std::to_string(params - 1) + "] (" +
                   std::to_string(*bad) + " is out of range for the " + std::to_string(params) +
                   " trainable parameters)");
}

int SplitPoints::bucket_of(int param) const {
  return static_cast<int>(std::upper_bound(points_.begin(), points_.end(), param) - points_.begin());
}

std::vector<BucketRange> SplitPoints::ranges(int params, std::string_view what) const {
  validate(params, what);
  std::vector<BucketRange> out;
  out.reserve(bucket_count());
  int first = 0;
  for (const int s : points_) {
    out.push_back({first, s});
    first = s;
  }
  out.push_back({first, params});
  return out;
}

}  // namespace wb::allreduce
