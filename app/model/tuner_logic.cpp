#include "app/model/tuner_logic.hpp"

#include <algorithm>
#include <cmath>

#include "allreduce/split_points.hpp"

namespace wb::app_model {

bool add_split(std::vector<int>& split, int s, int params) {
  if (s < 1 || s > params - 1) return false;
  auto it = std::lower_bound(split.begin(), split.end(), s);
  if (it != split.end() && *it == s) return false;
  split.insert(it, s);
  return true;
}

bool remove_split(std::vector<int>& split, std::size_t which) {
  if (which >= split.size()) return false;
  split.erase(split.begin() + static_cast<std::ptrdiff_t>(which));
  return true;
}

int move_split(std::vector<int>& split, std::size_t which, int s, int params) {
  if (which >= split.size()) return s;
  int lo = which == 0 ? 1 : split[which - 1] + 1;
  int hi = which + 1 < split.size() ? split[which + 1] - 1 : params - 1;
  split[which] = std::clamp(s, lo, std::max(lo, hi));
  return split[which];
}

double split_x(int s, int params, double x0, double width) {
  return x0 + static_cast<double>(params - s) * width / params;
}

int split_at_x(double x, int params, double x0, double width) {
  if (params < 2) return 1;
  double col = (x - x0) / (width / params);
  int s = params - static_cast<int>(std::lround(col));
  return std::clamp(s, 1, params - 1);
}

int param_at_x(double x, int params, double x0, double width) {
  if (params < 1 || x < x0 || x >= x0 + width) return -1;
  int col = static_cast<int>((x - x0) / (width / params));
  col = std::clamp(col, 0, params - 1);
  return params - 1 - col;
}

std::optional<std::size_t> split_near_x(const std::vector<int>& split, double x, int params, double x0,
                                        double width, double tolerance_px) {
  std::optional<std::size_t> best;
  double best_d = tolerance_px;
  for (std::size_t i = 0; i < split.size(); ++i) {
    double d = std::abs(split_x(split[i], params, x0, width) - x);
    if (d <= best_d) {
      best = i;
      best_d = d;
    }
  }
  return best;
}

std::string split_flags(const std::vector<int>& split) {
  return std::string(allreduce::kSplitFlag) + " " + allreduce::SplitPoints::format(split);
}

std::int64_t trial_median(std::vector<std::int64_t> v) {
  v.erase(std::remove(v.begin(), v.end(), -1), v.end());
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::vector<TrialSummary> summarize_trials(const std::vector<store::SplitTrialRow>& trials) {
  std::vector<TrialSummary> out;
  for (const auto& t : trials) {
    auto it = std::find_if(out.begin(), out.end(), [&](const TrialSummary& s) { return s.candidate == t.candidate; });
    if (it == out.end()) {
      out.push_back(TrialSummary{t.candidate, t.split, t.predicted_step_ns, {}, -1, 0.0});
      it = out.end() - 1;
    }
    it->rounds.push_back(t.exit_code == 0 ? t.median_step_ns : -1);
  }
  for (auto& s : out) s.median_ns = trial_median(s.rounds);
  auto current = std::find_if(out.begin(), out.end(), [](const TrialSummary& s) { return s.candidate == "current"; });
  if (current != out.end() && current->median_ns > 0)
    for (auto& s : out)
      if (s.median_ns >= 0) s.vs_current = static_cast<double>(s.median_ns) / static_cast<double>(current->median_ns) - 1.0;
  return out;
}

}  // namespace wb::app_model
