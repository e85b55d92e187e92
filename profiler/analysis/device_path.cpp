// The critical path of a GPU trace's steps (critical_path.hpp, device_critical_path): back from the rank
// whose step ended last, through host ranges, kernel launches, stream order, host synchronisation and
// NCCL collectives across ranks.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "profiler/analysis/critical_path.hpp"

namespace wb::analysis {

namespace {

// A stretch of a host thread that one range covers innermost (its self time, cut where children start).
struct Piece {
  std::int64_t start, end;
  const store::RangeRow* range;
};

// Self-time pieces of a thread track's ranges (by start, nested by depth), in time order.
std::vector<Piece> flatten(const std::vector<store::RangeRow>& rows) {
  std::vector<Piece> out;
  std::vector<const store::RangeRow*> stack;
  std::int64_t cursor = 0;
  auto emit = [&](std::int64_t a, std::int64_t b, const store::RangeRow* g) {
    if (b > a) out.push_back({a, b, g});
  };
  auto unwind_to = [&](std::int64_t t) {
    while (!stack.empty() && stack.back()->end_ns <= t) {
      emit(cursor, stack.back()->end_ns, stack.back());
      cursor = std::max(cursor, stack.back()->end_ns);
      stack.pop_back();
    }
  };
  for (const auto& g : rows) {
    if (g.end_ns <= g.start_ns) continue;
    unwind_to(g.start_ns);
    if (!stack.empty()) emit(cursor, g.start_ns, stack.back());
    cursor = std::max(cursor, g.start_ns);
    stack.push_back(&g);
  }
  unwind_to(INT64_MAX);
  return out;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Host calls that block until the device has finished earlier work.
bool is_sync(std::string_view name) {
  return name.find("Synchronize") != std::string_view::npos || name == "cudaMemcpy" || name == "hipMemcpy" ||
         name == "cudaMemcpy2D" || name == "cudaMemset";
}

bool is_collective(std::string_view name) { return starts_with(name, "ncclKernel") || starts_with(name, "ncclDevKernel"); }

struct Activity {
  const store::KernelRow* row;
  int rank;
};

class DeviceWalker {
 public:
  explicit DeviceWalker(const RunData& run) : run_(run) {
    for (const auto& t : run.tracks) {
      if (t.kind == store::TrackKind::thread) {
        threads_[t.rank].push_back(t.id);
        pieces_[t.id] = flatten(run.ranges_of(t.id));
        for (const auto& g : run.ranges_of(t.id))
          if (g.corr_id != 0) launches_[{t.rank, g.corr_id}] = &g;
      } else if (t.kind == store::TrackKind::stream) {
        auto it = run.kernels.find(t.id);
        if (it == run.kernels.end()) continue;
        for (const auto& k : it->second) {
          by_rank_[t.rank].push_back(&k);
          if (is_collective(run.name(k.name))) collectives_[t.rank].push_back(&k);
        }
      }
    }
    for (auto& [rank, v] : by_rank_) {
      by_launch_[rank] = v;
      std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->end_ns < b->end_ns; });
      std::sort(by_launch_[rank].begin(), by_launch_[rank].end(), [](auto* a, auto* b) { return launch_time(*a) < launch_time(*b); });
    }
  }

  // The device activity of a rank that ends last among those launched in [a, b).
  const store::KernelRow* last_launched(int rank, std::int64_t a, std::int64_t b) const {
    const store::KernelRow* best = nullptr;
    auto it = by_launch_.find(rank);
    if (it == by_launch_.end()) return nullptr;
    auto k = std::lower_bound(it->second.begin(), it->second.end(), a, [](auto* x, std::int64_t t) { return launch_time(*x) < t; });
    for (; k != it->second.end() && launch_time(**k) < b; ++k)
      if (best == nullptr || (*k)->end_ns > best->end_ns) best = *k;
    return best;
  }

  // The path back from a host thread at t, or from the end of device activity k, to `floor`.
  std::vector<PathSegment> walk_host(int rank, std::uint32_t track, std::int64_t t, std::int64_t floor) {
    return walk({rank, track, nullptr, t}, floor);
  }
  std::vector<PathSegment> walk_device(int rank, const store::KernelRow* k, std::int64_t floor) {
    return walk({rank, k->track, k, k->end_ns}, floor);
  }

 private:
  // On a host thread at t, or at the end of a device activity (kernel != nullptr).
  struct Position {
    int rank;
    std::uint32_t track;
    const store::KernelRow* kernel;
    std::int64_t t;
  };

  std::vector<PathSegment> walk(Position p, std::int64_t floor) {
    floor_ = floor;
    out_.clear();
    for (int guard = 0; guard < 1'000'000 && p.t > floor_; ++guard) p = p.kernel ? device_step(p) : host_step(p);
    std::reverse(out_.begin(), out_.end());
    return std::move(out_);
  }

  static std::int64_t launch_time(const store::KernelRow& k) { return k.launch_ns >= 0 ? k.launch_ns : k.start_ns; }

  void add(int rank, std::uint32_t track, std::string name, std::string kind, std::int64_t a, std::int64_t b) {
    a = std::max(a, floor_);
    if (b > a) out_.push_back(PathSegment{rank, std::move(name), std::move(kind), a, b, track});
  }

