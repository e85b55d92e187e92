// Everything the analyses read from a run file, loaded once. The analyses are pure functions over this
// struct (or over plain row vectors), so tests can hand-build runs with known answers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/rows.hpp"

namespace wb::store {
class Reader;
}

namespace wb::analysis {

// Bad input to an analysis (an invalid split, a run without the rows an analysis needs).
class AnalysisError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct RunData {
  std::filesystem::path path;
  std::map<std::string, std::string> meta;
  nlohmann::json config = nlohmann::json::object();
  std::vector<std::string> strings;
  std::vector<store::RankRow> ranks;
  std::vector<store::TrackRow> tracks;
  std::map<std::uint32_t, std::vector<store::RangeRow>> ranges;      // thread tracks, by start
  std::map<std::uint32_t, std::vector<store::CounterRow>> counters;  // queue tracks, by time
  std::vector<store::StepRow> steps;
  std::vector<store::AllreduceRow> allreduces;
  std::vector<store::ParamRow> params;
  std::map<std::uint32_t, std::vector<store::KernelRow>> kernels;    // stream tracks, by start
  std::int64_t kernel_rows = 0;

  const std::string& name(std::uint32_t id) const;
  const store::TrackRow* track(std::uint32_t id) const;
  std::vector<int> rank_ids() const;  // ranks with any data, ascending
  // The thread track of a rank that runs the training loop: the one with the most step ranges, else
  // the one named "main", else the one with the most ranges; 0 when the rank has no thread track.
  std::uint32_t main_track(int rank) const;
  // Ranges of a track (empty when none).
  const std::vector<store::RangeRow>& ranges_of(std::uint32_t track) const;
  // Total events dropped over all ranks.
  std::int64_t dropped_events() const;
  bool complete() const;
};

RunData load_run(store::Reader& reader);
RunData load_run(const std::filesystem::path& path);

// Concatenates text pieces. (Also sidesteps GCC 12's false -Wrestrict on `"literal" + std::string&&`.)
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

// Length of the union of [start, end) intervals, clipped to [lo, hi).
std::int64_t union_length(std::vector<std::pair<std::int64_t, std::int64_t>> intervals, std::int64_t lo,
                          std::int64_t hi);

}  // namespace wb::analysis
