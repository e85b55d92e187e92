// The split-point model: the predicted bucket timeline, the exact DP, the heuristics it is compared with
// (MG-WFBP, DDP's size caps, MindSpore's fixed split) and the estimation of its inputs from a run.
#include "profiler/analysis/split_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

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

Prediction predict_alpha_beta(const SplitModel& m, std::span<const int> split) {
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
  out.compute_end_ns = m.compute_end_ns;
  out.exposed_ns = std::max(0.0, out.comm_end_ns - m.compute_end_ns);
  out.step_ns = m.measured_step_ns - m.measured_exposed_ns + out.exposed_ns;
  return out;
}

namespace {

// The ready times the DP and the heuristics plan with: without the slowdown collectives cause when the
// model knows it, else as measured.
const std::vector<double>& heuristic_ready(const SplitModel& m) {
  return m.calibrated && m.ready_work_ns.size() == m.size() ? m.ready_work_ns : m.ready_ns;
}

}  // namespace

namespace {

// Linear interpolation through (x, y) points in ascending x; past the last point the last segment goes
// on when `extend`, else the end values hold.
double interpolate(const std::vector<std::pair<double, double>>& l, double x, bool extend) {
  if (l.empty()) return 0.0;
  if (x <= l.front().first) return l.front().second;
  if (l.size() == 1) return extend ? l.front().second * x / l.front().first : l.front().second;
  if (x >= l.back().first && !extend) return l.back().second;
  std::size_t hi = 1;
  while (hi + 1 < l.size() && l[hi].first < x) ++hi;
  const auto [x0, y0] = l[hi - 1];
  const auto [x1, y1] = l[hi];
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

}  // namespace

double allreduce_ns(const SplitModel& m, double bytes) {
  if (!m.calibrated || m.latency.empty()) return m.alpha_ns + m.beta_ns_per_byte * bytes;
  return interpolate(m.latency, bytes, true);
}

double allreduce_during_ns(const SplitModel& m, double bytes) {
  if (!m.calibrated || m.latency_during.empty()) return allreduce_ns(m, bytes);
  const auto& [last_bytes, last_ns] = m.latency_during.back();
  if (bytes <= last_bytes) return interpolate(m.latency_during, bytes, false);
  return allreduce_ns(m, bytes) * last_ns / std::max(allreduce_ns(m, last_bytes), 1.0);
}

double compute_slowdown(const SplitModel& m, double bytes) {
  return m.calibrated ? interpolate(m.slowdown, bytes, false) : 0.0;
}

namespace {

// The cost of a bucket's collective while backward still runs.
double bucket_cost(const SplitModel& m, double bytes) {
  return m.calibrated ? allreduce_during_ns(m, bytes) : m.alpha_ns + m.beta_ns_per_byte * bytes;
}

// One rank's backward in the simulation: compute advances one unit of work per ns, or 1 / (1 + s) per ns
// inside the intervals where a collective runs on the rank.
struct RankSim {
  double t = 0.0;  // time reached, ns after the earliest rank's backward start
  double w = 0.0;  // work done by then
  struct Slowed {
    double start, end, s;
  };
  std::vector<Slowed> slowed;  // collectives on this rank, in time order, and how much each slows compute

