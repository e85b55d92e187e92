#include "store/rows.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <stdexcept>

namespace wb::store {
namespace {

constexpr std::array<std::string_view, 8> kCategoryNames = {"forward", "backward", "optimizer", "loss",
                                                            "data",    "h2d",      "comm",      "step"};
constexpr std::array<std::string_view, 4> kTrackKindNames = {"thread", "stream", "queue", "comm"};
constexpr std::array<std::string_view, 3> kKernelKindNames = {"kernel", "memcpy", "memset"};

template <std::size_t N>
std::string joined(const std::array<std::string_view, N>& names) {
  std::string out;
  for (auto n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace

std::string_view category_name(Category c) {
  auto i = static_cast<std::size_t>(c);
  return i < kCategoryNames.size() ? kCategoryNames[i] : std::string_view("unknown");
}

Category category_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kCategoryNames.size(); ++i)
    if (kCategoryNames[i] == name) return static_cast<Category>(i);
  throw std::invalid_argument("unknown range category '" + std::string(name) + "' (expected one of " +
                              joined(kCategoryNames) + ")");
}

std::string_view track_kind_name(TrackKind k) {
  auto i = static_cast<std::size_t>(k);
  return i < kTrackKindNames.size() ? kTrackKindNames[i] : std::string_view("unknown");
}

TrackKind track_kind_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kTrackKindNames.size(); ++i)
    if (kTrackKindNames[i] == name) return static_cast<TrackKind>(i);
  throw std::invalid_argument("unknown track kind '" + std::string(name) + "' (expected one of " +
                              joined(kTrackKindNames) + ")");
}

std::string_view kernel_kind_name(KernelKind k) {
  auto i = static_cast<std::size_t>(k);
  return i < kKernelKindNames.size() ? kKernelKindNames[i] : std::string_view("unknown");
}

std::string shape_to_json(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(shape[i]);
  }
  out += ']';
  return out;
}

std::vector<std::int64_t> shape_from_json(std::string_view text) {
  auto bad = [&]() {
    return std::invalid_argument("shape '" + std::string(text) + "' is not a JSON array of integers");
  };
  std::vector<std::int64_t> shape;
  std::size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) ++i;
  };
  skip_space();
  if (i >= text.size() || text[i] != '[') throw bad();
  ++i;
  skip_space();
  if (i < text.size() && text[i] == ']') {
    ++i;
  } else {
    while (true) {
      skip_space();
      std::int64_t v = 0;
      auto [ptr, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
      if (ec != std::errc()) throw bad();
      i = static_cast<std::size_t>(ptr - text.data());
      shape.push_back(v);
      skip_space();
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < text.size() && text[i] == ']') {
        ++i;
        break;
      }
      throw bad();
    }
  }
  skip_space();
  if (i != text.size()) throw bad();
  return shape;
}

std::string_view memory_role_name(int role) {
  static constexpr std::string_view kNames[kMemoryRoles] = {"activation", "gradient", "parameter", "momentum",
                                                             "workspace",  "data",     "other"};
  return role >= 0 && role < kMemoryRoles ? kNames[role] : kNames[kMemoryRoles - 1];
}

std::vector<CounterRow> launch_queue(std::uint32_t track, std::vector<std::pair<std::int64_t, std::int64_t>> launches) {
  std::vector<std::pair<std::int64_t, int>> edges;  // (time, 0 launch / 1 start)
  edges.reserve(launches.size() * 2);
  for (const auto& [call, start] : launches) {
    edges.emplace_back(call, 0);
    edges.emplace_back(start, 1);
  }
  launches = {};
  std::sort(edges.begin(), edges.end());
  std::vector<CounterRow> samples;
  samples.reserve(edges.size());
  double depth = 0;
  for (const auto& [t, kind] : edges) samples.push_back(CounterRow{track, t, depth += kind == 0 ? 1.0 : -1.0});
  return samples;
}

}  // namespace wb::store
