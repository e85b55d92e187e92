#include "profiler/analysis/stragglers.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

namespace wb::analysis {

namespace {

std::int64_t median_of(std::vector<std::int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool is_compute(std::uint8_t category) {
  using store::Category;
  return category == static_cast<std::uint8_t>(Category::forward) ||
         category == static_cast<std::uint8_t>(Category::backward) ||
         category == static_cast<std::uint8_t>(Category::loss) ||
         category == static_cast<std::uint8_t>(Category::optimizer);
}

// What one rank did in one step.
struct RankStep {
  std::int64_t ready_ns = -1;   // gradients ready (latest bucket ready), else the end of backward
  std::int64_t data_wait_ns = 0;
  std::map<int, std::int64_t> bucket_ready;  // bucket -> ready time
  std::unordered_map<std::uint32_t, std::int64_t> op_ns;  // leaf compute ranges by name
  std::int64_t op_total_ns = 0;
};

// Leaf compute ranges of a track (ranges no other range nests in), per step, by name.
void collect_ops(const RunData& run, std::uint32_t track, std::map<int, RankStep>& steps) {
  const auto& rows = run.ranges_of(track);  // by start
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (r.step < 0 || !is_compute(r.category)) continue;
    const bool has_child = i + 1 < rows.size() && rows[i + 1].start_ns < r.end_ns && rows[i + 1].depth > r.depth;
    auto it = steps.find(r.step);
    if (it == steps.end()) continue;
    if (r.category == static_cast<std::uint8_t>(store::Category::backward)) {
      it->second.ready_ns = std::max(it->second.ready_ns, r.end_ns);  // replaced by bucket times when present
    }
    if (has_child) continue;
    it->second.op_ns[r.name] += r.end_ns - r.start_ns;
    it->second.op_total_ns += r.end_ns - r.start_ns;
  }
}

std::vector<OpLag> top(std::unordered_map<std::uint32_t, std::int64_t> extra, const RunData& run, std::size_t n) {
  std::vector<OpLag> out;
  for (const auto& [name, ns] : extra) {
    if (ns > 0) out.push_back({run.name(name), ns});
  }
  std::sort(out.begin(), out.end(), [](const OpLag& a, const OpLag& b) {
    return a.extra_ns != b.extra_ns ? a.extra_ns > b.extra_ns : a.op < b.op;
  });
  if (out.size() > n) out.resize(n);
  return out;
}

LagCause dominant(std::int64_t data, std::int64_t ops, std::int64_t host) {
  if (data >= ops && data >= host) return LagCause::data_wait;
  if (ops >= host) return LagCause::slower_ops;
  return LagCause::host;
}

// What each rank did in each step, indexed like `ranks`: its data wait from the step rows, its compute
// from its main track, and its gradient ready time from its allreduce buckets.
std::vector<std::map<int, RankStep>> gather_rank_steps(const RunData& run, const std::vector<int>& ranks) {
  // rank index -> step -> what it did
  std::vector<std::map<int, RankStep>> by_rank(ranks.size());
  std::map<int, int> index_of;
  for (std::size_t i = 0; i < ranks.size(); ++i) index_of[ranks[i]] = static_cast<int>(i);
  for (const auto& s : run.steps) {
    RankStep& rs = by_rank[static_cast<std::size_t>(index_of.at(s.rank))][s.step];
    rs.data_wait_ns = s.data_wait_ns;
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (const std::uint32_t track = run.main_track(ranks[i]); track != 0) collect_ops(run, track, by_rank[i]);
  }
  for (const auto& a : run.allreduces) {
    auto ri = index_of.find(a.rank);
    if (ri == index_of.end()) continue;
    auto& steps = by_rank[static_cast<std::size_t>(ri->second)];
    auto it = steps.find(a.step);
    if (it == steps.end()) continue;
    it->second.bucket_ready[a.bucket] = a.ready_ns;
  }
  for (auto& steps : by_rank) {
    for (auto& [step, rs] : steps) {
      for (const auto& [bucket, ready] : rs.bucket_ready) rs.ready_ns = std::max(rs.ready_ns, ready);
    }
  }
  return by_rank;
}

// Every rank's record of a step, or none when some rank lacks the step or its ready time.
std::vector<const RankStep*> ranks_in_step(const std::vector<std::map<int, RankStep>>& by_rank, int step) {
  std::vector<const RankStep*> rs(by_rank.size(), nullptr);
  for (std::size_t i = 0; i < by_rank.size(); ++i) {
    auto it = by_rank[i].find(step);
    if (it == by_rank[i].end() || it->second.ready_ns < 0) return {};
    rs[i] = &it->second;
  }
  return rs;
}

// The index of the rank whose gradients were ready last (the first such on a tie).
std::size_t last_ready(const std::vector<const RankStep*>& rs) {
  std::size_t last = 0;
  for (std::size_t i = 1; i < rs.size(); ++i) {
    if (rs[i]->ready_ns > rs[last]->ready_ns) last = i;
  }
  return last;
}

// Waits: per bucket the latest ready over the ranks minus the rank's own, the largest over buckets
// (buckets every rank recorded); without buckets, the final ready times.
std::vector<std::int64_t> waits_for_last(const std::vector<const RankStep*>& rs, std::size_t last) {
  const std::size_t n = rs.size();
  std::vector<std::int64_t> wait_ns(n, 0);
  std::set<int> buckets;
  for (const auto& [b, t] : rs[0]->bucket_ready) {
    bool everywhere = true;
    for (std::size_t i = 1; i < n; ++i) everywhere = everywhere && rs[i]->bucket_ready.count(b);
    if (everywhere) buckets.insert(b);
  }
  if (buckets.empty()) {
    for (std::size_t i = 0; i < n; ++i) wait_ns[i] = rs[last]->ready_ns - rs[i]->ready_ns;
  } else {
    for (int b : buckets) {
      std::int64_t latest = 0;
      for (std::size_t i = 0; i < n; ++i) latest = std::max(latest, rs[i]->bucket_ready.at(b));
      for (std::size_t i = 0; i < n; ++i) wait_ns[i] = std::max(wait_ns[i], latest - rs[i]->bucket_ready.at(b));
    }
  }
  return wait_ns;
}

// What made the last rank late beyond the lag fields of the step: the ops it spent longer on than the
// others' median (op -> extra) and the rest of its lag, put down to the host.
struct LagParts {
  std::unordered_map<std::uint32_t, std::int64_t> extra;
  std::int64_t host_ns = 0;
};

// The lag and its causes, against the other ranks' medians; fills the step's lag, extras, cause and
// top ops.
LagParts explain_lag(const RunData& run, const std::vector<const RankStep*>& rs, std::size_t last, StepStraggle& st) {
  const std::size_t n = rs.size();
  std::vector<std::int64_t> ready, data, ops;
  for (std::size_t i = 0; i < n; ++i) {
    if (i == last) continue;
    ready.push_back(rs[i]->ready_ns);
    data.push_back(rs[i]->data_wait_ns);
    ops.push_back(rs[i]->op_total_ns);
  }
  st.lag_ns = rs[last]->ready_ns - median_of(ready);
  st.data_extra_ns = rs[last]->data_wait_ns - median_of(data);
  LagParts parts;
  for (const auto& [name, ns] : rs[last]->op_ns) {
    std::vector<std::int64_t> others;
    for (std::size_t i = 0; i < n; ++i) {
      if (i == last) continue;
      auto it = rs[i]->op_ns.find(name);
      others.push_back(it == rs[i]->op_ns.end() ? 0 : it->second);
    }
    const std::int64_t e = ns - median_of(others);
    if (e > 0) {
      parts.extra[name] = e;
      st.ops_extra_ns += e;
    }
  }
  parts.host_ns = st.lag_ns - std::max<std::int64_t>(0, st.data_extra_ns) - st.ops_extra_ns;
  st.cause = dominant(st.data_extra_ns, st.ops_extra_ns, parts.host_ns);
  st.top_ops = top(parts.extra, run, 3);
  return parts;
}

// Per rank, what it did over the steps it was last in: the sums that become persistent stragglers.
struct StragglerTotals {
  explicit StragglerTotals(std::size_t n) : acc(n), wait_caused(n, 0.0) {}