  // The op that launched a device activity: the range enclosing its runtime call, else the call itself.
  std::string op_of(int rank, const store::KernelRow& k) const {
    auto it = launches_.find({rank, k.corr_id});
    if (k.corr_id == 0 || it == launches_.end()) return run_.name(k.name);
    const store::RangeRow* call = it->second;
    const auto& pieces = pieces_.at(call->track);
    // The piece just before the call's start belongs to its innermost enclosing range.
    auto p = std::lower_bound(pieces.begin(), pieces.end(), call->start_ns, [](const Piece& x, std::int64_t t) { return x.end < t; });
    if (p != pieces.end() && p->start < call->start_ns && p->range != call && p->range->depth + 1 == call->depth)
      return run_.name(p->range->name);
    return run_.name(call->name);
  }

  Position host_step(Position p) {
    const auto& pieces = pieces_[p.track];
    // The piece holding t (start < t <= end), else the last one ending before t.
    auto it = std::lower_bound(pieces.begin(), pieces.end(), p.t, [](const Piece& x, std::int64_t t) { return x.end < t; });
    if (it == pieces.end() || it->start >= p.t) {
      const std::int64_t before = it == pieces.begin() ? floor_ : std::prev(it)->end;
      // A thread that a waiting thread joined: before its work, back to where the other began to wait.
      if (auto f = forks_.find(p.track); f != forks_.end() && before < f->second.second) {
        const auto [waiter, since] = f->second;
        forks_.erase(f);
        add(p.rank, p.track, "(handoff)", "gap", since, p.t);
        return {p.rank, waiter, nullptr, since};
      }
      add(p.rank, p.track, "(gap)", "gap", before, p.t);
      if (it == pieces.begin()) return {p.rank, p.track, nullptr, floor_};
      --it;
      p.t = it->end;
    }
    const store::RangeRow& g = *it->range;
    const std::string& name = run_.name(g.name);
    if (is_sync(name)) {
      // The host waited for the device: the activity of this rank that ended last before the call returned.
      const store::KernelRow* k = nullptr;
      const auto& ends = by_rank_[p.rank];
      auto a = std::upper_bound(ends.begin(), ends.end(), p.t, [](std::int64_t t, auto* x) { return t < x->end_ns; });
      while (a != ends.begin() && (*std::prev(a))->end_ns > g.start_ns) {
        --a;
        if (launch_time(**a) < g.start_ns) {
          k = *a;
          break;
        }
      }
      if (k != nullptr) {
        add(p.rank, p.track, name, "sync", k->end_ns, p.t);
        return {p.rank, k->track, k, k->end_ns};
      }
    }
    if (auto joined = join(p, *it)) {
      add(p.rank, p.track, name, "wait", joined->t, p.t);
      forks_[joined->track] = {p.track, it->start};
      return *joined;
    }
    const std::string kind = starts_with(name, "cuda") || starts_with(name, "cu") || starts_with(name, "hip")
                                 ? "runtime"
                                 : std::string(store::category_name(static_cast<store::Category>(g.category)));
    add(p.rank, p.track, name, kind, it->start, p.t);
    return {p.rank, p.track, nullptr, it->start};
  }

