#include "profiler/analysis/blocking_comm.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "profiler/analysis/report.hpp"

namespace wb::analysis {

std::vector<bool> blocking_name_ids(const RunData& run, const BlockingClassifier& classify) {
  std::vector<bool> ids(run.strings.size(), false);
  for (std::size_t i = 0; i < run.strings.size(); ++i) ids[i] = classify(run.strings[i]).has_value();
  return ids;
}

BlockingCommSummary blocking_comm_summary(const RunData& run, const BlockingClassifier& classify) {
  BlockingCommSummary s;
  const std::vector<bool> ids = blocking_name_ids(run, classify);
  if (std::find(ids.begin(), ids.end(), true) == ids.end()) return s;
  const auto comm = static_cast<std::uint8_t>(store::Category::comm);
  // (step, name, occurrence within the step) -> the span on each rank, for the skew estimate.
  std::map<std::tuple<int, std::uint32_t, int>, std::vector<std::int64_t>> spans;
  std::map<std::string, BlockingPart> layers;
  std::map<std::pair<int, int>, std::int64_t> per_rank_step;  // (rank, step) -> time in collectives
  std::map<std::pair<int, int>, int> count_per_rank_step;
  double forward = 0, backward = 0;
  for (int rank : run.rank_ids()) {
    std::map<std::pair<int, std::uint32_t>, int> seen;
    for (const auto& r : run.ranges_of(run.main_track(rank))) {
      if (r.category != comm || r.name >= ids.size() || !ids[r.name] || r.step < 0) continue;
      const std::int64_t d = r.end_ns - r.start_ns;
      const BlockingName part = *classify(run.name(r.name));
      const bool fwd = part.forward;
      BlockingPart& l = layers[part.part];
      l.layer = part.part;
      (fwd ? l.forward_ns : l.backward_ns) += d;
      (fwd ? forward : backward) += static_cast<double>(d);
      per_rank_step[{rank, r.step}] += d;
      ++count_per_rank_step[{rank, r.step}];
      const int k = seen[{r.step, r.name}]++;
      spans[{r.step, r.name, k}].push_back(d);
    }
  }
  s.ranks = static_cast<int>(run.rank_ids().size());
  // Steps: the step rows that hold collectives.
  double step_total = 0, sync_total = 0;
  int rows = 0;
  for (const auto& st : run.steps) {
    auto it = per_rank_step.find({st.rank, st.step});
    if (it == per_rank_step.end()) continue;
    ++rows;
    step_total += static_cast<double>(st.end_ns - st.start_ns);
    sync_total += static_cast<double>(it->second);
  }
  if (rows == 0) return BlockingCommSummary{};
  s.steps = rows;
  s.step_ns = step_total / rows;
  s.sync_ns = sync_total / rows;
  const double rank_steps = static_cast<double>(per_rank_step.size());
  s.forward_ns = forward / rank_steps;
  s.backward_ns = backward / rank_steps;
  int most = 0;
  for (const auto& [key, n] : count_per_rank_step) most = std::max(most, n);
  s.collectives_per_step = most;
  double skew = 0;
  for (const auto& [key, v] : spans) {
    if (v.size() < 2) continue;  // seen on one rank only: nothing to compare
    const std::int64_t fastest = *std::min_element(v.begin(), v.end());
    for (std::int64_t d : v) skew += static_cast<double>(d - fastest);
  }
  s.skew_ns = skew / rank_steps;
  for (auto& [name, l] : layers) s.layers.push_back(l);
  std::sort(s.layers.begin(), s.layers.end(), [](const BlockingPart& a, const BlockingPart& b) {
    return a.forward_ns + a.backward_ns > b.forward_ns + b.backward_ns;
  });
  return s;
}

void write_blocking_lines(const BlockingCommSummary& s, std::ostream& out, const std::string& parts_label,
                          std::size_t top) {
  char share[32];
  std::snprintf(share, sizeof share, "%.1f%%", s.step_ns > 0 ? 100.0 * s.sync_ns / s.step_ns : 0.0);
  out << "  per step and rank: " << s.collectives_per_step << " collectives, " << format_ns(s.sync_ns) << " = "
      << share << " of the step (" << format_ns(s.step_ns) << "), all of it exposed: forward "
      << format_ns(s.forward_ns) << ", backward " << format_ns(s.backward_ns) << "\n";
  out << "  of it waiting for a slower rank " << format_ns(s.skew_ns) << ", in the collectives themselves "
      << format_ns(std::max(0.0, s.sync_ns - s.skew_ns)) << "\n";
  if (!s.layers.empty()) {
    out << "  " << parts_label << " (all ranks and steps):";
    for (std::size_t i = 0; i < s.layers.size() && i < top; ++i) {
      const auto& l = s.layers[i];
      out << (i ? ", " : " ") << l.layer << " " << format_ns(static_cast<double>(l.forward_ns + l.backward_ns));
    }
    out << "\n";
  }
}

}  // namespace wb::analysis
