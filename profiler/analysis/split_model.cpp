// The split-point model: the predicted bucket timeline, the exact DP, the heuristics it is compared with
// (MG-WFBP, DDP's size caps, MindSpore's fixed split) and the estimation of its inputs from a run.
#include "profiler/analysis/split_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "profiler/analysis/allreduce.hpp"

namespace wb::analysis {

allreduce::SplitPoints validate_split(std::span<const int> split, std::size_t params) {
  try {
    allreduce::SplitPoints points = allreduce::SplitPoints::from_points({split.begin(), split.end()}, "split");
    points.validate(static_cast<int>(params), "split");
    return points;
  } catch (const allreduce::SplitError& e) {
    throw AnalysisError(e.what());
  }
}

Prediction predict(const SplitModel& m, std::span<const int> split) {
  const std::size_t p = m.size();
  if (p == 0) throw AnalysisError("predict: the model has no parameters");
  const std::vector<allreduce::BucketRange> ranges = validate_split(split, p).ranges(static_cast<int>(p));
  Prediction out;
  out.split.assign(split.begin(), split.end());
  double stream_free = -std::numeric_limits<double>::infinity();
  for (auto range = ranges.rbegin(); range != ranges.rend(); ++range) {
    BucketPlan plan;
    plan.first = range->first;
    plan.last = range->end - 1;
    plan.ready_ns = -std::numeric_limits<double>::infinity();
    for (int i = plan.first; i <= plan.last; ++i) {
      plan.bytes += m.bytes[static_cast<std::size_t>(i)];
      plan.ready_ns = std::max(plan.ready_ns, m.ready_ns[static_cast<std::size_t>(i)]);
    }
    plan.start_ns = std::max(plan.ready_ns, stream_free);
    plan.end_ns = plan.start_ns + m.alpha_ns + m.beta_ns_per_byte * plan.bytes;
    stream_free = plan.end_ns;
    out.buckets.push_back(plan);
  }
  out.comm_end_ns = stream_free;
  out.exposed_ns = std::max(0.0, out.comm_end_ns - m.compute_end_ns);
  out.step_ns = m.measured_step_ns - m.measured_exposed_ns + out.exposed_ns;
  return out;
}

std::vector<int> optimal_split(const SplitModel& m) {
  const std::size_t p = m.size();
  if (p == 0) throw AnalysisError("optimal_split: the model has no parameters");
  // Backward order k = 1..p is forward index p - k.
  auto r = [&](std::size_t k) { return m.ready_ns[p - k]; };
  auto s = [&](std::size_t k) { return m.bytes[p - k]; };
  std::vector<double> f(p + 1, 0.0);
  std::vector<std::size_t> from(p + 1, 1);
  f[0] = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 1; j <= p; ++j) {
    double best = std::numeric_limits<double>::infinity();
    double bytes = 0.0;
    double ready = -std::numeric_limits<double>::infinity();
    // i runs down from j so the bucket's bytes and latest ready time grow incrementally.
    for (std::size_t i = j; i >= 1; --i) {
      bytes += s(i);
      ready = std::max(ready, r(i));
      double end = std::max(f[i - 1], ready) + m.alpha_ns + m.beta_ns_per_byte * bytes;
      if (end <= best) {  // ties go to the larger bucket (fewer calls)
        best = end;
        from[j] = i;
      }
    }
    f[j] = best;
  }
  std::vector<int> split;
  for (std::size_t j = p; j >= 1;) {
    std::size_t i = from[j];
    // Backward bucket i..j is forward [p - j, p - i]; its start p - j is a split point unless 0.
    if (p - j > 0) split.push_back(static_cast<int>(p - j));
    j = i - 1;
  }
  std::sort(split.begin(), split.end());
  return split;
}

