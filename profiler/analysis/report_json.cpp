// wb report RUN --json: the report's tables with stable keys (docs/guide/report-json.md). Times are
// integer nanoseconds on the run's clock, fractions are 0..1, a value the run has no data for is null.
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "profiler/analysis/critical_path.hpp"
#include "profiler/analysis/hta.hpp"
#include "profiler/analysis/kernel_stats.hpp"
#include "profiler/analysis/op_stats.hpp"
#include "profiler/analysis/report.hpp"
#include "profiler/analysis/tb_overview.hpp"

namespace wb::analysis {

namespace {

using nlohmann::json;

json optional_number(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json class_object(const ClassTimes& t) {
  json o = json::object();
  for (int c = 0; c < kStepClasses; ++c) o[step_class_key(static_cast<StepClass>(c))] = t[static_cast<std::size_t>(c)];
  return o;
}

json rank_json(const RankOverview& r) {
  json steps = json::array();
  for (const OverviewStep& s : r.steps)
    steps.push_back({{"step", s.step},
                     {"start_ns", s.start_ns},
                     {"end_ns", s.end_ns},
                     {"host_start_ns", s.host_start_ns},
                     {"host_end_ns", s.host_end_ns},
                     {"breakdown_ns", class_object(s.class_ns)}});
  json mean = json::object();
  for (int c = 0; c < kStepClasses; ++c) mean[step_class_key(static_cast<StepClass>(c))] = r.mean_ns[static_cast<std::size_t>(c)];
  json gpu = nullptr;
  if (r.gpu)
    gpu = {{"device", r.gpu->device},
           {"utilization", r.gpu->utilization},
           {"sm_efficiency", optional_number(r.gpu->sm_efficiency)},
           {"achieved_occupancy", optional_number(r.gpu->achieved_occupancy)},
           {"tensor_core_share", optional_number(r.gpu->tensor_core_share)}};
  return {{"rank", r.rank},
          {"steps_from_trace", r.steps_from_trace},
          {"removed_tail_steps", r.removed_tail_steps},
          {"steps", steps},
          {"step_mean_ns", r.mean_step_ns},
          {"breakdown_mean_ns", mean},
          {"gpu", gpu}};
}

// HTA's analyses of one rank, added to its entry.
void add_hta(json& rank, const HtaRank& h) {
  rank["temporal_breakdown_ns"] = {{"idle", h.idle_ns}, {"compute", h.compute_ns}, {"non_compute", h.non_compute_ns}, {"span", h.span_ns}};
  rank["kernel_breakdown_ns"] = h.kernel_breakdown_ns;
  rank["overlap"] = {{"comm_ns", h.comm_ns}, {"overlapped_ns", h.overlapped_ns}, {"ratio", optional_number(h.overlap_ratio)}};
  rank["idle_breakdown_ns"] = {{"host_wait", h.host_wait_ns}, {"kernel_wait", h.kernel_wait_ns}, {"other", h.other_wait_ns}};
  rank["launch"] = {{"kernels", h.launched},
                    {"launch_delay_mean_ns", optional_number(h.launch_delay_mean_ns)},
                    {"launch_delay_max_ns", h.launch_delay_max_ns ? json(*h.launch_delay_max_ns) : json(nullptr)},
                    {"runtime_outliers", h.runtime_outliers},
                    {"launch_delay_outliers", h.launch_delay_outliers}};
  json queues = json::array();
  for (const HtaQueue& q : h.queues)
    queues.push_back({{"stream", q.stream}, {"track", q.track}, {"count", q.count}, {"mean", q.mean}, {"std", optional_number(q.std)},
                      {"min", q.min}, {"p25", q.p25}, {"p50", q.p50}, {"p75", q.p75}, {"max", q.max}});
  rank["queue_length"] = queues;
  rank["hta_trim_ns"] = h.trim_ns >= 0 ? json(h.trim_ns) : json(nullptr);
  rank["hta_device_rows"] = {{"kept", h.device_rows}, {"before_trim", h.device_rows_before_trim}};
}

}  // namespace

void write_report_json(const RunData& run, std::ostream& out, const ReportOptions& options) {
  json doc;
  doc["run"] = {{"path", run.path.string()},
                {"ranks", run.rank_ids().size()},
                {"steps", run.steps.size()},
                {"kernels", run.kernel_rows},
                {"complete", run.complete()},
                {"dropped_events", run.dropped_events()}};
  json warnings = json::array();
  for (const Warning& w : run_warnings(run)) warnings.push_back({{"kind", w.kind}, {"message", w.message}});
  doc["warnings"] = warnings;

  const Overview o = tb_overview(run);
  json ranks = json::array();
  const std::vector<HtaRank> hta = hta_analyses(run);
  for (const RankOverview& r : o.ranks) {
    json entry = rank_json(r);
    for (const HtaRank& h : hta)
      if (h.rank == r.rank) add_hta(entry, h);
    ranks.push_back(entry);
  }
  doc["ranks"] = ranks;
  json recs = json::array();
  for (const Recommendation& r : o.recommendations) recs.push_back({{"id", r.id}, {"text", r.text}});
  doc["recommendations"] = recs;
  json late = json::array();
  for (const LateRank& l : o.late) late.push_back({{"step", l.step}, {"rank", l.rank}, {"lag_ns", l.lag_ns}});
  doc["late_ranks"] = late;

  json ops = json::array();
  for (const OpDeviceStat& s : op_device_stats(run))
    ops.push_back({{"name", s.name},
                   {"calls", s.calls},
                   {"device_self_ns", s.device_self_ns},
                   {"device_total_ns", s.device_total_ns},
                   {"host_self_ns", s.host_self_ns},
                   {"host_total_ns", s.host_total_ns}});
  doc["ops"] = ops;

  const KernelStats ks = kernel_stats(run);
  json kernels = json::array();
  for (const KernelNameStat& k : ks.by_kernel)
    kernels.push_back({{"name", k.name},
                       {"kind", k.kind == store::KernelKind::memcpy ? "memcpy" : k.kind == store::KernelKind::memset ? "memset" : "kernel"},
                       {"count", k.count},
                       {"total_ns", k.total_ns},
                       {"mean_ns", k.count > 0 ? static_cast<double>(k.total_ns) / static_cast<double>(k.count) : 0.0},
                       {"max_ns", k.max_ns},
                       {"bytes", k.bytes}});
  doc["kernels"] = kernels;
  doc["device_rows"] = {{"total", ks.activities}, {"linked", ks.linked}, {"device_ns", ks.device_ns}, {"unlinked_ns", ks.unlinked_ns}};

  json op_stats_json = json::array();
  const OpStats host = op_stats(run);
  for (std::size_t i = 0; i < host.by_name.size() && i < options.top_ops; ++i) {
    const OpStat& s = host.by_name[i];
    op_stats_json.push_back({{"name", s.name},
                             {"category", std::string(store::category_name(s.category))},
                             {"count", s.count},
                             {"total_ns", s.total_ns},
                             {"self_ns", s.self_ns},
                             {"mean_ns", s.mean_ns},
                             {"p50_ns", s.p50_ns},
                             {"p95_ns", s.p95_ns},
                             {"max_ns", s.max_ns}});
  }
  doc["op_stats"] = op_stats_json;

  const CriticalPath cp = critical_path(run);
  json path_steps = json::array();
  for (const StepPath& p : cp.steps) {
    json segs = json::array();
    for (const PathSegment& seg : p.segments)
      segs.push_back({{"rank", seg.rank}, {"name", seg.name}, {"kind", seg.kind}, {"start_ns", seg.start_ns}, {"end_ns", seg.end_ns},
                      {"track", seg.track}});
    path_steps.push_back({{"step", p.step}, {"start_ns", p.start_ns}, {"end_ns", p.end_ns}, {"segments", segs}});
  }
  json path_ops = json::array();
  for (const PathOp& op : cp.ops)
    path_ops.push_back({{"name", op.name}, {"kind", op.kind}, {"steps", op.steps}, {"total_ns", op.total_ns}});
  doc["critical_path"] = {{"path_ns", cp.path_ns}, {"ops", path_ops}, {"steps", path_steps}};
  out << doc.dump(1) << "\n";
}

}  // namespace wb::analysis