  // Advances to the moment the work done reaches `target` and returns it.
  double time_at(double target) {
    for (const Slowed& iv : slowed) {
      if (w >= target) break;
      if (iv.end <= t) continue;
      if (iv.start > t) {  // full speed until the interval
        const double step = std::min(iv.start - t, target - w);
        t += step;
        w += step;
        if (w >= target) break;
      }
      const double step = std::min((iv.end - t) / (1.0 + iv.s), target - w);
      t += step * (1.0 + iv.s);
      w += step;
    }
    if (w < target) {
      t += target - w;
      w = target;
    }
    return t;
  }
};

Prediction simulate(const SplitModel& m, std::span<const int> split) {
  const std::size_t p = m.size();
  const std::vector<allreduce::BucketRange> ranges = validate_split(split, p).ranges(static_cast<int>(p));
  Prediction out;
  out.split.assign(split.begin(), split.end());
  std::vector<RankSim> sim(m.ranks.size());
  for (std::size_t r = 0; r < sim.size(); ++r) sim[r].t = m.ranks[r].offset_ns;
  double stream_free = -std::numeric_limits<double>::infinity();
  for (auto range = ranges.rbegin(); range != ranges.rend(); ++range) {
    BucketPlan plan;
    plan.first = range->first;
    plan.last = range->end - 1;
    for (int i = plan.first; i <= plan.last; ++i) plan.bytes += m.bytes[static_cast<std::size_t>(i)];
    plan.ready_ns = -std::numeric_limits<double>::infinity();
    std::vector<double> join(sim.size());
    for (std::size_t r = 0; r < sim.size(); ++r) {
      double work = 0.0;
      for (int i = plan.first; i <= plan.last; ++i) work = std::max(work, m.ranks[r].ready_work[static_cast<std::size_t>(i)]);
      const double ready = sim[r].time_at(work);
      join[r] = std::max(ready, stream_free);
      plan.ready_ns = std::max(plan.ready_ns, ready);
    }
    // The last bucket holds the first layers' gradients: backward is over when it is ready.
    const bool during_compute = plan.first > 0;
    plan.start_ns = std::max(plan.ready_ns, stream_free);
    plan.end_ns = plan.start_ns + (during_compute ? allreduce_during_ns(m, plan.bytes) : allreduce_ns(m, plan.bytes));
    const double slow = compute_slowdown(m, plan.bytes);
    for (std::size_t r = 0; r < sim.size(); ++r) {
      // A rank that joins before the last one waits for it (polling), then the collective runs.
      if (join[r] < plan.start_ns) sim[r].slowed.push_back({join[r], plan.start_ns, m.wait_calibrated ? m.wait_slowdown : slow});
      sim[r].slowed.push_back({std::max(join[r], plan.start_ns), plan.end_ns, slow});
    }
    stream_free = plan.end_ns;
    out.buckets.push_back(plan);
  }
  double compute_end = 0.0;
  for (std::size_t r = 0; r < sim.size(); ++r) compute_end = std::max(compute_end, sim[r].time_at(m.ranks[r].compute_work));
  out.comm_end_ns = stream_free;
  out.compute_end_ns = compute_end;
  out.exposed_ns = std::max(0.0, out.comm_end_ns - compute_end);
  // The change against the run's own split, simulated alike, added to the measured step: what the
  // simulation gets wrong for both cancels out.
  const double tail = std::max(compute_end, out.comm_end_ns);
  out.step_ns = m.measured_step_ns + tail - (m.current_tail_ns > 0 ? m.current_tail_ns : m.measured_tail_ns);
  return out;
}

}  // namespace

Prediction predict(const SplitModel& m, std::span<const int> split) {
  if (m.size() == 0) throw AnalysisError("predict: the model has no parameters");
  return m.calibrated && !m.ranks.empty() ? simulate(m, split) : predict_alpha_beta(m, split);
}

std::vector<int> optimal_split(const SplitModel& m) {
  const std::size_t p = m.size();
  if (p == 0) throw AnalysisError("optimal_split: the model has no parameters");
  // Backward order k = 1..p is forward index p - k.
  const std::vector<double>& ready_of = heuristic_ready(m);
  auto r = [&](std::size_t k) { return ready_of[p - k]; };
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
      double end = std::max(f[i - 1], ready) + bucket_cost(m, bytes);
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
  // MG-WFBP's own alpha-beta terms: fitted to the calibration when there is one.
  double alpha = m.alpha_ns, beta = m.beta_ns_per_byte;
  if (m.calibrated && m.latency.size() >= 2) {
    std::vector<std::pair<double, double>> points;
    for (const auto& [b, t] : m.latency) points.emplace_back(b, allreduce_during_ns(m, b));
    const AlphaBeta fit = fit_alpha_beta(points);
    if (fit.valid) {
      alpha = std::max(0.0, fit.alpha_ns);
      beta = std::max(0.0, fit.beta_ns_per_byte);
    }
  }
  std::vector<double> bytes = m.bytes;
  const std::vector<double>& ready = heuristic_ready(m);
  std::vector<double> tc(static_cast<std::size_t>(n));
  for (int l = 0; l < n; ++l) tc[static_cast<std::size_t>(l)] = alpha + beta * bytes[static_cast<std::size_t>(l)];
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
      tc[u - 1] = alpha + beta * bytes[u - 1];
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

// Where one rank's backward pass ran in a step: its first start (t_ref), its last end, and when each
// module's last backward range ended. t_ref stays INT64_MAX when the step has no backward ranges.
struct BackwardSpan {
  std::int64_t t_ref = INT64_MAX;
  std::int64_t end = INT64_MIN;
  std::map<std::string, std::int64_t> module_end;
};

BackwardSpan backward_span(const RunData& run, StepIndex& index, int rank, int step, const store::StepRow* srow) {
  auto in_step = [&](const store::RangeRow& r) {
    return srow != nullptr ? (r.start_ns >= srow->start_ns && r.end_ns <= srow->end_ns) : r.step == step;
  };
  BackwardSpan out;
  auto add = [&](const store::RangeRow& r) {
    if (r.category != static_cast<std::uint8_t>(store::Category::backward) || !in_step(r)) return;
    out.t_ref = std::min(out.t_ref, r.start_ns);
    out.end = std::max(out.end, r.end_ns);
    auto& e = out.module_end[run.name(r.name)];
    e = std::max(e, r.end_ns);
  };
  if (srow != nullptr) {
    index.each(rank, srow->start_ns - 1, srow->end_ns + 1, add);
  } else {
    for (const auto& r : index.main_rows(rank)) add(r);
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
  std::int64_t t_ref = 0;        // its backward start (absolute)
  std::int64_t backward_end = 0; // its backward end (absolute)
  std::int64_t comm_end = 0;     // its last collective's end (absolute)
};

// Estimates the parameters' ready times in one rank's step into `ready` (forward order, ns after its
// backward start; all zero on entry), and measures the step.
StepTimes estimate_step(const RunData& run, StepIndex& index, const SplitModel& m, const std::vector<double>& cum,
                        int rank, int step, const std::vector<store::AllreduceRow>& rows, std::vector<double>& ready) {
  const store::StepRow* srow = index.step_row(rank, step);
  BackwardSpan bwd = backward_span(run, index, rank, step, srow);
  std::int64_t latest_ready = INT64_MIN;
  for (const auto& r : rows) latest_ready = std::max(latest_ready, r.ready_ns);
  if (bwd.t_ref == INT64_MAX) {
    // No backward ranges: measure from the step start, or from the first bucket's ready time.
    bwd.t_ref = srow != nullptr ? srow->start_ns : INT64_MAX;
    if (bwd.t_ref == INT64_MAX)
      for (const auto& r : rows) bwd.t_ref = std::min(bwd.t_ref, r.ready_ns);
    bwd.end = latest_ready;
  }
  add_ready_times(ready_anchors(rows, bwd, m.names), cum, ready);
  StepTimes out;
  out.t_ref = bwd.t_ref;
  out.backward_end = bwd.end;
  for (const auto& r : rows) out.comm_end = std::max(out.comm_end, r.end_ns);
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

// The calibrated cost model from the calibration rows; false (model unchanged) without them.
bool apply_calibration(const std::vector<store::CommCalibrationRow>& rows, SplitModel& m) {
  // A collective alone: the slowest rank's median (it ends for everyone when it ends for the last). While
  // computing, from the ready mark: the rank that marked last (the others' times include waiting for it,
  // which the simulation counts apart). Compute's slowdown: the mean over ranks of each rank's own ratio.
  std::map<std::int64_t, double> alone, during;
  std::map<std::int64_t, std::pair<double, int>> slowed;  // bytes -> (sum of s, ranks)
  std::map<int, double> compute;
  double waiting_sum = 0.0;
  int waiting_n = 0;
  for (const auto& r : rows) {
    const auto ns = static_cast<double>(r.median_ns);
    if (r.kind == "allreduce") alone[r.bytes] = std::max(alone[r.bytes], ns);
    else if (r.kind == "allreduce_during_compute") during[r.bytes] = during.count(r.bytes) ? std::min(during[r.bytes], ns) : ns;
    else if (r.kind == "compute") compute[r.rank] = ns;
  }
  for (const auto& r : rows) {
    if (!compute.count(r.rank) || compute[r.rank] <= 0) continue;
    if (r.kind == "compute_while_waiting") {
      waiting_sum += std::clamp(static_cast<double>(r.median_ns) / compute[r.rank] - 1.0, 0.0, 20.0);
      ++waiting_n;
    }
    if (r.kind != "compute_during_allreduce") continue;
    auto& [sum, n] = slowed[r.bytes];
    sum += std::clamp(static_cast<double>(r.median_ns) / compute[r.rank] - 1.0, 0.0, 20.0);
    ++n;
  }
  if (alone.empty()) return false;
  m.calibrated = true;
  m.latency.assign(alone.begin(), alone.end());
  m.latency_during.assign(during.begin(), during.end());
  m.slowdown.clear();
  for (const auto& [bytes, sn] : slowed) m.slowdown.emplace_back(static_cast<double>(bytes), sn.first / sn.second);
  m.wait_calibrated = waiting_n > 0;
  m.wait_slowdown = waiting_n > 0 ? waiting_sum / waiting_n : 0.0;
  return true;
}

// Backward work done by `t` (absolute) on a rank whose backward started at t_ref: the time, less what its
// own collectives (start, end, slowdown s) slowed it by.
struct CommSpan {
  std::int64_t start, end;
  double s;
};
double work_at(std::int64_t t, std::int64_t t_ref, const std::vector<CommSpan>& comm) {
  double lost = 0.0;
  for (const CommSpan& c : comm) {
    const auto overlap = std::max<std::int64_t>(0, std::min(c.end, t) - std::max(c.start, t_ref));
    lost += c.s / (1.0 + c.s) * static_cast<double>(overlap);
  }
  return static_cast<double>(t - t_ref) - lost;
}

// Per rank, the backward in work units and its start after the earliest rank's, averaged over the steps
// every rank measured; and the measured tail those steps had.
void add_rank_timings(const std::map<std::pair<int, int>, std::vector<store::AllreduceRow>>& by_step,
                      const std::map<std::pair<int, int>, std::pair<StepTimes, std::vector<double>>>& measured,
                      SplitModel& m) {
  const std::size_t p = m.size();
  std::map<int, SplitModel::RankTiming> sums;
  std::map<int, int> count;
  std::map<int, std::vector<int>> ranks_of_step;
  for (const auto& [key, v] : measured) ranks_of_step[key.first].push_back(key.second);
  std::size_t world = 0;
  for (const auto& [step, ranks] : ranks_of_step) world = std::max(world, ranks.size());
  double tail_sum = 0.0;
  int steps = 0;
  for (const auto& [step, ranks] : ranks_of_step) {
    if (ranks.size() != world) continue;  // a step some rank did not record
    std::int64_t earliest = INT64_MAX, latest_end = INT64_MIN;
    for (int r : ranks) {
      const StepTimes& t = measured.at({step, r}).first;
      earliest = std::min(earliest, t.t_ref);
      latest_end = std::max({latest_end, t.backward_end, t.comm_end});
    }
    tail_sum += static_cast<double>(latest_end - earliest);
    ++steps;
    std::map<int, std::int64_t> last_join;  // bucket -> when its last rank joined: the collective's start
    for (int r : ranks)
      for (const auto& row : by_step.at({r, step}))
        last_join[row.bucket] = std::max(last_join.count(row.bucket) ? last_join[row.bucket] : INT64_MIN, row.start_ns);
    for (int r : ranks) {
      const auto& [t, ready] = measured.at({step, r});
      std::vector<CommSpan> comm;
      for (const auto& row : by_step.at({r, step})) {
        // Waiting for the later ranks, then the collective itself.
        const double s = compute_slowdown(m, static_cast<double>(row.bytes));
        const std::int64_t start = std::clamp(last_join[row.bucket], row.start_ns, row.end_ns);
        if (start > row.start_ns) comm.push_back({row.start_ns, start, m.wait_calibrated ? m.wait_slowdown : s});
        comm.push_back({start, row.end_ns, s});
      }
      SplitModel::RankTiming& acc = sums[r];
      acc.rank = r;
      acc.ready_work.resize(p, 0.0);
      acc.offset_ns += static_cast<double>(t.t_ref - earliest);
      for (std::size_t i = 0; i < p; ++i)
        acc.ready_work[i] += work_at(t.t_ref + static_cast<std::int64_t>(ready[i]), t.t_ref, comm);
      acc.compute_work += work_at(t.backward_end, t.t_ref, comm);
      ++count[r];
    }
  }
  if (steps == 0) {
    m.calibrated = false;  // no step every rank measured: the simulation has nothing to start from
    return;
  }
  m.measured_tail_ns = tail_sum / steps;
  for (auto& [r, acc] : sums) {
    const double n = count[r];
    acc.offset_ns /= n;
    for (double& w : acc.ready_work) w /= n;
    acc.compute_work /= n;
    m.ranks.push_back(std::move(acc));
  }
  // The DP and the heuristics see the mean rank's ready times in work units (compute without collectives).
  m.ready_work_ns.assign(p, 0.0);
  for (std::size_t i = 0; i < p; ++i) {
    for (const auto& r : m.ranks) m.ready_work_ns[i] += r.ready_work[i];
    m.ready_work_ns[i] /= static_cast<double>(m.ranks.size());
  }
}

// A larger message never costs less: the least-squares non-decreasing fit to a cost curve (pool adjacent
// violators: a point below the one before it is averaged with it, repeatedly), so that noise in the
// medians does not draw a dip that the DP would then aim its buckets at.
void make_non_decreasing(std::vector<std::pair<double, double>>& curve) {
  struct Block {
    double sum;
    int n;
    double mean() const { return sum / n; }
  };
  std::vector<Block> blocks;
  for (const auto& pt : curve) {
    blocks.push_back({pt.second, 1});
    while (blocks.size() > 1 && blocks[blocks.size() - 2].mean() > blocks.back().mean()) {
      blocks[blocks.size() - 2].sum += blocks.back().sum;
      blocks[blocks.size() - 2].n += blocks.back().n;
      blocks.pop_back();
    }
  }
  std::size_t i = 0;
  for (const Block& b : blocks)
    for (int k = 0; k < b.n; ++k) curve[i++].second = b.mean();
}

// The run's own collectives as calibration points at the sizes it reduced: per bucket, from its last
// rank's join to its end (it ends for everyone when it ends for the last), the median over the steps
// every rank recorded. The bucket holding the first parameters runs after backward, so it joins the
// curve of a collective alone; the others ran while backward did. They were measured in this very job,
// so they replace calibration points within a quarter of their size: the calibration's sizes are a
// geometric ladder, and a cost that jumps between two of its sizes (a transport's protocol switch, a
// buffer past a cache) would otherwise be drawn as a straight line through the run's own sizes.
void add_run_points(const std::map<std::pair<int, int>, std::vector<store::AllreduceRow>>& by_step,
                    const std::set<int>& steps, SplitModel& m) {
  std::map<int, std::vector<const store::AllreduceRow*>> rows_of_step;
  std::set<int> ranks;
  for (const auto& [key, rows] : by_step) {
    ranks.insert(key.first);
    if (!steps.count(key.second)) continue;
    for (const auto& r : rows) rows_of_step[key.second].push_back(&r);
  }
  std::map<std::pair<int, std::int64_t>, std::vector<double>> spans;  // (first_param, bytes) -> per step
  for (const auto& [step, rows] : rows_of_step) {
    std::map<int, std::tuple<std::int64_t, std::int64_t, std::set<int>>> b;  // bucket -> last join, end, ranks
    for (const auto* r : rows) {
      auto [it, fresh] = b.try_emplace(r->bucket, r->start_ns, r->end_ns, std::set<int>{});
      auto& [join, end, seen] = it->second;
      if (!fresh) {
        join = std::max(join, r->start_ns);
        end = std::max(end, r->end_ns);
      }
      seen.insert(r->rank);
    }
    for (const auto* r : rows) {
      const auto& [join, end, seen] = b.at(r->bucket);
      if (r->rank != *seen.begin() || seen.size() != ranks.size() || end <= join) continue;  // once per bucket
      spans[{r->first_param, r->bytes}].push_back(static_cast<double>(end - join));
    }
  }
  auto near = [](double a, double b) { return a > b / 1.25 && a < b * 1.25; };
  for (const auto& [key, v] : spans) {
    auto& curve = key.first == 0 ? m.latency : m.latency_during;
    const auto bytes = static_cast<double>(key.second);  // (clang: a lambda cannot capture a binding)
    std::erase_if(curve, [&](const auto& pt) { return near(pt.first, bytes); });
  }
  for (auto& [key, v] : spans) {
    std::sort(v.begin(), v.end());
    const double median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2.0;
    auto& curve = key.first == 0 ? m.latency : m.latency_during;
    curve.emplace_back(static_cast<double>(key.second), median);
    std::sort(curve.begin(), curve.end());
    m.run_point_bytes.push_back(static_cast<double>(key.second));
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

  // Each rank's first step is left out when it has three or more: it creates the primitives.
  std::map<int, int> first_step;
  std::map<int, int> steps_of;
  for (const auto& [key, rows] : by_step) {
    if (!first_step.count(key.first)) first_step[key.first] = key.second;
    ++steps_of[key.first];
  }
  std::vector<double> sum(p, 0.0);
  StepIndex index(run);
  double compute_end_sum = 0.0, step_sum = 0.0, exposed_sum = 0.0;
  int used = 0;
  std::map<std::pair<int, int>, std::pair<StepTimes, std::vector<double>>> measured;  // (step, rank)
  for (const auto& [key, rows] : by_step) {
    if (steps_of[key.first] >= 3 && key.second == first_step[key.first]) continue;
    std::vector<double> ready(p, 0.0);
    const StepTimes t = estimate_step(run, index, m, cum, key.first, key.second, rows, ready);
    for (std::size_t i = 0; i < p; ++i) sum[i] += ready[i];
    compute_end_sum += t.compute_end_ns;
    exposed_sum += t.exposed_ns;
    step_sum += t.step_ns;
    ++used;
    measured[{key.second, key.first}] = {t, std::move(ready)};
  }
  m.steps_used = used;
  m.ready_ns.resize(p);
  for (std::size_t i = 0; i < p; ++i) m.ready_ns[i] = sum[i] / used;
  m.compute_end_ns = compute_end_sum / used;
  for (double r : m.ready_ns) m.compute_end_ns = std::max(m.compute_end_ns, r);
  m.measured_step_ns = step_sum / used;
  m.measured_exposed_ns = exposed_sum / used;
  if (apply_calibration(run.calibration, m)) {
    std::set<int> steps;
    for (const auto& [key, v] : measured) steps.insert(key.first);
    add_run_points(by_step, steps, m);
    make_non_decreasing(m.latency);
    make_non_decreasing(m.latency_during);
    add_rank_timings(by_step, measured, m);
  }

  fit_transfer_cost(run, m);

  std::set<int> starts;
  for (const auto& r : by_step.begin()->second)
    if (r.first_param > 0 && static_cast<std::size_t>(r.first_param) < p) starts.insert(r.first_param);
  m.current_split.assign(starts.begin(), starts.end());
  if (m.calibrated && !m.ranks.empty()) {
    const Prediction own = simulate(m, m.current_split);
    m.current_tail_ns = std::max(own.compute_end_ns, own.comm_end_ns);
  }
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

std::vector<Suggestion> ranked_candidates(const SplitModel& m) {
  std::vector<Suggestion> pool = suggest_splits(m);
  for (double mb : {1.0, 2.0, 5.0, 10.0, 50.0, 100.0}) {
    const double cap = mb * 1024 * 1024;
    pool.push_back(Suggestion{"DDP-style " + std::to_string(static_cast<int>(mb)) + " MB buckets",
                              predict(m, ddp_split(m, cap, cap))});
  }
  std::stable_sort(pool.begin(), pool.end(), [](const Suggestion& a, const Suggestion& b) {
    return a.prediction.step_ns < b.prediction.step_ns;
  });
  std::vector<Suggestion> out;
  std::set<std::vector<int>> seen;
  for (auto& c : pool)
    if (seen.insert(c.prediction.split).second) out.push_back(std::move(c));
  return out;
}

Suggestion best_split(const SplitModel& m) {
  const std::vector<Suggestion> ranked = ranked_candidates(m);
  const Suggestion* best = &ranked.front();
  // Ties (within 0.1%) go to fewer buckets: fewer collectives, less to go wrong.
  for (const Suggestion& c : ranked)
    if (c.prediction.step_ns <= ranked.front().prediction.step_ns * 1.001 &&
        c.prediction.buckets.size() < best->prediction.buckets.size())
      best = &c;
  return *best;
}

std::string format_split(std::span<const int> split) { return allreduce::SplitPoints::format(split); }

}  // namespace wb::analysis