  // A thread that sat in one range while another thread of its rank did work that began after it and
  // ended shortly before it did (PyTorch's backward: the calling thread blocks while the autograd thread
  // runs the backward ops) waited for that work: the position at the end of the other thread's last
  // outermost range that started within the wait and ended by `p.t`, when that end leaves at most a tenth
  // of the wait (at least 100 us long) after it.
  std::optional<Position> join(const Position& p, const Piece& piece) const {
    const std::int64_t a = piece.start;
    if (p.t - a < 100'000) return std::nullopt;
    std::optional<Position> best;
    for (std::uint32_t u : threads_.at(p.rank)) {
      if (u == p.track) continue;
      const auto& rows = run_.ranges_of(u);
      auto it = std::lower_bound(rows.begin(), rows.end(), a, [](const store::RangeRow& g, std::int64_t t) { return g.start_ns < t; });
      for (; it != rows.end() && it->start_ns < p.t; ++it)
        if (it->depth == 0 && it->end_ns <= p.t && (!best || it->end_ns > best->t)) best = Position{p.rank, u, nullptr, it->end_ns};
    }
    if (!best || best->t <= a || (p.t - best->t) * 10 > p.t - a) return std::nullopt;
    return best;
  }

  // The same collective on another rank: an NCCL kernel of the same name that overlaps this one, the one
  // whose end is nearest (a collective ends on all ranks at about the same time; sampled traces lose
  // some, so matching by order would pair the wrong ones).
  const store::KernelRow* peer(int rank, const store::KernelRow& k) const {
    const store::KernelRow* best = nullptr;
    for (const auto* c : collectives_.at(rank)) {
      if (c->name != k.name || c->end_ns <= k.start_ns || c->start_ns >= k.end_ns) continue;
      if (best == nullptr || std::llabs(c->end_ns - k.end_ns) < std::llabs(best->end_ns - k.end_ns)) best = c;
    }
    return best;
  }

  Position device_step(Position p) {
    const store::KernelRow* k = p.kernel;
    int rank = p.rank;
    const std::string& kname = run_.name(k->name);
    if (is_collective(kname)) {
      // It completes once the last rank has joined: go on from the latest start among the ranks.
      const store::KernelRow* last = k;
      int last_rank = rank;
      for (const auto& [r, list] : collectives_) {
        if (r == rank) continue;
        const store::KernelRow* c = peer(r, *k);
        if (c != nullptr && c->start_ns > last->start_ns) {
          last = c;
          last_rank = r;
        }
      }
      add(rank, k->track, op_of(rank, *k), "collective", last->start_ns, std::min(p.t, k->end_ns));
      k = last;
      rank = last_rank;
    } else {
      add(rank, k->track, op_of(rank, *k), k->kind == static_cast<std::uint8_t>(store::KernelKind::kernel) ? "kernel" : "memcpy",
          k->start_ns, std::min(p.t, k->end_ns));
    }
    // What set its start: the previous activity on its stream, or its launch.
    const store::KernelRow* prev = nullptr;
    const auto& stream = run_.kernels.at(k->track);
    auto it = std::lower_bound(stream.begin(), stream.end(), k->start_ns,
                               [](const store::KernelRow& x, std::int64_t t) { return x.start_ns < t; });
    if (it != stream.begin()) prev = &*std::prev(it);
    std::int64_t launched = INT64_MIN;
    const store::RangeRow* call = nullptr;
    if (auto l = launches_.find({rank, k->corr_id}); k->corr_id != 0 && l != launches_.end()) {
      call = l->second;
      launched = k->launch_end_ns >= 0 && k->launch_end_ns <= k->start_ns ? k->launch_end_ns : call->start_ns;
    }
    const std::int64_t prev_end = prev != nullptr ? std::min(prev->end_ns, k->start_ns) : INT64_MIN;
    if (call != nullptr && launched >= prev_end) {
      add(rank, k->track, "(launch)", "launch", launched, k->start_ns);
      return {rank, call->track, nullptr, launched};
    }
    if (prev != nullptr) {
      add(rank, k->track, "(gap)", "gap", prev_end, k->start_ns);
      return {rank, prev->track, prev, prev_end};
    }
    add(rank, k->track, "(gap)", "gap", floor_, k->start_ns);
    return {rank, k->track, nullptr, floor_};
  }

  const RunData& run_;
  std::map<std::uint32_t, std::vector<Piece>> pieces_;                        // thread track -> pieces
  std::map<int, std::vector<std::uint32_t>> threads_;                         // rank -> its thread tracks
  std::map<std::uint32_t, std::pair<std::uint32_t, std::int64_t>> forks_;     // joined thread -> (waiter, since)
  std::map<std::pair<int, std::uint64_t>, const store::RangeRow*> launches_;  // (rank, corr_id) -> runtime call
  std::map<int, std::vector<const store::KernelRow*>> by_rank_;               // by end
  std::map<int, std::vector<const store::KernelRow*>> by_launch_;             // by launch
  std::map<int, std::vector<const store::KernelRow*>> collectives_;           // NCCL kernels, by start
  std::int64_t floor_ = 0;
  std::vector<PathSegment> out_;
};

}  // namespace

CriticalPath device_critical_path(const RunData& run) {
  if (run.kernel_rows == 0 || run.kernels.empty()) return {};
  std::map<int, std::map<int, const store::StepRow*>> by_step;  // step -> rank -> row
  for (const auto& s : run.steps) by_step[s.step][s.rank] = &s;
  std::size_t world = 0;
  for (const auto& [step, rows] : by_step) world = std::max(world, rows.size());
  DeviceWalker walker(run);
  std::vector<StepPath> paths;
  for (const auto& [step, rows] : by_step) {
    if (rows.size() != world) continue;  // a step some rank did not record
    StepPath path;
    path.step = step;
    path.start_ns = INT64_MAX;
    path.end_ns = INT64_MIN;
    // A step ends on a rank with its host range or with the last device work launched in it.
    int last_rank = rows.begin()->first;
    const store::KernelRow* last_kernel = nullptr;
    for (const auto& [rank, row] : rows) {
      path.start_ns = std::min(path.start_ns, row->start_ns);
      const store::KernelRow* k = walker.last_launched(rank, row->start_ns, row->end_ns);
      const std::int64_t end = std::max(row->end_ns, k != nullptr ? k->end_ns : INT64_MIN);
      if (end > path.end_ns) {
        path.end_ns = end;
        last_rank = rank;
        last_kernel = k != nullptr && k->end_ns > row->end_ns ? k : nullptr;
      }
    }
    path.segments = last_kernel != nullptr ? walker.walk_device(last_rank, last_kernel, path.start_ns)
                                           : walker.walk_host(last_rank, run.main_track(last_rank), path.end_ns, path.start_ns);
    if (!path.segments.empty()) paths.push_back(std::move(path));
  }
  return summarize_paths(std::move(paths));
}

}  // namespace wb::analysis
