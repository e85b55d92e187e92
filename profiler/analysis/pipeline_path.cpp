// The critical path of a pipeline run's steps (critical_path.hpp): back from the stage that ended the step
// last, through each stage's forwards, backwards and receives, to the sender of every message a stage
// waited for.
#include <algorithm>
#include <map>
#include <tuple>

#include "profiler/analysis/critical_path.hpp"

namespace wb::analysis {

namespace {

constexpr std::int64_t kSlackNs = 1000;  // clock offsets leave a message's two ends a little apart

bool is_compute(const store::PipelineSpanRow& r) { return r.kind == "forward" || r.kind == "backward"; }
bool is_recv(const store::PipelineSpanRow& r) { return r.kind == "recv_act" || r.kind == "recv_grad"; }

// (step, micro, "act" or "grad", from rank, to rank): a message's two ends meet under this key.
using MessageKey = std::tuple<int, int, std::string, int, int>;

class PipelineWalker {
 public:
  PipelineWalker(const std::map<int, std::vector<const store::PipelineSpanRow*>>& items,
                 const std::map<MessageKey, const store::PipelineSpanRow*>& sends, const std::map<int, std::int64_t>& starts)
      : items_(items), sends_(sends), starts_(starts) {}

  std::vector<PathSegment> walk(int step, int rank, std::int64_t t) {
    std::vector<PathSegment> out;
    for (int guard = 0; guard < 1'000'000; ++guard) {
      const std::int64_t floor = starts_.count(rank) ? starts_.at(rank) : t;
      const store::PipelineSpanRow* it = last_before(rank, t);
      if (it == nullptr || t <= floor) {
        if (t > floor) out.push_back({rank, "(bubble)", "gap", floor, t});
        break;
      }
      const std::int64_t end = std::min(it->end_ns, t);
      if (end < t) out.push_back({rank, "(bubble)", "gap", end, t});
      const std::string stage = "stage " + std::to_string(it->stage);
      if (is_compute(*it)) {
        out.push_back({rank, stage + " " + it->kind, it->kind, it->start_ns, end});
        t = it->start_ns;
        continue;
      }
      const bool act = it->kind == "recv_act";
      const std::string what = act ? "activations to " + stage : "gradients to " + stage;
      auto send = sends_.find({step, it->micro, act ? "act" : "grad", it->peer, rank});
      if (send != sends_.end() && send->second->post_ns > it->start_ns + kSlackNs && send->second->post_ns < end) {
        // The stage waited for a message its sender posted late: the path goes on at the sender.
        out.push_back({rank, what, "comm", send->second->post_ns, end});
        rank = it->peer;
        t = send->second->post_ns;
        continue;
      }
      out.push_back({rank, what, "comm", std::min(it->start_ns, end), end});
      t = std::min(it->start_ns, end);
    }
    std::reverse(out.begin(), out.end());
    std::erase_if(out, [](const PathSegment& s) { return s.end_ns <= s.start_ns; });
    return out;
  }

 private:
  // The rank's last compute span or receive that starts before t.
  const store::PipelineSpanRow* last_before(int rank, std::int64_t t) const {
    auto found = items_.find(rank);
    if (found == items_.end()) return nullptr;
    const auto& v = found->second;
    auto pos = std::lower_bound(v.begin(), v.end(), t, [](const store::PipelineSpanRow* r, std::int64_t x) { return r->start_ns < x; });
    return pos == v.begin() ? nullptr : *(pos - 1);
  }

  const std::map<int, std::vector<const store::PipelineSpanRow*>>& items_;
  const std::map<MessageKey, const store::PipelineSpanRow*>& sends_;
  const std::map<int, std::int64_t>& starts_;
};

}  // namespace

CriticalPath pipeline_critical_path(const RunData& run) {
  // Per step: each rank's compute spans and receives by start, the sends by message, the stages' windows.
  std::map<int, std::map<int, std::vector<const store::PipelineSpanRow*>>> items;  // step -> rank -> items
  std::map<MessageKey, const store::PipelineSpanRow*> sends;
  for (const auto& r : run.pipeline_spans) {
    if (is_compute(r) || is_recv(r)) items[r.step][r.rank].push_back(&r);
    else if (r.kind == "send_act" || r.kind == "send_grad")
      sends[{r.step, r.micro, r.kind == "send_act" ? "act" : "grad", r.rank, r.peer}] = &r;
  }
  std::map<int, std::map<int, std::pair<std::int64_t, std::int64_t>>> windows;  // step -> rank -> (start, end)
  for (const auto& s : run.pipeline_steps) windows[s.step][s.rank] = {s.start_ns, s.end_ns};
  std::vector<StepPath> paths;
  for (auto& [step, ranks] : items) {
    std::map<int, std::int64_t> starts;
    StepPath path;
    path.step = step;
    path.start_ns = INT64_MAX;
    path.end_ns = INT64_MIN;
    int last = ranks.begin()->first;
    for (auto& [rank, v] : ranks) {
      std::sort(v.begin(), v.end(), [](const auto* a, const auto* b) { return a->start_ns < b->start_ns; });
      std::int64_t lo = v.front()->start_ns, hi = 0;
      for (const auto* r : v) hi = std::max(hi, r->end_ns);
      if (auto w = windows.find(step); w != windows.end() && w->second.count(rank)) {
        lo = std::min(lo, w->second.at(rank).first);
        hi = std::max(hi, w->second.at(rank).second);
      }
      starts[rank] = lo;
      path.start_ns = std::min(path.start_ns, lo);
      if (hi > path.end_ns) path.end_ns = hi, last = rank;
    }
    path.segments = PipelineWalker(ranks, sends, starts).walk(step, last, path.end_ns);
    paths.push_back(std::move(path));
  }
  return summarize_paths(std::move(paths));
}

}  // namespace wb::analysis
