// Formatting of the analyses as readable tables. The numbers come from the analysis functions; this
// file only decides what to show and flags what a user should look at first (run_warnings).
#include "profiler/analysis/report.hpp"

#include <optional>

#include "profiler/analysis/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "profiler/analysis/allreduce.hpp"
#include "profiler/analysis/critical_path.hpp"
#include "profiler/analysis/kernel_stats.hpp"
#include "profiler/analysis/memory.hpp"
#include "profiler/analysis/op_stats.hpp"
#include "profiler/analysis/pipeline.hpp"
#include "profiler/analysis/split_model.hpp"
#include "profiler/analysis/steps.hpp"
#include "profiler/analysis/stragglers.hpp"
#include "profiler/analysis/fc_shard.hpp"
#include "profiler/analysis/sync_bn.hpp"
#include "profiler/analysis/hta.hpp"
#include "profiler/analysis/tb_overview.hpp"

namespace wb::analysis {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void Table::print(std::ostream& out) const {
  std::vector<std::size_t> width;
  for (const auto& r : rows_)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (std::size_t k = 0; k < rows_.size(); ++k) {
    const auto& r = rows_[k];
    std::string line = "  ";
    for (std::size_t i = 0; i < r.size(); ++i) {
      std::string pad(width[i] - r[i].size(), ' ');
      line += i == 0 ? r[i] + pad : pad + r[i];
      if (i + 1 < r.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
    if (k == 0) {
      std::size_t total = 0;
      for (auto w : width) total += w + 2;
      out << "  " << std::string(total - 2, '-') << "\n";
    }
  }
}

namespace {

std::string pct(double part, double whole) { return whole > 0 ? fmt("%.1f%%", 100.0 * part / whole) : "-"; }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string format_ns(double ns) {
  double a = std::fabs(ns);
  if (a >= 1e9) return fmt("%.3f s", ns / 1e9);
  if (a >= 1e6) return fmt("%.3f ms", ns / 1e6);
  if (a >= 1e3) return fmt("%.1f us", ns / 1e3);
  return fmt("%.0f ns", ns);
}

std::vector<Straggler> find_stragglers(const RunData& run) {
  std::map<int, std::map<int, std::int64_t>> by_step;  // step -> rank -> duration
  std::set<int> ranks;
  for (const auto& s : run.steps) {
    by_step[s.step][s.rank] = s.end_ns - s.start_ns;
    ranks.insert(s.rank);
  }
  std::vector<Straggler> out;
  if (ranks.size() < 2) return out;
  std::map<int, int> slowest;
  std::map<int, std::pair<double, int>> sums;
  int shared = 0;
  for (const auto& [step, per_rank] : by_step) {
    if (per_rank.size() != ranks.size()) continue;
    ++shared;
    auto worst = std::max_element(per_rank.begin(), per_rank.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    ++slowest[worst->first];
    for (const auto& [r, d] : per_rank) {
      sums[r].first += static_cast<double>(d);
      ++sums[r].second;
    }
  }
  if (shared < 3) return out;
  for (const auto& [r, n] : slowest) {
    double frac = static_cast<double>(n) / shared;
    if (frac < 0.75) continue;
    double mean = sums[r].first / sums[r].second;
    std::vector<double> others;
    for (const auto& [o, s] : sums)
      if (o != r) others.push_back(s.first / s.second);
    double med = median(others);
    if (med > 0 && mean >= 1.05 * med) out.push_back(Straggler{r, frac, mean, med});
  }
  return out;
}

std::vector<Warning> run_warnings(const RunData& run) {
  std::vector<Warning> w;
  for (const auto& r : run.ranks) {
    if (r.dropped_events > 0) {
      w.push_back({"dropped", concat("rank ", std::to_string(r.rank), " dropped ", std::to_string(r.dropped_events),
                                     " events: its timings are incomplete (raise the recorder's pool or check the disk)")});
    }
  }
  if (!run.complete()) w.push_back({"incomplete", "the run is incomplete (meta.complete != 1): it was killed or a write failed"});
  Starvation st = starvation(run);
  for (const auto& r : st.per_rank) {
    if (r.level != InputBound::no) {
      w.push_back({"input-bound", concat("rank ", std::to_string(r.rank), " is ", input_bound_name(r.level), ": ",
                                         fmt("%.1f", r.percent),
                                         "% of step time waits for input (TF Profiler: >5% moderate, >20% high)")});
    }
  }
  for (const auto& q : st.queues) {
    if (q.flagged) {
      w.push_back({"empty-queue", concat("queue '", q.name, "' (rank ", std::to_string(q.rank), ") is empty in ",
                                         fmt("%.1f", 100.0 * q.empty_ratio), "% of samples (MindInsight flags >30%)")});
    }
  }
  std::map<int, std::pair<double, double>> comm;  // rank -> (exposed, step time)
  auto comms = step_comms(run);
  std::map<std::pair<int, int>, std::int64_t> step_len;
  for (const auto& s : run.steps) step_len[{s.rank, s.step}] = s.end_ns - s.start_ns;
  for (const auto& c : comms) {
    auto it = step_len.find({c.rank, c.step});
    if (it == step_len.end()) continue;
    comm[c.rank].first += static_cast<double>(c.exposed_ns);
    comm[c.rank].second += static_cast<double>(it->second);
  }
  for (const auto& [rank, v] : comm) {
    if (v.second > 0 && v.first / v.second > kExposedCommWarning) {
      w.push_back({"exposed-comm", concat("rank ", std::to_string(rank), ": exposed allreduce time is ", pct(v.first, v.second),
                                          " of step time; try `wb suggest-split`")});
    }
  }
  for (const auto& s : find_stragglers(run)) {
    w.push_back({"straggler", concat("rank ", std::to_string(s.rank), " is the slowest in ", fmt("%.0f", 100.0 * s.slowest_fraction),
                                     "% of steps: mean step ", format_ns(s.mean_step_ns), " vs ", format_ns(s.others_median_ns),
                                     " for the others")});
  }
  for (const auto& p : analyze_stragglers(run).persistent) {
    std::string ops;
    for (std::size_t i = 0; i < p.top_ops.size() && i < 3; ++i) ops += (i ? ", " : "") + p.top_ops[i].op;
    w.push_back({"straggler", concat("rank ", std::to_string(p.rank), " holds the allreduce back in ",
                                     fmt("%.0f", 100.0 * p.fraction), "% of steps (", format_ns(p.mean_lag_ns),
                                     " late, the others wait ", format_ns(p.mean_wait_caused_ns), "); cause: ",
                                     lag_cause_name(p.cause), ops.empty() ? "" : concat(" (", ops, ")"))});
  }
  return w;
}

ProfilerCost profiler_cost(const RunData& run) {
  ProfilerCost c;
  auto it = run.meta.find("profiler_ns_per_event");
  if (it == run.meta.end() || run.steps.empty()) return c;
  try {
    c.ns_per_event = std::stod(it->second);
  } catch (const std::exception&) {
    return c;
  }
  double events = 0, step_ns = 0;
  for (const auto& [track, rows] : run.ranges) events += static_cast<double>(rows.size());
  for (const auto& [track, rows] : run.counters) events += static_cast<double>(rows.size());
  // A triggered capture recorded events for its windows' steps only: the cost is per captured step.
  const bool captured = run.meta.count("capture") > 0;
  auto in_window = [&](const store::StepRow& s) {
    return std::any_of(run.capture_windows.begin(), run.capture_windows.end(), [&](const store::CaptureWindowRow& w) {
      return w.rank == s.rank && s.step >= w.first_step && s.step <= w.last_step;
    });
  };
  double rank_steps = 0;
  for (const auto& s : run.steps) {
    if (captured && !in_window(s)) continue;
    step_ns += static_cast<double>(s.end_ns - s.start_ns);
    ++rank_steps;
  }
  if (rank_steps == 0) return c;  // a capture that kept no step recorded no event to cost
  c.events_per_step = events / rank_steps;
  c.ns_per_step = c.ns_per_event * c.events_per_step;
  c.mean_step_ns = step_ns / rank_steps;
  c.percent = c.mean_step_ns > 0 ? 100.0 * c.ns_per_step / c.mean_step_ns : 0.0;
  c.known = true;
  return c;
}

void write_stragglers(const RunData& run, std::ostream& out) {
  const StragglerAnalysis a = analyze_stragglers(run);
  if (a.steps.empty()) return;
  out << "\nStragglers (per step, the rank whose gradients were ready last holds the allreduce back)\n";
  std::map<int, int> last_count;
  std::map<int, std::int64_t> lag_sum;
  for (const auto& s : a.steps) {
    ++last_count[s.last_rank];
    lag_sum[s.last_rank] += s.lag_ns;
  }
  Table t({"rank", "last in", "mean lag when last", "waited for others", "mean wait"});
  const double n = static_cast<double>(a.steps.size());
  for (std::size_t i = 0; i < a.ranks.size(); ++i) {
    const int r = a.ranks[i];
    const int last = last_count.count(r) ? last_count[r] : 0;
    t.add({std::to_string(r), concat(std::to_string(last), "/", std::to_string(a.steps.size()), " ", pct(last, n)),
           last ? format_ns(static_cast<double>(lag_sum[r]) / last) : "-",
           format_ns(static_cast<double>(a.total_wait_ns[i])), format_ns(static_cast<double>(a.total_wait_ns[i]) / n)});
  }
  t.print(out);
  if (a.persistent.empty()) {
    out << "  no persistent straggler (none is last in more than " << fmt("%.0f", 100.0 * kPersistentStragglerShare)
        << "% of steps)\n";
  }
  for (const auto& p : a.persistent) {
    out << "  persistent straggler: rank " << p.rank << ", last in " << p.steps_last << " of " << a.steps.size()
        << " steps, " << format_ns(p.mean_lag_ns) << " late on average; the others wait "
        << format_ns(p.mean_wait_caused_ns) << " per step for it\n";
    out << "    cause: " << lag_cause_name(p.cause) << " (over those steps: data wait +"
        << format_ns(static_cast<double>(p.data_extra_ns)) << ", ops +" << format_ns(static_cast<double>(p.ops_extra_ns))
        << ", host +" << format_ns(static_cast<double>(p.host_extra_ns)) << ")\n";
    for (const auto& op : p.top_ops) {
      out << "    " << op.op << " +" << format_ns(static_cast<double>(op.extra_ns) / p.steps_last) << " per step\n";
    }
  }
}

void write_split_suggestions(const RunData& run, std::ostream& out) {
  SplitModel m = build_split_model(run);
  out << "Allreduce split suggestions (" << m.size() << " parameters";
  if (m.unbucketed > 0) out << ", " << m.unbucketed << " of them outside the data-parallel allreduce";
  out << ", model over " << m.steps_used << " rank-steps; ";
  if (!m.calibrated) out << "alpha " << format_ns(m.alpha_ns) << ", beta " << fmt("%.4g", m.beta_ns_per_byte) << " ns/B; ";
  out << "backward compute ends at " << format_ns(m.compute_end_ns) << ")\n";
  if (m.calibrated) {
    out << "  cost model: the communicator's calibration, simulated across " << m.ranks.size() << " ranks\n";
    Table c({"bucket", "allreduce alone", "while backward runs", "backward slowed", "from"});
    auto from = [&](double bytes) {
      return std::find(m.run_point_bytes.begin(), m.run_point_bytes.end(), bytes) != m.run_point_bytes.end() ? "this run"
                                                                                                            : "calibration";
    };
    for (const auto& [bytes, ns] : m.latency_during)
      c.add({format_bytes(bytes), format_ns(allreduce_ns(m, bytes)), format_ns(ns),
             fmt("x%.2f", 1.0 + compute_slowdown(m, bytes)), from(bytes)});
    c.add({format_bytes(m.latency.back().first), format_ns(m.latency.back().second),
           format_ns(allreduce_during_ns(m, m.latency.back().first)), fmt("x%.2f", 1.0 + compute_slowdown(m, m.latency.back().first)),
           from(m.latency.back().first)});
    c.print(out);
    if (!m.run_point_bytes.empty())
      out << "  \"this run\": the run's own collectives at its bucket sizes (median, from the last rank's join to the end),\n"
             "  in place of the calibration's points within a quarter of their size\n";
    if (m.wait_calibrated)
      out << "  while a rank waits in a collective for a later rank: backward slowed " << fmt("x%.2f", 1.0 + m.wait_slowdown) << "\n";
  }
  Table t({"strategy", "split", "buckets", "comm end", "exposed", "pred. step"});
  const auto suggestions = suggest_splits(m);
  for (const auto& s : suggestions) {
    const auto& p = s.prediction;
    std::string split = format_split(p.split);
    if (split.size() > 48) split = split.substr(0, 45) + "...";  // in full below
    t.add({s.strategy, split, std::to_string(p.buckets.size()), format_ns(p.comm_end_ns), format_ns(p.exposed_ns),
           m.measured_step_ns > 0 ? format_ns(p.step_ns) : "-"});
  }
  t.print(out);
  out << "  measured: step " << format_ns(m.measured_step_ns) << ", exposed communication " << format_ns(m.measured_exposed_ns)
      << "\n  Apply with (each strategy's whole split):\n";
  for (const auto& s : suggestions) {
    out << "    " << s.strategy << ": wb-train --allreduce-split " << format_split(s.prediction.split) << "\n";
  }
  if (!m.calibrated) {
    out << "  The cost model is the alpha-beta fit to the run's own allreduce spans, and unreliable: those spans\n"
           "  include the wait for the slowest rank, and compute slowed by the collectives is not modelled. Record\n"
           "  the run with the communicator's calibration (wb-train's default for data-parallel jobs).\n";
  }
  const Suggestion best = best_split(m);
  out << "  The model's pick: " << best.strategy << ", " << best.prediction.buckets.size() << " buckets, predicted step "
      << format_ns(best.prediction.step_ns) << ": wb-train --allreduce-split " << format_split(best.prediction.split)
      << "\n  Predictions are a model; wb tune-split " << run.path.string()
      << " measures the best candidates in short trial runs and keeps the fastest.\n";
}

namespace {

// GPU time per launching op and the top kernels (runs recorded with CUPTI).
void write_kernel_sections(const KernelStats& k, std::ostream& out, std::size_t top) {
  out << "\nGPU time by op (device activity linked to the host range that launched it)\n";
  out << "  " << k.activities << " device activities, " << k.linked << " linked to an op ("
      << pct(static_cast<double>(k.linked), static_cast<double>(k.activities)) << "), device time "
      << format_ns(static_cast<double>(k.device_ns)) << ", of which unlinked "
      << format_ns(static_cast<double>(k.unlinked_ns)) << "\n";
  {
    Table t({"op", "category", "ranges", "host", "launches", "device", "device/host", "% of device"});
    for (std::size_t i = 0; i < k.by_op.size() && i < top; ++i) {
      const auto& s = k.by_op[i];
      t.add({s.op, std::string(store::category_name(s.category)), std::to_string(s.ranges),
             format_ns(static_cast<double>(s.host_ns)), std::to_string(s.launches),
             format_ns(static_cast<double>(s.device_ns)),
             s.host_ns > 0 ? fmt("%.2f", static_cast<double>(s.device_ns) / static_cast<double>(s.host_ns)) : "-",
             pct(static_cast<double>(s.device_ns), static_cast<double>(k.device_ns))});
    }
    t.print(out);
  }
  out << "\nTop kernels by total time\n";
  {
    Table t({"kernel", "kind", "count", "total", "mean", "max", "% of device"});
    for (std::size_t i = 0; i < k.by_kernel.size() && i < top; ++i) {
      const auto& s = k.by_kernel[i];
      std::string name = s.name.size() > 70 ? s.name.substr(0, 67) + "..." : s.name;
      const char* kind = s.kind == store::KernelKind::memcpy ? "memcpy" : s.kind == store::KernelKind::memset ? "memset" : "kernel";
      t.add({name, kind, std::to_string(s.count), format_ns(static_cast<double>(s.total_ns)),
             format_ns(static_cast<double>(s.total_ns) / static_cast<double>(s.count)),
             format_ns(static_cast<double>(s.max_ns)), pct(static_cast<double>(s.total_ns), static_cast<double>(k.device_ns))});
    }
    t.print(out);
  }
}

// The TensorBoard plugin's Overview (tb_overview.hpp): per rank, the step breakdown in eight classes, the
// GPU summary and the recommendations. Only for runs with device rows or runtime calls (GPU runs).
void write_tb_overview(const RunData& run, std::ostream& out) {
  if (run.kernel_rows == 0) return;
  const Overview o = tb_overview(run);
  out << "\nStep breakdown, TensorBoard's rules (each moment of a step goes to the first class active: Kernel, "
         "Memcpy, Memset, Communication, Runtime, DataLoader, CPU Exec, Other; steps end with their last kernel)\n";
  for (const RankOverview& r : o.ranks) {
    if (r.steps.empty()) continue;
    std::vector<std::string> header = {o.ranks.size() > 1 ? "rank " + std::to_string(r.rank) + " step" : "step", "duration"};
    for (int c = 0; c < kStepClasses; ++c) header.push_back(step_class_label(static_cast<StepClass>(c)));
    Table t(header);
    for (const OverviewStep& s : r.steps) {
      const double d = static_cast<double>(s.end_ns - s.start_ns);
      std::vector<std::string> row = {r.steps_from_trace ? std::to_string(s.step) : "(no steps: all)", format_ns(d)};
      for (int c = 0; c < kStepClasses; ++c) row.push_back(pct(static_cast<double>(s.class_ns[static_cast<std::size_t>(c)]), d));
      t.add(row);
    }
    std::vector<std::string> mean = {"mean", format_ns(r.mean_step_ns)};
    for (int c = 0; c < kStepClasses; ++c)
      mean.push_back(format_ns(r.mean_ns[static_cast<std::size_t>(c)]));
    t.add(mean);
    t.print(out);
    if (r.removed_tail_steps > 0)
      out << "  (" << r.removed_tail_steps << " last step(s) left out: they launched no device work, or under 0.8x "
          << "the step before, as the trace missed their kernels)\n";
    if (r.gpu) {
      const GpuSummary& g = *r.gpu;
      auto frac = [](const std::optional<double>& v) { return v ? fmt("%.2f%%", 100.0 * *v) : std::string("-"); };
      out << "  GPU " << g.device << ": utilization " << fmt("%.2f%%", 100.0 * g.utilization) << ", est. SM efficiency "
          << frac(g.sm_efficiency) << ", est. achieved occupancy " << frac(g.achieved_occupancy)
          << ", kernel time on Tensor Cores " << frac(g.tensor_core_share) << "\n";
    }
  }
  for (const Recommendation& rec : o.recommendations) out << "  recommendation (" << rec.id << "): " << rec.text << "\n";
  if (!o.late.empty()) {
    out << "  last rank to finish each step (device-side end; the others wait for it at the next collective):";
    for (const LateRank& l : o.late) out << " step " << l.step << ": rank " << l.rank << " +" << format_ns(static_cast<double>(l.lag_ns)) << ";";
    out << "\n";
  }
}

// HTA's analyses per rank (hta.hpp): where the GPU is idle and why, communication against computation,
// launches and queues.
void write_hta_section(const RunData& run, std::ostream& out) {
  const auto ranks = hta_analyses(run);
  if (ranks.empty()) return;
  out << "\nGPU time, HTA's rules (over each rank's span from its first device row to its last; with two steps or "
         "more, the rows launched before the last step)\n";
  Table t({"rank", "span", "idle", "compute", "non-compute", "comm overlapped", "idle: host wait", "kernel wait",
           "other", "launch delay mean", "max", "queue max"});
  for (const HtaRank& h : ranks) {
    const double span = static_cast<double>(h.span_ns);
    const double idle = static_cast<double>(h.host_wait_ns + h.kernel_wait_ns + h.other_wait_ns);
    std::int64_t queue = 0;
    for (const auto& q : h.queues) queue = std::max(queue, q.max);
    t.add({std::to_string(h.rank), format_ns(span), pct(static_cast<double>(h.idle_ns), span),
           pct(static_cast<double>(h.compute_ns), span), pct(static_cast<double>(h.non_compute_ns), span),
           h.overlap_ratio ? fmt("%.1f%%", 100.0 * *h.overlap_ratio) : "-", pct(static_cast<double>(h.host_wait_ns), idle),
           pct(static_cast<double>(h.kernel_wait_ns), idle), pct(static_cast<double>(h.other_wait_ns), idle),
           h.launch_delay_mean_ns ? format_ns(*h.launch_delay_mean_ns) : "-",
           h.launch_delay_max_ns ? format_ns(static_cast<double>(*h.launch_delay_max_ns)) : "-",
           h.queues.empty() ? "-" : std::to_string(queue)});
  }
  t.print(out);
  for (const HtaRank& h : ranks)
    if (h.runtime_outliers + h.launch_delay_outliers > 0)
      out << "  rank " << h.rank << ": " << h.runtime_outliers << " runtime calls over 50 us, " << h.launch_delay_outliers
          << " launches that waited over 100 us for the GPU after the call returned\n";
}

// Host and device time per op, as TensorBoard's Operator view.
void write_op_device_section(const RunData& run, std::ostream& out, std::size_t top) {
  if (run.kernel_rows == 0) return;
  const auto ops = op_device_stats(run);
  out << "\nOperators by device self time (device self: kernels an op launched itself; total: with the ops inside it)\n";
  Table t({"op", "calls", "device self", "device total", "host self", "host total"});
  for (std::size_t i = 0; i < ops.size() && i < top; ++i) {
    const auto& s = ops[i];
    if (s.device_total_ns == 0) break;
    std::string name = s.name.size() > 70 ? s.name.substr(0, 67) + "..." : s.name;
    t.add({name, std::to_string(s.calls), format_ns(static_cast<double>(s.device_self_ns)),
           format_ns(static_cast<double>(s.device_total_ns)), format_ns(static_cast<double>(s.host_self_ns)),
           format_ns(static_cast<double>(s.host_total_ns))});
  }
  t.print(out);
}

// The run's size, completeness and what the profiler itself cost.
void write_run_header(const RunData& run, std::ostream& out) {
  auto ranks = run.rank_ids();
  out << "Run " << run.path.string() << "\n";
  out << "  ranks " << ranks.size() << ", steps " << run.steps.size() << ", complete " << (run.complete() ? "yes" : "no")
      << ", dropped events " << run.dropped_events() << ", kernels " << run.kernel_rows << "\n";
  if (const ProfilerCost pc = profiler_cost(run); pc.known) {
    out << "  profiler cost: " << fmt("%.1f", pc.ns_per_event) << " ns per host event (measured by the run) x "
        << fmt("%.0f", pc.events_per_step) << " events per step = " << format_ns(pc.ns_per_step) << " per step, "
        << fmt(pc.percent < 0.1 ? "%.2g" : "%.2f", pc.percent) << "% of the mean step time (" << format_ns(pc.mean_step_ns)
        << "); every figure here includes it\n";
  }
  out << "\n";
}

// The evaluations the run made, if any.
void write_evaluations(const RunData& run, std::ostream& out) {
  if (run.evaluations.empty()) return;
  out << "Evaluation\n";
  Table t({"after step", "top-1", "top-5", "images", "time"});
  for (const auto& e : run.evaluations)
    t.add({std::to_string(e.step), fmt("%.2f%%", e.top1), fmt("%.2f%%", e.top5), std::to_string(e.images),
           fmt("%.1f s", e.seconds)});
  t.print(out);
  out << "\n";
}

// For a triggered capture, which steps have events and what triggered each window.
void write_capture(const RunData& run, std::ostream& out) {
  auto it = run.meta.find("capture");
  if (it == run.meta.end()) return;
  // Triggered capture: events exist for the windows' steps only; the step table is whole.
  std::set<std::int32_t> kept;
  for (const auto& w : run.capture_windows)
    for (std::int32_t k = w.first_step; k <= w.last_step; ++k) kept.insert(k);
  std::set<std::int32_t> steps;
  for (const auto& s : run.steps) steps.insert(s.step);
  out << "Triggered capture (" << it->second << "): events of " << kept.size() << " of " << steps.size()
      << " steps, in " << run.capture_windows.size() << " window(s); the figures below that come from events "
      << "(ops, kernels, queues, allreduce) cover those steps only\n";
  if (!run.capture_windows.empty()) {
    Table t({"rank", "steps", "trigger", "at step", "detail"});
    for (const auto& w : run.capture_windows)
      t.add({std::to_string(w.rank), std::to_string(w.first_step) + "-" + std::to_string(w.last_step), w.trigger,
             std::to_string(w.trigger_step), w.detail});
    t.print(out);
  }
  out << "\n";
}

void write_warnings(const RunData& run, std::ostream& out) {
  auto warnings = run_warnings(run);
  out << "Warnings (" << warnings.size() << ")\n";
  if (warnings.empty()) out << "  none\n";
  for (const auto& w : warnings) out << "  [" << w.kind << "] " << w.message << "\n";
  out << "\n";
}

// Host time by category and the top ops by total time.
void write_op_sections(const RunData& run, std::ostream& out, std::size_t top) {
  OpStats ops = op_stats(run);
  out << "Time by category\n";
  {
    Table t({"category", "count", "total", "self", "mean", "p50", "p95", "max"});
    for (const auto& s : ops.by_category)
      t.add({s.name, std::to_string(s.count), format_ns(static_cast<double>(s.total_ns)), format_ns(static_cast<double>(s.self_ns)),
             format_ns(s.mean_ns), format_ns(static_cast<double>(s.p50_ns)), format_ns(static_cast<double>(s.p95_ns)),
             format_ns(static_cast<double>(s.max_ns))});
    t.print(out);
  }
  out << "\nTop ops by total time\n";
  {
    Table t({"op", "category", "count", "total", "self", "mean", "p50", "p95", "max"});
    for (std::size_t i = 0; i < ops.by_name.size() && i < top; ++i) {
      const auto& s = ops.by_name[i];
      t.add({s.name, std::string(store::category_name(s.category)), std::to_string(s.count), format_ns(static_cast<double>(s.total_ns)),
             format_ns(static_cast<double>(s.self_ns)), format_ns(s.mean_ns), format_ns(static_cast<double>(s.p50_ns)),
             format_ns(static_cast<double>(s.p95_ns)), format_ns(static_cast<double>(s.max_ns))});
    }
    t.print(out);
  }
}

// The mean step of each rank split into compute, data wait, exposed communication and the rest.
void write_step_breakdown(const RunData& run, std::ostream& out) {
  auto steps = step_breakdown(run);
  out << "\nStep breakdown (mean per rank)\n";
  Table t({"rank", "steps", "step", "compute", "data wait", "exposed comm", "other"});
  std::map<int, std::vector<const StepBreakdown*>> per_rank;
  for (const auto& b : steps) per_rank[b.rank].push_back(&b);
  for (const auto& [rank, v] : per_rank) {
    double n = static_cast<double>(v.size()), total = 0, compute = 0, data = 0, comm = 0, other = 0;
    for (const auto* b : v) {
      total += static_cast<double>(b->total_ns);
      compute += static_cast<double>(b->compute_ns);
      data += static_cast<double>(b->data_wait_ns);
      comm += static_cast<double>(b->comm_exposed_ns);
      other += static_cast<double>(b->other_ns);
    }
    t.add({std::to_string(rank), std::to_string(v.size()), format_ns(total / n), format_ns(compute / n) + " " + pct(compute, total),
           format_ns(data / n) + " " + pct(data, total), format_ns(comm / n) + " " + pct(comm, total),
           format_ns(other / n) + " " + pct(other, total)});
  }
  t.print(out);
}

// Input starvation per rank, the queues, the longest empty spells and how many workers would keep up.
void write_input_pipeline(const RunData& run, std::ostream& out) {
  Starvation st = starvation(run);
  out << "\nInput pipeline\n";
  {
    Table t({"rank", "steps", "input wait", "input-bound", "verdict"});
    for (const auto& r : st.per_rank)
      t.add({std::to_string(r.rank), std::to_string(r.steps), format_ns(static_cast<double>(r.wait_ns)), fmt("%.1f%%", r.percent),
             input_bound_name(r.level)});
    t.add({"all", std::to_string(st.overall.steps), format_ns(static_cast<double>(st.overall.wait_ns)), fmt("%.1f%%", st.overall.percent),
           input_bound_name(st.overall.level)});
    t.print(out);
  }
  if (!st.queues.empty()) {
    Table t({"queue", "rank", "samples", "empty", "empty ratio", "push/s", "pop/s"});
    for (const auto& q : st.queues)
      t.add({q.name, std::to_string(q.rank), std::to_string(q.samples), std::to_string(q.empty_samples),
             fmt("%.1f%%", 100.0 * q.empty_ratio) + (q.flagged ? " (!)" : ""), fmt("%.1f", q.producer_per_s), fmt("%.1f", q.consumer_per_s)});
    t.print(out);
  }
  if (!st.longest_spells.empty()) {
    out << "  longest empty-queue spells:";
    for (const auto& s : st.longest_spells)
      out << " " << format_ns(static_cast<double>(s.duration_ns())) << " (rank " << s.rank << ", step " << s.step << ")";
    out << "\n";
  }
  if (st.demand_per_s > 0) {
    out << "  consumer demand " << fmt("%.1f", st.demand_per_s) << " batches/s";
    if (st.per_worker_per_s > 0) out << ", one worker makes " << fmt("%.1f", st.per_worker_per_s) << " batches/s";
    if (st.workers > 0) out << ", workers " << st.workers;
    if (st.workers_needed > 0) out << "; workers to keep the queue non-empty: " << st.workers_needed;
    out << "\n";
  }
  if (st.per_image_ns > 0) {
    out << "  per image (one worker):";
    for (const auto& [name, ns] : st.per_image_stages)
      out << " " << name << " " << format_ns(ns) << " (" << pct(ns, st.per_image_ns) << ")";
    out << "; " << format_ns(st.per_image_ns) << " in all, " << fmt("%.1f", 1e9 / st.per_image_ns)
        << " images/s per worker\n";
  }
}

// The allreduce buckets, their overlap with backward, the alpha-beta fit and (when asked for) the
// split suggestions; nothing for a run without allreduces.
void write_allreduce_sections(const RunData& run, std::ostream& out, const ReportOptions& options) {
  if (run.allreduces.empty()) return;
  out << "\nAllreduce buckets\n";
  {
    Table t({"bucket", "params", "bytes", "ready->start", "max", "duration", "max"});
    for (const auto& b : bucket_stats(run.allreduces))
      t.add({std::to_string(b.bucket), concat("[", std::to_string(b.first_param), ",", std::to_string(b.last_param), "]"),
             std::to_string(b.bytes), format_ns(b.mean_latency_ns), format_ns(static_cast<double>(b.max_latency_ns)),
             format_ns(b.mean_duration_ns), format_ns(static_cast<double>(b.max_duration_ns))});
    t.print(out);
  }
  auto comms = step_comms(run);
  double comm = 0, overlap = 0, exposed = 0;
  for (const auto& c : comms) {
    comm += static_cast<double>(c.comm_ns);
    overlap += static_cast<double>(c.overlap_ns);
    exposed += static_cast<double>(c.exposed_ns);
  }
  double n = static_cast<double>(std::max<std::size_t>(1, comms.size()));
  out << "  per step (DDP logger): communication " << format_ns(comm / n) << ", overlapped with backward "
      << format_ns(overlap / n) << ", exposed " << format_ns(exposed / n) << "\n";
  AlphaBeta ab = fit_alpha_beta(run.allreduces);
  if (ab.valid) {
    out << "  alpha-beta fit over " << ab.samples << " spans: t = " << format_ns(ab.alpha_ns) << " + "
        << fmt("%.4g", ab.beta_ns_per_byte) << " ns/B * bytes (" << fmt("%.2f", 1.0 / std::max(ab.beta_ns_per_byte, 1e-12))
        << " GB/s), r^2 " << fmt("%.3f", ab.r2) << "\n";
  } else {
    out << "  alpha-beta fit: needs spans of at least two sizes\n";
  }
  if (options.split_table && !run.params.empty()) {
    out << "\n";
    try {
      write_split_suggestions(run, out);
    } catch (const AnalysisError& e) {
      out << "  split suggestions unavailable: " << e.what() << "\n";
    }
  }
}

}  // namespace

namespace {

// The critical path across ranks (critical_path.hpp): its time by kind and the ops most on it.
void write_critical_path(const RunData& run, std::ostream& out) {
  const CriticalPath cp = critical_path(run);
  if (cp.steps.empty() || cp.path_ns <= 0) return;
  const double steps = static_cast<double>(cp.steps.size());
  const double total = static_cast<double>(cp.path_ns);
  out << "\nCritical path across ranks (" << cp.steps.size() << " steps, " << format_ns(total / steps)
      << " per step: the chain of work that set each step's end, "
      << (!run.pipeline_spans.empty() ? "through each message a stage waited for"
          : run.allreduces.empty()      ? "through launches, stream order, synchronisation and the last rank to join each NCCL collective"
                                        : "through the last rank to join each collective")
      << ")\n";
  std::map<std::string, std::int64_t> by_kind;
  for (const PathOp& op : cp.ops) by_kind[op.kind] += op.total_ns;
  std::vector<std::pair<std::string, std::int64_t>> kinds(by_kind.begin(), by_kind.end());
  std::sort(kinds.begin(), kinds.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  out << "  by kind:";
  for (const auto& [kind, ns] : kinds) out << " " << kind << " " << pct(static_cast<double>(ns), total) << ";";
  out << "\n";
  Table t({"on the path", "kind", "per step", "% of path", "steps on it"});
  for (std::size_t i = 0; i < cp.ops.size() && i < 12; ++i) {
    const PathOp& op = cp.ops[i];
    t.add({op.name, op.kind, format_ns(static_cast<double>(op.total_ns) / steps), pct(static_cast<double>(op.total_ns), total),
           concat(std::to_string(op.steps), "/", std::to_string(cp.steps.size()))});
  }
  t.print(out);
  std::map<int, std::int64_t> by_rank;
  for (const StepPath& p : cp.steps)
    for (const PathSegment& seg : p.segments) by_rank[seg.rank] += seg.end_ns - seg.start_ns;
  out << "  by rank:";
  for (const auto& [rank, ns] : by_rank) out << " rank " << rank << " " << pct(static_cast<double>(ns), total) << ";";
  out << "\n";
}

}  // namespace

void write_report(const RunData& run, std::ostream& out, const ReportOptions& options) {
  write_run_header(run, out);
  write_evaluations(run, out);
  write_capture(run, out);
  write_warnings(run, out);
  write_op_sections(run, out, options.top_ops);
  if (run.kernel_rows > 0) write_kernel_sections(kernel_stats(run), out, options.top_ops);
  write_op_device_section(run, out, options.top_ops);
  write_tb_overview(run, out);
  write_hta_section(run, out);
  write_step_breakdown(run, out);
  write_sync_bn_section(run, out);
  write_fc_shard_section(run, out);
  write_input_pipeline(run, out);
  write_memory_section(run, out);
  write_stragglers(run, out);
  write_allreduce_sections(run, out, options);
  write_critical_path(run, out);
  write_pipeline_section(run, out);
}

void write_pipeline_section(const RunData& run, std::ostream& out) {
  std::optional<PipelineAnalysis> p;
  try {
    p = analyze_pipeline(run);
  } catch (const AnalysisError& e) {
    out << "\nPipeline\n  unavailable: " << e.what() << "\n";
    return;
  }
  if (!p) return;
  const PipelinePlanInfo& plan = p->plan;
  out << "\nPipeline: " << plan.stages << " stages x " << plan.replicas << " replica(s), " << plan.micro_batches
      << " micro-batches of " << plan.micro_batch_size << ", " << plan.schedule << ", loss " << plan.loss << "\n";
  {
    Table t({"stage", "units", "compute/step", "wait act", "wait grad", "wait allreduce", "bubble", "ideal"});
    for (const auto& st : p->stages) {
      t.add({std::to_string(st.stage),
             st.stage < static_cast<int>(plan.stage_names.size()) ? plan.stage_names[static_cast<std::size_t>(st.stage)] : "",
             format_ns(st.busy_ns), format_ns(st.wait_act_ns), format_ns(st.wait_grad_ns), format_ns(st.wait_allreduce_ns),
             fmt("%.1f%%", 100.0 * st.bubble), fmt("%.1f%%", 100.0 * p->ideal)});
    }
    t.print(out);
  }
  out << "  steady steps from step " << p->steady_from_step << "; bubble = waiting for activations or gradients over "
      << "the forward-backward phase; ideal (S-1)/(M+S-1) = " << fmt("%.1f%%", 100.0 * p->ideal) << " for "
      << plan.stages << " equal stages\n";
  out << "  mean bubble " << fmt("%.1f%%", 100.0 * p->mean_bubble) << "; stage imbalance (slowest stage's compute / mean) "
      << fmt("%.2f", p->imbalance) << "\n";
  out << "\nPipeline bubble per step\n";
  {
    Table t({"step", "rank", "stage", "phase", "compute", "wait act", "wait grad", "bubble"});
    for (const auto& b : p->steps)
      t.add({std::to_string(b.step), std::to_string(b.rank), std::to_string(b.stage), format_ns(static_cast<double>(b.phase_ns)),
             format_ns(static_cast<double>(b.busy_ns)), format_ns(static_cast<double>(b.wait_act_ns)),
             format_ns(static_cast<double>(b.wait_grad_ns)), fmt("%.1f%%", 100.0 * b.bubble)});
    t.print(out);
  }
  if (!p->balanced_first_unit.empty()) {
    out << "\nPipeline split suggestion (measured compute per unit and step, forward + backward)\n  ";
    for (int u = 0; u < kPipelineUnits; ++u) {
      out << pipeline_unit_name(u) << " " << format_ns(p->unit_ns[static_cast<std::size_t>(u)])
          << (u + 1 < kPipelineUnits ? ", " : "\n");
    }
    out << "  balanced split: " << p->balanced_flag << " (predicted imbalance " << fmt("%.2f", p->balanced_imbalance)
        << ", now " << fmt("%.2f", p->imbalance) << ")\n";
  }
  auto micro = [](const std::optional<int>& m) {
    return m ? "--micro-batches " + std::to_string(*m) : std::string("none (imbalance alone leaves over 10%)");
  };
  out << "  bubble under 10%: " << micro(p->micro_for_10pct) << " with this split";
  if (!p->balanced_first_unit.empty()) out << ", " << micro(p->micro_for_10pct_balanced) << " with the balanced split";
  out << "; ideal equal stages need --micro-batches " << 9 * (plan.stages - 1) + 1 << "\n";
}

}  // namespace wb::analysis