std::vector<int> mgwfbp_split(const SplitModel& m) {
  const int n = static_cast<int>(m.size());
  if (n == 0) throw AnalysisError("mgwfbp_split: the model has no parameters");
  const double alpha = m.alpha_ns;
  std::vector<double> bytes = m.bytes;
  const std::vector<double>& ready = m.ready_ns;
  std::vector<double> tc(static_cast<std::size_t>(n));
  for (int l = 0; l < n; ++l) tc[static_cast<std::size_t>(l)] = alpha + m.beta_ns_per_byte * bytes[static_cast<std::size_t>(l)];
  std::vector<double> taoc(static_cast<std::size_t>(n));
  auto update_taoc = [&] {
    taoc[static_cast<std::size_t>(n - 1)] = ready[static_cast<std::size_t>(n - 1)];
    for (int l = n - 2; l >= 0; --l) {
      auto u = static_cast<std::size_t>(l);
      taoc[u] = std::max(taoc[u + 1] + tc[u + 1], ready[u]);
    }
  };
  update_taoc();
  std::vector<int> group_starts;
  for (int l = n - 1; l >= 1; --l) {
    auto u = static_cast<std::size_t>(l);
    bool merge = false;
    if (ready[u - 1] < taoc[u] + tc[u]) {
      if (taoc[u] > ready[u - 1]) {
        merge = true;  // l has not started by the time l-1 is ready: one alpha saved for free
      } else if (ready[u - 1] - taoc[u] < alpha) {
        merge = true;  // waiting for l-1 costs less than a separate call
      }
    }
    if (merge) {
      bytes[u - 1] += bytes[u];
      bytes[u] = 0.0;
      tc[u] = 0.0;
      tc[u - 1] = alpha + m.beta_ns_per_byte * bytes[u - 1];
      update_taoc();
    } else {
      group_starts.push_back(l);  // l closes its group: the group's lowest index
    }
  }
  std::sort(group_starts.begin(), group_starts.end());
  return group_starts;
}

std::vector<int> ddp_split(const SplitModel& m, double cap_bytes, double first_cap_bytes) {
  const int n = static_cast<int>(m.size());
  std::vector<int> split;
  double in_bucket = 0.0;
  double cap = first_cap_bytes;
  for (int i = n - 1; i >= 0; --i) {
    in_bucket += m.bytes[static_cast<std::size_t>(i)];
    if (in_bucket >= cap && i > 0) {
      split.push_back(i);
      in_bucket = 0.0;
      cap = cap_bytes;
    }
  }
  std::sort(split.begin(), split.end());
  return split;
}

std::vector<int> mindspore_split(const SplitModel& m) {
  if (m.size() <= 160) return {};
  return {85, 160};
}