  // Adds a step in which rank index `last` was the last rank.
  void add(const StepStraggle& st, std::size_t last, const LagParts& parts) {
    const std::size_t n = acc.size();
    PersistentStraggler& p = acc[last];
    ++p.steps_last;
    p.mean_lag_ns += static_cast<double>(st.lag_ns);
    std::int64_t others_wait = 0;
    for (std::size_t i = 0; i < n; ++i) others_wait += i == last ? 0 : st.wait_ns[i];
    wait_caused[last] += static_cast<double>(others_wait) / static_cast<double>(n - 1);
    p.data_extra_ns += std::max<std::int64_t>(0, st.data_extra_ns);
    p.ops_extra_ns += st.ops_extra_ns;
    p.host_extra_ns += std::max<std::int64_t>(0, parts.host_ns);
    for (const auto& [name, e] : parts.extra) ops_by_straggler[static_cast<int>(last)][name] += e;
  }

  std::vector<PersistentStraggler> acc;
  std::vector<double> wait_caused;
  std::map<int, std::unordered_map<std::uint32_t, std::int64_t>> ops_by_straggler;  // rank index -> op -> extra
};

// The ranks last in more than `share` of the shared steps (none with fewer than 3 shared steps).
std::vector<PersistentStraggler> persistent_stragglers(const RunData& run, const std::vector<int>& ranks,
                                                       StragglerTotals& totals, std::size_t shared_steps,
                                                       double share) {
  std::vector<PersistentStraggler> out;
  const double shared = static_cast<double>(shared_steps);
  for (std::size_t i = 0; i < ranks.size() && shared >= 3; ++i) {
    PersistentStraggler& p = totals.acc[i];
    p.fraction = p.steps_last / shared;
    if (p.steps_last == 0 || p.fraction <= share) continue;
    p.rank = ranks[i];
    p.mean_lag_ns /= p.steps_last;
    p.mean_wait_caused_ns = totals.wait_caused[i] / p.steps_last;
    p.cause = dominant(p.data_extra_ns, p.ops_extra_ns, p.host_extra_ns);
    p.top_ops = top(totals.ops_by_straggler[static_cast<int>(i)], run, 5);
    out.push_back(p);
  }
  return out;
}

}  // namespace

const char* lag_cause_name(LagCause c) {
  switch (c) {
    case LagCause::data_wait: return "data wait";
    case LagCause::slower_ops: return "slower ops";
    case LagCause::host: return "host";
  }
  return "?";
}

StragglerAnalysis analyze_stragglers(const RunData& run, double share) {
  StragglerAnalysis out;
  std::set<int> rank_set;
  for (const auto& s : run.steps) rank_set.insert(s.rank);
  out.ranks.assign(rank_set.begin(), rank_set.end());
  out.total_wait_ns.assign(out.ranks.size(), 0);
  if (out.ranks.size() < 2) return out;

  const std::vector<std::map<int, RankStep>> by_rank = gather_rank_steps(run, out.ranks);

  // Steps every rank recorded with a ready time.
  const std::size_t n = out.ranks.size();
  StragglerTotals totals(n);
  for (const auto& [step, first] : by_rank[0]) {
    const std::vector<const RankStep*> rs = ranks_in_step(by_rank, step);
    if (rs.empty()) continue;
    StepStraggle st;
    st.step = step;
    const std::size_t last = last_ready(rs);
    st.last_rank = out.ranks[last];
    st.wait_ns = waits_for_last(rs, last);
    const LagParts parts = explain_lag(run, rs, last, st);
    for (std::size_t i = 0; i < n; ++i) {
      out.total_wait_ns[i] += st.wait_ns[i];
      out.max_wait_ns = std::max(out.max_wait_ns, st.wait_ns[i]);
    }
    totals.add(st, last, parts);
    out.steps.push_back(std::move(st));
  }
  out.persistent = persistent_stragglers(run, out.ranks, totals, out.steps.size(), share);
  return out;
}

}  // namespace wb::analysis
