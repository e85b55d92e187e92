#include "profiler/analysis/pipeline.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "layout/resnet50.hpp"

namespace wb::analysis {

std::string pipeline_unit_name(int unit) {
  if (unit <= 0) return "head";
  if (unit >= kPipelineUnits - 1) return "fc";
  return layout::unit_name(unit);
}

int unit_of_module(const std::string& name) { return layout::unit_of_module(name); }

std::optional<PipelinePlanInfo> pipeline_plan(const RunData& run) {
  auto it = run.meta.find("pipeline_json");
  if (it == run.meta.end() || it->second.empty()) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception&) {
    throw AnalysisError(run.path.string() + ": meta pipeline_json is not JSON");
  }
  PipelinePlanInfo p;
  try {
    p.stages = j.at("stages").get<int>();
    p.replicas = j.value("replicas", 1);
    p.micro_batches = j.at("micro_batches").get<int>();
    p.micro_batch_size = j.value("micro_batch_size", 0);
    p.schedule = j.value("schedule", "gpipe");
    p.loss = j.value("loss", "sum");
    for (const auto& s : j.at("stage_units")) {
      p.first_unit.push_back(s.at("first_unit").get<int>());
      const std::string a = s.value("first", ""), b = s.value("last", "");
      p.stage_names.push_back(a == b ? a : a + ".." + b);
    }
    if (!j.at("stage_units").empty()) p.first_unit.push_back(j.at("stage_units").back().at("end_unit").get<int>());
  } catch (const nlohmann::json::exception& e) {
    throw AnalysisError(run.path.string() + ": meta pipeline_json: " + e.what());
  }
  if (p.stages < 1 || p.micro_batches < 1 || static_cast<int>(p.first_unit.size()) != p.stages + 1) {
    throw AnalysisError(run.path.string() + ": meta pipeline_json: expected stages >= 1, micro_batches >= 1 and one "
                        "stage_units entry per stage");
  }
  return p;
}

