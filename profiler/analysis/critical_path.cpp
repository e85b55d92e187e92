#include "profiler/analysis/critical_path.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace wb::analysis {

namespace {

constexpr const char* kWaitName = "allreduce_wait";  // wb-train's wait for the step's allreduces

struct RankStep {
  std::int64_t start = 0, end = 0;
  std::vector<const store::RangeRow*> ops;        // by start
  std::vector<const store::AllreduceRow*> comm;   // by start
};

std::string kind_of(std::uint8_t category) { return std::string(store::category_name(static_cast<store::Category>(category))); }

// A step's ranges on a rank's main thread at the level under the step range, and its collectives.
std::map<int, RankStep> gather(const RunData& run, int step, const std::vector<int>& ranks,
                               const std::map<std::pair<int, int>, std::vector<const store::AllreduceRow*>>& comm,
                               const std::map<std::pair<int, int>, const store::StepRow*>& step_rows,
                               const std::map<int, std::pair<std::uint32_t, std::int64_t>>& main_tracks) {
  std::map<int, RankStep> out;
  for (int r : ranks) {
    auto found = step_rows.find({r, step});
    if (found == step_rows.end()) continue;
    const store::StepRow* row = found->second;
    RankStep rs;
    rs.start = row->start_ns;
    rs.end = row->end_ns;
    // The main thread's ranges by start: those starting in the step, and any before it that reach into it
    // (found by a bounded look back: the longest range of the track).
    const auto& rows = run.ranges_of(main_tracks.at(r).first);
    auto it = std::lower_bound(rows.begin(), rows.end(), rs.start - main_tracks.at(r).second,
                               [](const store::RangeRow& g, std::int64_t t) { return g.start_ns < t; });
    for (; it != rows.end() && it->start_ns < rs.end; ++it) {
      const auto& g = *it;
      if (g.category == static_cast<std::uint8_t>(store::Category::step) || g.depth > 1) continue;
      if (g.end_ns <= rs.start) continue;
      rs.ops.push_back(&g);
    }
    if (auto it = comm.find({r, step}); it != comm.end()) rs.comm = it->second;
    out[r] = std::move(rs);
  }
  return out;
}

class Walker {
 public:
  Walker(const RunData& run, std::map<int, RankStep> ranks) : run_(run), ranks_(std::move(ranks)) {}

  std::vector<PathSegment> walk(int rank, std::int64_t t) {
    for (int guard = 0; guard < 100000; ++guard) {
      const RankStep& rs = ranks_.at(rank);
      const store::RangeRow* op = nullptr;
      for (const auto* g : rs.ops)
        if (g->start_ns < t) op = g;  // the last one to start before t
      if (op == nullptr) {
        add(rank, "(gap)", "gap", rs.start, t);
        break;
      }
      if (op->end_ns < t) {
        add(rank, "(gap)", "gap", op->end_ns, t);
        t = op->end_ns;
      }
      if (run_.name(op->name) == kWaitName && !rs.comm.empty()) {
        std::tie(rank, t) = collective(rank, t, op);
        continue;
      }
      add(rank, run_.name(op->name), kind_of(op->category), op->start_ns, t);
      t = op->start_ns;
    }
    std::reverse(out_.begin(), out_.end());
    return std::move(out_);
  }

 private:
  void add(int rank, const std::string& name, const char* kind, std::int64_t a, std::int64_t b) {
    add(rank, name, std::string(kind), a, b);
  }
  void add(int rank, const std::string& name, const std::string& kind, std::int64_t a, std::int64_t b) {
    if (b > a) out_.push_back(PathSegment{rank, name, kind, a, b, 0});
  }

