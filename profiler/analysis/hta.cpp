// hta_analyses: a rank's device rows by stream and type -> unions per type -> HTA's breakdowns; the
// runtime calls that launched them (kernel.launch_ns, launch_end_ns) -> idle causes, launch statistics,
// queue lengths.
#include "profiler/analysis/hta.hpp"

#include <algorithm>

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

RankRows rows_of(const RunData& run, int rank) {
  RankRows out;
  for (const auto& [track_id, rows] : run.kernels) {
    const store::TrackRow* t = run.track(track_id);
    if (!t || t->rank != rank) continue;
    auto& stream = out.by_stream[track_id];
    for (const store::KernelRow& k : rows) {
      const Row r{&k, hta_kernel_type(run.name(k.name), static_cast<store::KernelKind>(k.kind))};
      stream.push_back(r);
      out.all.push_back(r);
    }
    std::stable_sort(stream.begin(), stream.end(), [](const Row& a, const Row& b) { return a.k->start_ns < b.k->start_ns; });
  }
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
// the row's runtime call started after the previous row ended (the host was late), kernel wait when the
// gap is under consecutive_kernel_delay, else other.
void idle_breakdown(HtaRank& h, const RankRows& rows, const HtaOptions& o) {
  for (const auto& [track, stream] : rows.by_stream)
    for (std::size_t i = 1; i < stream.size(); ++i) {
      const std::int64_t prev_end = stream[i - 1].k->end_ns;
      const std::int64_t gap = stream[i].k->start_ns - prev_end;
      if (stream[i].k->launch_ns >= 0 && stream[i].k->launch_ns > prev_end) h.host_wait_ns += gap;
      else if (gap < o.consecutive_kernel_delay_ns) h.kernel_wait_ns += gap;
      else h.other_wait_ns += gap;
    }
}

// cuda_kernel_analysis: launch delay = kernel start - its runtime call's start; outliers over the cutoffs.
void launch_stats(HtaRank& h, const RankRows& rows, const HtaOptions& o) {
  double sum = 0.0;
  for (const Row& r : rows.all) {
    const store::KernelRow& k = *r.k;
    if (k.kind != static_cast<std::uint8_t>(store::KernelKind::kernel) || k.launch_ns < 0) continue;
    const std::int64_t delay = k.start_ns - k.launch_ns;
    ++h.launched;
    sum += static_cast<double>(delay);
    h.launch_delay_max_ns = std::max(h.launch_delay_max_ns, delay);
    h.runtime_outliers += k.launch_end_ns - k.launch_ns > o.runtime_cutoff_ns;
    h.launch_delay_outliers += delay > o.launch_delay_cutoff_ns;
  }
  if (h.launched > 0) h.launch_delay_mean_ns = sum / static_cast<double>(h.launched);
}

// trace_counters.get_queue_length_time_series: a stream's queue grows when a runtime call launches work on
// it and shrinks when that work ends.
void queue_lengths(HtaRank& h, const RunData& run, const RankRows& rows, std::int64_t lo, std::int64_t hi) {
  for (const auto& [track, stream] : rows.by_stream) {
    std::vector<std::pair<std::int64_t, int>> edges;
    for (const Row& r : stream)
      if (r.k->launch_ns >= 0) {
        edges.emplace_back(r.k->launch_ns, +1);
        edges.emplace_back(r.k->end_ns, -1);
      }
    if (edges.empty()) continue;
    std::sort(edges.begin(), edges.end());
    HtaQueue q;
    q.stream = run.name(run.track(track)->name);
    std::int64_t depth = 0;
    double weighted = 0.0;
    for (std::size_t i = 0; i < edges.size(); ++i) {
      depth += edges[i].second;
      q.max = std::max(q.max, depth);
      if (i + 1 < edges.size()) {
        const std::int64_t a = std::max(edges[i].first, lo), b = std::min(edges[i + 1].first, hi);
        if (a < b) weighted += static_cast<double>(depth) * static_cast<double>(b - a);
      }
    }
    if (hi > lo) q.mean = weighted / static_cast<double>(hi - lo);
    h.queues.push_back(q);
  }
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
    const RankRows rows = rows_of(run, rank);
    if (rows.all.empty()) continue;
    HtaRank h;
    h.rank = rank;
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
    queue_lengths(h, run, rows, lo, hi);
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace wb::analysis