std::vector<int> balanced_split(const std::vector<double>& unit_ns, int stages) {
  const int n = static_cast<int>(unit_ns.size());
  if (stages < 1 || stages > n) return {};
  std::vector<double> prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<std::size_t>(i) + 1] = prefix[static_cast<std::size_t>(i)] + unit_ns[static_cast<std::size_t>(i)];
  auto sum = [&](int a, int b) { return prefix[static_cast<std::size_t>(b)] - prefix[static_cast<std::size_t>(a)]; };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest max over k stages covering units [0, i); cut[k][i]: where the last begins.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages) + 1, std::vector<double>(static_cast<std::size_t>(n) + 1, inf));
  std::vector<std::vector<int>> cut(static_cast<std::size_t>(stages) + 1, std::vector<int>(static_cast<std::size_t>(n) + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double v = std::max(best[static_cast<std::size_t>(k) - 1][static_cast<std::size_t>(j)], sum(j, i));
        if (v < best[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)]) {
          best[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = v;
          cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<int> first(static_cast<std::size_t>(stages) + 1, n);
  int i = n;
  for (int k = stages; k >= 1; --k) {
    first[static_cast<std::size_t>(k)] = i;
    i = cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
  }
  first[0] = 0;
  return first;
}

std::optional<int> micro_batches_for_bubble(const std::vector<double>& stage_ns, double target) {
  if (stage_ns.empty()) return std::nullopt;
  const double tmax = *std::max_element(stage_ns.begin(), stage_ns.end());
  const double tmean = std::accumulate(stage_ns.begin(), stage_ns.end(), 0.0) / static_cast<double>(stage_ns.size());
  if (!(tmax > 0.0)) return std::nullopt;
  const int S = static_cast<int>(stage_ns.size());
  for (int m = S; m <= 4096; ++m) {
    const double bubble = 1.0 - static_cast<double>(m) * tmean / (static_cast<double>(m + S - 1) * tmax);
    if (bubble < target - 1e-12) return m;  // strictly under: (S-1)/(M+S-1) = 10% exactly is not
  }
  return std::nullopt;
}

std::optional<PipelineAnalysis> analyze_pipeline(const RunData& run) {
  auto plan = pipeline_plan(run);
  if (!plan || run.pipeline_steps.empty()) return std::nullopt;
  PipelineAnalysis a;
  a.plan = *plan;
  const int S = plan->stages, M = plan->micro_batches;
  a.ideal = ideal_bubble(S, M);
  int first_step = std::numeric_limits<int>::max(), last_step = std::numeric_limits<int>::min();
  for (const auto& r : run.pipeline_steps) {
    first_step = std::min(first_step, r.step);
    last_step = std::max(last_step, r.step);
  }
  a.steady_from_step = last_step > first_step ? first_step + 1 : first_step;  // the first step warms up
  std::vector<double> bubble_sum(static_cast<std::size_t>(S)), busy(static_cast<std::size_t>(S)),
      wact(static_cast<std::size_t>(S)), wgrad(static_cast<std::size_t>(S)), war(static_cast<std::size_t>(S));
  std::vector<int> count(static_cast<std::size_t>(S));
  for (const auto& r : run.pipeline_steps) {
    StageBubble b;
    b.rank = r.rank;
    b.stage = r.stage;
    b.step = r.step;
    b.phase_ns = std::max<std::int64_t>(0, r.end_ns - r.start_ns - r.wait_allreduce_ns);
    b.busy_ns = r.busy_ns;
    b.wait_act_ns = r.wait_act_ns;
    b.wait_grad_ns = r.wait_grad_ns;
    b.wait_allreduce_ns = r.wait_allreduce_ns;
    b.bubble = b.phase_ns > 0 ? static_cast<double>(r.wait_act_ns + r.wait_grad_ns) / static_cast<double>(b.phase_ns) : 0.0;
    a.steps.push_back(b);
    if (r.step < a.steady_from_step || r.stage < 0 || r.stage >= S) continue;
    const auto s = static_cast<std::size_t>(r.stage);
    bubble_sum[s] += b.bubble;
    busy[s] += static_cast<double>(r.busy_ns);
    wact[s] += static_cast<double>(r.wait_act_ns);
    wgrad[s] += static_cast<double>(r.wait_grad_ns);
    war[s] += static_cast<double>(r.wait_allreduce_ns);
    ++count[s];
  }
  std::vector<double> stage_busy;
  for (int s = 0; s < S; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const double n = std::max(1, count[i]);
    a.stages.push_back({s, bubble_sum[i] / n, busy[i] / n, wact[i] / n, wgrad[i] / n, war[i] / n});
    stage_busy.push_back(busy[i] / n);
  }
  double mean_busy = 0, max_busy = 0;
  for (const auto& st : a.stages) {
    a.mean_bubble += st.bubble / S;
    mean_busy += st.busy_ns / S;
    max_busy = std::max(max_busy, st.busy_ns);
  }
  a.imbalance = mean_busy > 0 ? max_busy / mean_busy : 1.0;
  std::vector<double> per_micro;
  for (double b : stage_busy) per_micro.push_back(b / M);
  a.micro_for_10pct = micro_batches_for_bubble(per_micro, 0.10);

  // Per-unit compute: each module range of the steady steps on the ranks' main threads, summed per
  // unit, averaged over the ranks that ran the unit and the steps.
  std::vector<double> unit_total(kPipelineUnits, 0.0);
  std::vector<std::map<int, bool>> unit_ranks(kPipelineUnits);
  std::map<std::uint32_t, int> unit_of_name;
  const int steps = std::max(1, last_step - a.steady_from_step + 1);
  for (int rank : run.rank_ids()) {
    const std::uint32_t track = run.main_track(rank);
    if (track == 0) continue;
    for (const auto& r : run.ranges_of(track)) {
      if (r.step < a.steady_from_step) continue;
      const auto cat = static_cast<store::Category>(r.category);
      if (cat != store::Category::forward && cat != store::Category::backward && cat != store::Category::loss) continue;
      auto it = unit_of_name.find(r.name);
      if (it == unit_of_name.end()) it = unit_of_name.emplace(r.name, unit_of_module(run.name(r.name))).first;
      if (it->second < 0) continue;
      // Only the outermost range of a unit counts: a block's children lie inside the block's range.
      if (it->second >= 1 && it->second < kPipelineUnits - 1 && run.name(r.name) != pipeline_unit_name(it->second)) continue;
      unit_total[static_cast<std::size_t>(it->second)] += static_cast<double>(r.end_ns - r.start_ns);
      unit_ranks[static_cast<std::size_t>(it->second)][rank] = true;
    }
  }
  bool all_units = true;
  for (int u = 0; u < kPipelineUnits; ++u) {
    const auto i = static_cast<std::size_t>(u);
    const double ranks = static_cast<double>(std::max<std::size_t>(1, unit_ranks[i].size()));
    a.unit_ns.push_back(unit_total[i] / ranks / steps);
    if (unit_ranks[i].empty()) all_units = false;
  }
  if (all_units && S >= 2) {
    a.balanced_first_unit = balanced_split(a.unit_ns, S);
    std::vector<double> sums;
    for (int s = 0; s < S; ++s) {
      double t = 0;
      for (int u = a.balanced_first_unit[static_cast<std::size_t>(s)]; u < a.balanced_first_unit[static_cast<std::size_t>(s) + 1]; ++u)
        t += a.unit_ns[static_cast<std::size_t>(u)];
      sums.push_back(t / M);
    }
    const double mx = *std::max_element(sums.begin(), sums.end());
    const double mean = std::accumulate(sums.begin(), sums.end(), 0.0) / S;
    a.balanced_imbalance = mean > 0 ? mx / mean : 1.0;
    a.micro_for_10pct_balanced = micro_batches_for_bubble(sums, 0.10);
    a.balanced_flag = "--stage-split ";
    for (int s = 1; s < S; ++s) {
      if (s > 1) a.balanced_flag += ",";
      a.balanced_flag += pipeline_unit_name(a.balanced_first_unit[static_cast<std::size_t>(s)]);
    }
  }
  return a;
}

}  // namespace wb::analysis