namespace {

std::string module_of(const std::string& param) {
  auto dot = param.rfind('.');
  return dot == std::string::npos ? param : param.substr(0, dot);
}

// The step row of a rank's step (the last one, should there be several), or null.
const store::StepRow* step_row(const RunData& run, int rank, int step) {
  const store::StepRow* srow = nullptr;
  for (const auto& s : run.steps)
    if (s.rank == rank && s.step == step) srow = &s;
  return srow;
}

// Where one rank's backward pass ran in a step: its first start (t_ref), its last end, and when each
// module's last backward range ended. t_ref stays INT64_MAX when the step has no backward ranges.
struct BackwardSpan {
  std::int64_t t_ref = INT64_MAX;
  std::int64_t end = INT64_MIN;
  std::map<std::string, std::int64_t> module_end;
};

BackwardSpan backward_span(const RunData& run, int rank, int step, const store::StepRow* srow) {
  auto in_step = [&](const store::RangeRow& r) {
    return srow != nullptr ? (r.start_ns >= srow->start_ns && r.end_ns <= srow->end_ns) : r.step == step;
  };
  BackwardSpan out;
  for (const auto& r : run.ranges_of(run.main_track(rank))) {
    if (r.category != static_cast<std::uint8_t>(store::Category::backward) || !in_step(r)) continue;
    out.t_ref = std::min(out.t_ref, r.start_ns);
    out.end = std::max(out.end, r.end_ns);
    auto& e = out.module_end[run.name(r.name)];
    e = std::max(e, r.end_ns);
  }
  return out;
}

// Anchors in backward order: k -> ready time relative to t_ref, from the buckets' first parameters and
// from the end of each parameter's module.
std::map<std::size_t, double> ready_anchors(const std::vector<store::AllreduceRow>& rows, const BackwardSpan& bwd,
                                            const std::vector<std::string>& names) {
  const std::size_t p = names.size();
  std::map<std::size_t, double> anchors;
  for (const auto& r : rows) {
    if (r.first_param < 0 || static_cast<std::size_t>(r.first_param) >= p) continue;
    anchors[p - 1 - static_cast<std::size_t>(r.first_param)] = static_cast<double>(r.ready_ns - bwd.t_ref);
  }
  for (std::size_t i = 0; i < p; ++i) {
    auto it = bwd.module_end.find(module_of(names[i]));
    if (it != bwd.module_end.end()) anchors[p - 1 - i] = static_cast<double>(it->second - bwd.t_ref);
  }
  return anchors;
}

// Adds each parameter's ready time to `sum` (forward order): its anchor, else interpolated by the
// cumulative bytes between the anchors around it (after the last anchor: the last anchor's time).
void add_ready_times(const std::map<std::size_t, double>& anchors, const std::vector<double>& cum,
                     std::vector<double>& sum) {
  const std::size_t p = sum.size();
  for (std::size_t k = 0; k < p; ++k) {
    double t;
    auto hi = anchors.lower_bound(k);
    if (hi != anchors.end() && hi->first == k) {
      t = hi->second;
    } else if (hi == anchors.end()) {
      t = anchors.empty() ? 0.0 : anchors.rbegin()->second;
    } else {
      double t0 = 0.0, c0 = 0.0;  // backward start
      if (hi != anchors.begin()) {
        auto lo = std::prev(hi);
        t0 = lo->second;
        c0 = cum[lo->first + 1];
      }
      double c1 = cum[hi->first + 1];
      double frac = c1 > c0 ? (cum[k + 1] - c0) / (c1 - c0) : 1.0;
      t = t0 + (hi->second - t0) * frac;
    }
    sum[p - 1 - k] += t;
  }
}

// One rank's step, measured: when its compute ended (from t_ref), its exposed communication and its
// length (0 without a step row).
struct StepTimes {
  double compute_end_ns = 0.0;
  double exposed_ns = 0.0;
  double step_ns = 0.0;
};

// Estimates the parameters' ready times in one rank's step, adding them to `sum`, and measures the step.
StepTimes estimate_step(const RunData& run, const SplitModel& m, const std::vector<double>& cum, int rank, int step,
                        const std::vector<store::AllreduceRow>& rows, std::vector<double>& sum) {
  const store::StepRow* srow = step_row(run, rank, step);
  BackwardSpan bwd = backward_span(run, rank, step, srow);
  std::int64_t latest_ready = INT64_MIN;
  for (const auto& r : rows) latest_ready = std::max(latest_ready, r.ready_ns);
  if (bwd.t_ref == INT64_MAX) {
    // No backward ranges: measure from the step start, or from the first bucket's ready time.
    bwd.t_ref = srow != nullptr ? srow->start_ns : INT64_MAX;
    if (bwd.t_ref == INT64_MAX)
      for (const auto& r : rows) bwd.t_ref = std::min(bwd.t_ref, r.ready_ns);
    bwd.end = latest_ready;
  }
  add_ready_times(ready_anchors(rows, bwd, m.names), cum, sum);
  StepTimes out;
  out.compute_end_ns = static_cast<double>(bwd.end - bwd.t_ref);
  StepComm c = step_comm(rows, bwd.end);
  out.exposed_ns = static_cast<double>(c.exposed_ns);
  out.step_ns = srow != nullptr ? static_cast<double>(srow->end_ns - srow->start_ns) : 0.0;
  return out;
}

// The allreduce cost model: the alpha-beta fit over the run's allreduces when it is valid and
// non-negative, else all of it charged to bandwidth.
void fit_transfer_cost(const RunData& run, SplitModel& m) {
  AlphaBeta fit = fit_alpha_beta(run.allreduces);
  if (fit.valid && fit.alpha_ns >= 0.0 && fit.beta_ns_per_byte >= 0.0) {
    m.alpha_ns = fit.alpha_ns;
    m.beta_ns_per_byte = fit.beta_ns_per_byte;
  } else {
    // One bucket size (or a fit with a negative term): charge it all to bandwidth, the conservative
    // choice for a model that can only merge or split.
    double ns = 0.0, b = 0.0;
    for (const auto& r : run.allreduces) {
      ns += static_cast<double>(r.end_ns - r.start_ns);
      b += static_cast<double>(r.bytes);
    }
    m.alpha_ns = 0.0;
    m.beta_ns_per_byte = b > 0 ? ns / b : 0.0;
  }
}

}  // namespace