  // The rank's wait for its allreduces ends with its last collective: back through the collectives to
  // the rank that joined the first one not held up by its predecessor, at the moment its gradients were
  // ready. Returns where the walk goes on.
  std::pair<int, std::int64_t> collective(int rank, std::int64_t t, const store::RangeRow* wait) {
    const store::AllreduceRow* row = nullptr;  // this rank's last collective ending by t
    for (const auto* c : ranks_.at(rank).comm)
      if (c->end_ns <= t + kSlackNs && (row == nullptr || c->end_ns > row->end_ns)) row = c;
    if (row == nullptr || row->end_ns < wait->start_ns) {  // the wait was not for a collective of this step
      add(rank, run_.name(wait->name), kind_of(wait->category), wait->start_ns, t);
      return {rank, wait->start_ns};
    }
    add(rank, run_.name(wait->name), kind_of(wait->category), std::min(row->end_ns, t), t);
    t = std::min(row->end_ns, t);
    while (true) {
      // The collective started when its last rank joined.
      const store::AllreduceRow* last = nullptr;
      for (const auto& [r, rs] : ranks_)
        for (const auto* c : rs.comm)
          if (c->bucket == row->bucket && (last == nullptr || c->start_ns > last->start_ns)) last = c;
      add(last->rank, "allreduce bucket " + std::to_string(row->bucket), "collective", last->start_ns, t);
      t = last->start_ns;
      // Held up by its own communication thread's previous collective, or joined when its gradients were.
      const store::AllreduceRow* prev = nullptr;
      for (const auto* c : ranks_.at(last->rank).comm)
        if (c->end_ns <= last->start_ns + kSlackNs && c->start_ns < last->start_ns && (prev == nullptr || c->end_ns > prev->end_ns))
          prev = c;
      if (prev != nullptr && prev->end_ns > last->ready_ns) {
        row = prev;
        t = std::min(t, prev->end_ns);
        continue;
      }
      add(last->rank, "(handoff)", "comm", last->ready_ns, t);
      return {last->rank, std::min(t, last->ready_ns)};
    }
  }

  static constexpr std::int64_t kSlackNs = 1000;  // clock offsets leave ranks' shared instants a little apart
  const RunData& run_;
  std::map<int, RankStep> ranks_;
  std::vector<PathSegment> out_;
};

}  // namespace

CriticalPath summarize_paths(std::vector<StepPath> steps) {
  CriticalPath out;
  std::map<std::pair<std::string, std::string>, PathOp> ops;
  for (const StepPath& path : steps) {
    std::set<std::pair<std::string, std::string>> seen;
    for (const auto& seg : path.segments) {
      PathOp& op = ops[{seg.name, seg.kind}];
      op.name = seg.name;
      op.kind = seg.kind;
      op.total_ns += seg.end_ns - seg.start_ns;
      if (seen.insert({seg.name, seg.kind}).second) ++op.steps;
      out.path_ns += seg.end_ns - seg.start_ns;
    }
  }
  out.steps = std::move(steps);
  for (auto& [key, op] : ops) out.ops.push_back(std::move(op));
  std::sort(out.ops.begin(), out.ops.end(), [](const PathOp& a, const PathOp& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  return out;
}

CriticalPath critical_path(const RunData& run) {
  if (!run.pipeline_spans.empty()) return pipeline_critical_path(run);
  if (run.allreduces.empty()) return device_critical_path(run);
  CriticalPath out;
  std::map<std::pair<int, int>, std::vector<const store::AllreduceRow*>> comm;  // (rank, step)
  std::map<int, std::set<int>> ranks_of_step;
  for (const auto& a : run.allreduces) {
    comm[{a.rank, a.step}].push_back(&a);
    ranks_of_step[a.step].insert(a.rank);
  }
  for (auto& [key, rows] : comm)
    std::sort(rows.begin(), rows.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
  std::size_t world = 0;
  for (const auto& [s, rs] : ranks_of_step) world = std::max(world, rs.size());
  std::map<std::pair<int, int>, const store::StepRow*> step_rows;  // (rank, step)
  for (const auto& s : run.steps) step_rows[{s.rank, s.step}] = &s;
  std::map<int, std::pair<std::uint32_t, std::int64_t>> main_tracks;  // rank -> (main track, its longest range under a step)
  for (const auto& [key, rows] : comm)
    if (!main_tracks.count(key.first)) {
      const std::uint32_t track = run.main_track(key.first);
      std::int64_t longest = 0;
      for (const auto& g : run.ranges_of(track))
        if (g.category != static_cast<std::uint8_t>(store::Category::step) && g.depth <= 1)
          longest = std::max(longest, g.end_ns - g.start_ns);
      main_tracks[key.first] = {track, longest};
    }
  std::vector<StepPath> paths;
  for (const auto& [step, rank_set] : ranks_of_step) {
    if (rank_set.size() != world) continue;
    const std::vector<int> ranks(rank_set.begin(), rank_set.end());
    std::map<int, RankStep> rs = gather(run, step, ranks, comm, step_rows, main_tracks);
    if (rs.size() != world) continue;
    StepPath path;
    path.step = step;
    path.start_ns = INT64_MAX;
    path.end_ns = INT64_MIN;
    int last = ranks.front();
    for (const auto& [r, s] : rs) {
      path.start_ns = std::min(path.start_ns, s.start);
      if (s.end > path.end_ns) {
        path.end_ns = s.end;
        last = r;
      }
    }
    path.segments = Walker(run, std::move(rs)).walk(last, path.end_ns);
    paths.push_back(std::move(path));
  }
  return summarize_paths(std::move(paths));
}

}  // namespace wb::analysis
