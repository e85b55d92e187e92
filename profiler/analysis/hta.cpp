// hta_analyses: a rank's device rows by stream and type -> unions per type -> HTA's breakdowns; the
// runtime calls that launched them (kernel.launch_ns, launch_end_ns) -> idle causes, launch statistics,
// queue lengths.
#include "profiler/analysis/hta.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <unordered_map>

#include "profiler/analysis/intervals.hpp"

namespace wb::analysis {

namespace {

struct Row {
  const store::KernelRow* k;
  HtaKernelType type;
};

struct RankRows {
  std::map<std::uint32_t, std::vector<Row>> by_stream;  // stream track -> its rows, by start
  std::vector<Row> all;
};

// When a row was launched: its runtime call's start; for a run without them (wb-train's CUDA runs), the
// start of the host range that launched it; -1 when neither is known.
std::int64_t launched_at(const store::KernelRow& k, const std::unordered_map<std::uint64_t, std::int64_t>& range_start) {
  if (k.launch_ns >= 0) return k.launch_ns;
  auto it = k.corr_id != 0 ? range_start.find(k.corr_id) : range_start.end();
  return it != range_start.end() ? it->second : -1;
}

RankRows rows_of(const RunData& run, int rank, HtaRank& h) {
  // Trace._filter_irrelevant_gpu_kernels: with two steps or more, the rows launched before the last
  // step started.
  std::vector<std::int64_t> step_starts;
  std::set<std::int32_t> step_ids;
  for (const store::StepRow& s : run.steps)
    if (s.rank == rank) {
      step_starts.push_back(s.start_ns);
      step_ids.insert(s.step);
    }
  if (step_ids.size() >= 2) h.trim_ns = *std::max_element(step_starts.begin(), step_starts.end());
  std::unordered_map<std::uint64_t, std::int64_t> range_start;
  if (h.trim_ns >= 0)
    for (const auto& [track_id, rows] : run.ranges)
      if (const store::TrackRow* t = run.track(track_id); t && t->rank == rank)
        for (const store::RangeRow& r : rows)
          if (r.corr_id != 0) range_start.emplace(r.corr_id, r.start_ns);
  RankRows out;
  for (const auto& [track_id, rows] : run.kernels) {
    const store::TrackRow* t = run.track(track_id);
    if (!t || t->rank != rank) continue;
    auto& stream = out.by_stream[track_id];
    for (const store::KernelRow& k : rows) {
      ++h.device_rows_before_trim;
      if (h.trim_ns >= 0) {
        const std::int64_t at = launched_at(k, range_start);
        if (at < 0 || at >= h.trim_ns) continue;
      }
      const Row r{&k, hta_kernel_type(run.name(k.name), static_cast<store::KernelKind>(k.kind))};
      stream.push_back(r);
      out.all.push_back(r);
    }
    std::stable_sort(stream.begin(), stream.end(), [](const Row& a, const Row& b) { return a.k->start_ns < b.k->start_ns; });
    if (stream.empty()) out.by_stream.erase(track_id);
  }
  h.device_rows = static_cast<std::int64_t>(out.all.size());
  return out;
}

Intervals union_of(const std::vector<Row>& rows, int type_mask) {
  Intervals v;
  for (const Row& r : rows)
    if (type_mask & (1 << static_cast<int>(r.type))) v.emplace_back(r.k->start_ns, r.k->end_ns);
  return merged(std::move(v));
}

constexpr int kAll = 0xF;
int bit(HtaKernelType t) { return 1 << static_cast<int>(t); }

// breakdown_analysis._get_gpu_kernel_type_time (include_memory_kernels): the union of each type, then the
// time each combination of running types holds.
std::map<std::string, std::int64_t> kernel_breakdown(const std::vector<Row>& rows) {
  static const char* const names[] = {"computation", "communication", "memory"};
  std::vector<std::pair<std::int64_t, int>> edges;  // (time, +bit at start / -bit at end)
  for (int t = 0; t < 3; ++t)
    for (const Interval& i : union_of(rows, 1 << t)) {
      edges.emplace_back(i.first, 1 << t);
      edges.emplace_back(i.second, -(1 << t));
    }
  std::sort(edges.begin(), edges.end());
  std::map<std::string, std::int64_t> out;
  int running = 0;
  for (std::size_t i = 0; i < edges.size(); ++i) {
    running += edges[i].second;
    if (i + 1 < edges.size() && running > 0 && edges[i + 1].first > edges[i].first) {
      std::string key;
      for (int t = 0; t < 3; ++t)
        if (running & (1 << t)) {
          if (!key.empty()) key += '+';
          key += names[t];
        }
      out[key] += edges[i + 1].first - edges[i].first;
    }
  }
  return out;
}

// breakdown_analysis._analyze_idle_time_for_stream: each gap before a row on its stream is host wait when
// the row's runtime call started after the stream went idle (the host was late), kernel wait when the
// gap is under consecutive_kernel_delay, else other. The stream goes idle at the latest end so far (HTA
// takes the previous row's end, so rows overlapping on one stream would count negative idle time).
void idle_breakdown(HtaRank& h, const RankRows& rows, const HtaOptions& o) {
  for (const auto& [track, stream] : rows.by_stream) {
    std::int64_t idle_from = stream.front().k->end_ns;
    for (std::size_t i = 1; i < stream.size(); ++i) {
      const store::KernelRow& k = *stream[i].k;
      if (k.start_ns > idle_from) {
        const std::int64_t gap = k.start_ns - idle_from;
        if (k.launch_ns >= 0 && k.launch_ns > idle_from) h.host_wait_ns += gap;
        else if (gap < o.consecutive_kernel_delay_ns) h.kernel_wait_ns += gap;
        else h.other_wait_ns += gap;
      }
      idle_from = std::max(idle_from, k.end_ns);
    }
  }
}

// cuda_kernel_analysis.cuda_kernel_launch_stats (include_memory_events): per device row with its runtime
// call on record, the delay from the call's end to the row's start, clipped at 0; outliers over the
// cutoffs, for the call's duration and for the delay.
void launch_stats(HtaRank& h, const RankRows& rows, const HtaOptions& o) {
  double sum = 0.0;
  std::int64_t max = 0;
  for (const Row& r : rows.all) {
    const store::KernelRow& k = *r.k;
    if (k.launch_ns < 0) continue;
    const std::int64_t delay = std::max<std::int64_t>(0, k.start_ns - k.launch_end_ns);
    ++h.launched;
    sum += static_cast<double>(delay);
    max = std::max(max, delay);
    h.runtime_outliers += k.launch_end_ns - k.launch_ns > o.runtime_cutoff_ns;
    h.launch_delay_outliers += delay > o.launch_delay_cutoff_ns;
  }
  if (h.launched > 0) {
    h.launch_delay_mean_ns = sum / static_cast<double>(h.launched);
    h.launch_delay_max_ns = max;
  }
}

// pandas' describe() of the queue values: mean, sample standard deviation, linear percentiles.
void describe(HtaQueue& q, std::vector<std::int64_t> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  q.count = static_cast<std::int64_t>(n);
  q.min = v.front();
  q.max = v.back();
  double sum = 0.0;
  for (std::int64_t x : v) sum += static_cast<double>(x);
  q.mean = sum / static_cast<double>(n);
  if (n > 1) {
    double ss = 0.0;
    for (std::int64_t x : v) ss += (static_cast<double>(x) - q.mean) * (static_cast<double>(x) - q.mean);
    q.std = std::sqrt(ss / static_cast<double>(n - 1));
  }
  auto quantile = [&](double p) {
    const double pos = p * static_cast<double>(n - 1);
    const std::size_t lo = static_cast<std::size_t>(pos), hi = std::min(lo + 1, n - 1);
    return static_cast<double>(v[lo]) + static_cast<double>(v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  q.p25 = quantile(0.25);
  q.p50 = quantile(0.5);
  q.p75 = quantile(0.75);
}

// trace_counters' queue length (store::launch_queue), summarised over its changes.
void queue_lengths(HtaRank& h, const RunData& run, const RankRows& rows) {
  for (const auto& [track, stream] : rows.by_stream) {
    std::vector<std::pair<std::int64_t, std::int64_t>> launches;
    for (const Row& r : stream)
      if (r.k->launch_ns >= 0) launches.emplace_back(r.k->launch_ns, r.k->start_ns);
    if (launches.empty()) continue;
    HtaQueue q;
    q.track = run.name(run.track(track)->name);
    if (std::sscanf(q.track.c_str(), "cuda:%*d stream %d", &q.stream) != 1) q.stream = static_cast<int>(track);
    std::vector<std::int64_t> values;
    for (const store::CounterRow& c : store::launch_queue(track, std::move(launches)))
      values.push_back(static_cast<std::int64_t>(c.value));
    describe(q, std::move(values));
    h.queues.push_back(q);
  }
  std::sort(h.queues.begin(), h.queues.end(), [](const HtaQueue& a, const HtaQueue& b) { return a.stream < b.stream; });
}

}  // namespace

HtaKernelType hta_kernel_type(std::string_view name, store::KernelKind kind) {
  if (kind != store::KernelKind::kernel) return HtaKernelType::memory;
  // hta/common/types.py: CommunicateKernelGroupingPattern, MemoryKernelGroupingPattern and
  // ComputeKernelGroupingPattern (inverse), each a regex matched at the name's start (re.match), written
  // out as prefix and substring tests (kernel names run to tens of kilobytes).
  auto starts = [&](std::string_view p) { return name.substr(0, p.size()) == p; };
  auto has = [&](std::string_view p) { return name.find(p) != std::string_view::npos; };
  if (starts("nccl") || starts("hip") || starts("hccl") || has("ncclKernel")) return HtaKernelType::communication;
  if (starts("Memcpy") || starts("hipMemcpy") || starts("Memset") || starts("hipMemset") || starts("dma"))
    return HtaKernelType::memory;
  const bool launch = starts("cuda") && name.find("LaunchKernel", 4) != std::string_view::npos;
  const bool not_compute = starts("nccl") || has("Memcpy") || has("Memset") || has("dma") || has("Sync") ||
                           starts("Stream Wait Event") || launch || starts("runFunction") || starts("hip") ||
                           starts("job_exe") || starts("packet") || starts("pe_exe") || starts("cpum_exe_subgraph") ||
                           starts("hccl") || starts("collective_subgraph_execution");
  if (!not_compute) return HtaKernelType::computation;
  return HtaKernelType::other;
}

std::vector<HtaRank> hta_analyses(const RunData& run, const HtaOptions& options) {
  std::vector<HtaRank> out;
  for (int rank : run.rank_ids()) {
    HtaRank h;
    h.rank = rank;
    const RankRows rows = rows_of(run, rank, h);
    if (rows.all.empty()) continue;
    // breakdown_analysis.get_temporal_breakdown
    const Intervals busy = union_of(rows.all, kAll);
    const std::int64_t lo = busy.front().first, hi = busy.back().second;
    h.span_ns = hi - lo;
    h.idle_ns = h.span_ns - length_of(busy);
    const Intervals compute = union_of(rows.all, bit(HtaKernelType::computation));
    h.compute_ns = length_of(compute);
    h.non_compute_ns = h.span_ns - h.compute_ns - h.idle_ns;
    h.kernel_breakdown_ns = kernel_breakdown(rows.all);
    // communication_analysis.get_comm_comp_overlap
    const Intervals comm = union_of(rows.all, bit(HtaKernelType::communication));
    h.comm_ns = length_of(comm);
    h.overlapped_ns = length_of(intersect(comm, compute));
    if (h.comm_ns > 0) h.overlap_ratio = static_cast<double>(h.overlapped_ns) / static_cast<double>(h.comm_ns);
    idle_breakdown(h, rows, options);
    launch_stats(h, rows, options);
    queue_lengths(h, run, rows);
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace wb::analysis