SplitModel build_split_model(const RunData& run) {
  if (run.params.empty()) throw AnalysisError(run.path.string() + ": no param rows; the split model needs the parameter list");
  if (run.allreduces.empty()) throw AnalysisError(run.path.string() + ": no allreduce rows; record a multi-rank run (or --nproc 2)");
  SplitModel m;
  const std::size_t p = run.params.size();
  std::vector<store::ParamRow> params = run.params;
  std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.idx < b.idx; });
  std::int64_t total_numel = 0;
  for (const auto& prm : params) {
    m.names.push_back(prm.name);
    if (prm.bucket >= 0) total_numel += prm.numel;  // in no bucket: reduced elsewhere (a --shard-fc slice)
    else ++m.unbucketed;
  }

  std::map<std::pair<int, int>, std::vector<store::AllreduceRow>> by_step;
  for (const auto& r : run.allreduces) by_step[{r.rank, r.step}].push_back(r);
  // Bytes per element from one step's buckets (all parameters are reduced once per step).
  double elem = 4.0;
  {
    const auto& rows = by_step.begin()->second;
    std::int64_t b = 0;
    for (const auto& r : rows) b += r.bytes;
    if (total_numel > 0 && b > 0) elem = static_cast<double>(b) / static_cast<double>(total_numel);
  }
  for (const auto& prm : params) m.bytes.push_back(prm.bucket >= 0 ? static_cast<double>(prm.numel) * elem : 0.0);

  // Cumulative bytes in backward order, for interpolation.
  std::vector<double> cum(p + 1, 0.0);  // cum[k] = bytes of the first k params in backward order
  for (std::size_t k = 0; k < p; ++k) cum[k + 1] = cum[k] + m.bytes[p - 1 - k];

  std::vector<double> sum(p, 0.0);
  double compute_end_sum = 0.0, step_sum = 0.0, exposed_sum = 0.0;
  int used = 0;
  for (const auto& [key, rows] : by_step) {
    const StepTimes t = estimate_step(run, m, cum, key.first, key.second, rows, sum);
    compute_end_sum += t.compute_end_ns;
    exposed_sum += t.exposed_ns;
    step_sum += t.step_ns;
    ++used;
  }
  m.steps_used = used;
  m.ready_ns.resize(p);
  for (std::size_t i = 0; i < p; ++i) m.ready_ns[i] = sum[i] / used;
  m.compute_end_ns = compute_end_sum / used;
  for (double r : m.ready_ns) m.compute_end_ns = std::max(m.compute_end_ns, r);
  m.measured_step_ns = step_sum / used;
  m.measured_exposed_ns = exposed_sum / used;

  fit_transfer_cost(run, m);

  std::set<int> starts;
  for (const auto& r : by_step.begin()->second)
    if (r.first_param > 0 && static_cast<std::size_t>(r.first_param) < p) starts.insert(r.first_param);
  m.current_split.assign(starts.begin(), starts.end());
  return m;
}

std::vector<Suggestion> suggest_splits(const SplitModel& m) {
  std::vector<Suggestion> out;
  auto add = [&](std::string name, const std::vector<int>& split) {
    out.push_back(Suggestion{std::move(name), predict(m, split)});
  };
  add("current", m.current_split);
  add("optimal (DP)", optimal_split(m));
  add("MG-WFBP", mgwfbp_split(m));
  add("DDP 25 MB", ddp_split(m));
  if (!mindspore_split(m).empty()) add("MindSpore [85,160]", mindspore_split(m));
  add("single bucket", {});
  return out;
}

std::string format_split(std::span<const int> split) { return allreduce::SplitPoints::format(split); }

}  // namespace wb::analysis
