#include "profiler/analysis/run_data.hpp"

#include <algorithm>
#include <set>

#include "store/reader.hpp"

namespace wb::analysis {

namespace {
const std::vector<store::RangeRow> kNoRanges;
const std::string kEmpty;
}  // namespace

const std::string& RunData::name(std::uint32_t id) const { return id < strings.size() ? strings[id] : kEmpty; }

const store::TrackRow* RunData::track(std::uint32_t id) const {
  for (const auto& t : tracks)
    if (t.id == id) return &t;
  return nullptr;
}

std::vector<int> RunData::rank_ids() const {
  std::set<int> ids;
  for (const auto& r : ranks) ids.insert(r.rank);
  for (const auto& t : tracks) ids.insert(t.rank);
  for (const auto& s : steps) ids.insert(s.rank);
  for (const auto& a : allreduces) ids.insert(a.rank);
  return {ids.begin(), ids.end()};
}

std::uint32_t RunData::main_track(int rank) const {
  std::uint32_t best = 0, named_main = 0, most = 0;
  std::size_t best_steps = 0, most_ranges = 0;
  for (const auto& t : tracks) {
    if (t.rank != rank || t.kind != store::TrackKind::thread) continue;
    const auto& rows = ranges_of(t.id);
    std::size_t n_steps = static_cast<std::size_t>(std::count_if(rows.begin(), rows.end(), [](const auto& r) {
      return r.category == static_cast<std::uint8_t>(store::Category::step);
    }));
    if (n_steps > best_steps) {
      best_steps = n_steps;
      best = t.id;
    }
    if (name(t.name) == "main" && named_main == 0) named_main = t.id;
    if (rows.size() > most_ranges) {
      most_ranges = rows.size();
      most = t.id;
    }
  }
  if (best != 0) return best;
  if (named_main != 0) return named_main;
  return most;
}

const std::vector<store::RangeRow>& RunData::ranges_of(std::uint32_t track) const {
  auto it = ranges.find(track);
  return it == ranges.end() ? kNoRanges : it->second;
}

std::int64_t RunData::dropped_events() const {
  std::int64_t n = 0;
  for (const auto& r : ranks) n += r.dropped_events;
  return n;
}

bool RunData::complete() const {
  auto it = meta.find("complete");
  return it != meta.end() && it->second == "1";
}

RunData load_run(store::Reader& reader) {
  RunData run;
  run.path = reader.path();
  run.meta = reader.meta();
  run.config = reader.config();
  run.strings = reader.strings();
  run.ranks = reader.ranks();
  run.tracks = reader.tracks();
  for (const auto& t : run.tracks) {
    if (t.kind == store::TrackKind::queue) {
      run.counters[t.id] = reader.counters(t.id);
    } else if (t.kind == store::TrackKind::stream) {
      auto rows = reader.kernels(t.id);
      if (!rows.empty()) run.kernels[t.id] = std::move(rows);
    } else {
      auto rows = reader.ranges(t.id);
      if (!rows.empty()) run.ranges[t.id] = std::move(rows);
    }
  }
  run.steps = reader.steps();
  run.allreduces = reader.allreduces();
  run.params = reader.params();
  auto counts = reader.row_counts();
  run.kernel_rows = counts.count("kernel") ? counts["kernel"] : 0;
  return run;
}

RunData load_run(const std::filesystem::path& path) {
  store::Reader reader(path);
  return load_run(reader);
}

std::int64_t union_length(std::vector<std::pair<std::int64_t, std::int64_t>> intervals, std::int64_t lo,
                          std::int64_t hi) {
  for (auto& iv : intervals) {
    iv.first = std::max(iv.first, lo);
    iv.second = std::min(iv.second, hi);
  }
  std::erase_if(intervals, [](const auto& iv) { return iv.second <= iv.first; });
  std::sort(intervals.begin(), intervals.end());
  std::int64_t total = 0, cur_start = 0, cur_end = INT64_MIN;
  for (const auto& [s, e] : intervals) {
    if (s > cur_end) {
      if (cur_end != INT64_MIN) total += cur_end - cur_start;
      cur_start = s;
      cur_end = e;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (cur_end != INT64_MIN) total += cur_end - cur_start;
  return total;
}

}  // namespace wb::analysis
