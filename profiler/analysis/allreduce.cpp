#include "profiler/analysis/allreduce.hpp"

#include <algorithm>
#include <map>

namespace wb::analysis {

std::vector<BucketStats> bucket_stats(std::span<const store::AllreduceRow> rows) {
  std::map<int, BucketStats> acc;
  for (const auto& r : rows) {
    BucketStats& b = acc[r.bucket];
    b.bucket = r.bucket;
    b.first_param = r.first_param;
    b.last_param = r.last_param;
    b.bytes = r.bytes;
    std::int64_t latency = r.start_ns - r.ready_ns;
    std::int64_t duration = r.end_ns - r.start_ns;
    b.mean_latency_ns += static_cast<double>(latency);
    b.mean_duration_ns += static_cast<double>(duration);
    b.max_latency_ns = b.samples == 0 ? latency : std::max(b.max_latency_ns, latency);
    b.max_duration_ns = b.samples == 0 ? duration : std::max(b.max_duration_ns, duration);
    ++b.samples;
  }
  std::vector<BucketStats> out;
  for (auto& [id, b] : acc) {
    b.mean_latency_ns /= b.samples;
    b.mean_duration_ns /= b.samples;
    out.push_back(b);
  }
  return out;
}

StepComm step_comm(std::span<const store::AllreduceRow> rows, std::int64_t compute_end_ns) {
  if (rows.empty()) throw AnalysisError("step_comm: a step without allreduce rows");
  StepComm s;
  s.rank = rows[0].rank;
  s.step = rows[0].step;
  s.buckets = static_cast<int>(rows.size());
  s.comm_start_ns = rows[0].start_ns;
  s.comm_end_ns = rows[0].end_ns;
  for (const auto& r : rows) {
    s.comm_start_ns = std::min(s.comm_start_ns, r.start_ns);
    s.comm_end_ns = std::max(s.comm_end_ns, r.end_ns);
    s.bytes += r.bytes;
  }
  s.compute_end_ns = compute_end_ns;
  s.comm_ns = s.comm_end_ns - s.comm_start_ns;
  s.overlap_ns = std::clamp<std::int64_t>(compute_end_ns - s.comm_start_ns, 0, s.comm_ns);
  s.exposed_ns = s.comm_ns - s.overlap_ns;
  return s;
}

std::vector<StepComm> step_comms(const RunData& run) {
  std::map<std::pair<int, int>, std::vector<store::AllreduceRow>> groups;
  for (const auto& r : run.allreduces) groups[{r.rank, r.step}].push_back(r);
  // A step's backward end: its last backward range on the rank's main track, among those inside its step
  // row, or recorded with its number when the rank has no step row. Each step reads its own rows only.
  StepIndex index(run);
  const auto backward = static_cast<std::uint8_t>(store::Category::backward);
  std::map<int, std::map<int, std::int64_t>> by_number;  // rank -> step -> backward end
  std::vector<StepComm> out;
  for (const auto& [key, rows] : groups) {
    const auto [rank, step] = key;
    std::int64_t end = -1;
    if (const store::StepRow* sr = index.step_row(rank, step)) {
      const store::StepRow& s = *sr;
      index.each(rank, s.start_ns - 1, s.end_ns + 1, [&](const store::RangeRow& r) {
        if (r.category == backward && r.start_ns >= s.start_ns && r.end_ns <= s.end_ns) end = std::max(end, r.end_ns);
      });
    } else {
      auto [ends, fresh] = by_number.try_emplace(rank);
      if (fresh)
        for (const auto& r : index.main_rows(rank))
          if (r.category == backward) {
            auto [e, added] = ends->second.try_emplace(r.step, r.end_ns);
            if (!added) e->second = std::max(e->second, r.end_ns);
          }
      if (auto e = ends->second.find(step); e != ends->second.end()) end = e->second;
    }
    if (end < 0) {
      for (const auto& r : rows) end = std::max(end, r.ready_ns);
    }
    out.push_back(step_comm(rows, end));
  }
  return out;
}

AlphaBeta fit_alpha_beta(std::span<const std::pair<double, double>> xy) {
  AlphaBeta fit;
  fit.samples = static_cast<int>(xy.size());
  if (xy.empty()) return fit;
  double mx = 0, my = 0;
  for (const auto& [x, y] : xy) {
    mx += x;
    my += y;
  }
  mx /= static_cast<double>(xy.size());
  my /= static_cast<double>(xy.size());
  double sxx = 0, sxy = 0, syy = 0;
  for (const auto& [x, y] : xy) {
    sxx += (x - mx) * (x - mx);
    sxy += (x - mx) * (y - my);
    syy += (y - my) * (y - my);
  }
  if (sxx <= 0.0) {
    // One size only: no slope can be told from the intercept. Keep the mean as a pure per-call cost.
    fit.alpha_ns = my;
    return fit;
  }
  fit.beta_ns_per_byte = sxy / sxx;
  fit.alpha_ns = my - fit.beta_ns_per_byte * mx;
  fit.r2 = syy > 0.0 ? (sxy * sxy) / (sxx * syy) : 1.0;
  fit.valid = true;
  return fit;
}

AlphaBeta fit_alpha_beta(std::span<const store::AllreduceRow> rows) {
  std::vector<std::pair<double, double>> xy;
  xy.reserve(rows.size());
  for (const auto& r : rows) xy.emplace_back(static_cast<double>(r.bytes), static_cast<double>(r.end_ns - r.start_ns));
  return fit_alpha_beta(xy);
}

}  // namespace wb::analysis
