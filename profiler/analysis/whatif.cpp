#include "profiler/analysis/whatif.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace wb::analysis {

namespace {

constexpr const char* kWaitName = "allreduce_wait";  // wb-train's wait for the step's allreduces
constexpr const char* kDataWaitName = "data_wait";   // its wait for the next batch
constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::min();

[[noreturn]] void bad(std::string_view text, std::string_view why) {
  throw AnalysisError(concat("'", text, "': ", why));
}

int parse_index(std::string_view text, std::string_view value, std::string_view what) {
  int v = -1;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 0)
    bad(text, concat("expected ", what, " as a number >= 0, got '", value, "'"));
  return v;
}

double parse_number(std::string_view text, std::string_view value, std::string_view what) {
  std::string s(value);
  if (!s.empty() && s.front() == '+') s.erase(0, 1);
  std::size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || !std::isfinite(v)) bad(text, concat("expected ", what, ", got '", value, "'"));
  return v;
}

// PATTERN (everything before the last ':') into the change's terms.
WhatIfChange parse_pattern(std::string_view text, std::string_view pattern) {
  WhatIfChange c;
  c.text = text;
  bool collectives = false, batches = false;
  std::size_t pos = 0;
  while (pos <= pattern.size()) {
    const std::size_t amp = std::min(pattern.find('&', pos), pattern.size());
    const std::string_view term = pattern.substr(pos, amp - pos);
    pos = amp + 1;
    if (term.empty()) bad(text, "an empty term in the pattern (terms are joined by '&')");
    auto value = [&](std::string_view prefix) { return term.substr(prefix.size()); };
    if (term.rfind("rank:", 0) == 0) {
      c.rank = parse_index(text, value("rank:"), "a rank");
    } else if (term.rfind("bucket:", 0) == 0) {
      c.bucket = parse_index(text, value("bucket:"), "a bucket");
      collectives = true;
    } else if (term.rfind("class:", 0) == 0) {
      const std::string_view cls = value("class:");
      if (cls == "communication") {
        collectives = true;
      } else {
        try {
          c.category = store::category_from_name(cls);
        } catch (const std::invalid_argument&) {
          bad(text, concat("unknown class '", cls, "' (communication, forward, backward, loss, optimizer, data, comm)"));
        }
      }
    } else if (term == "data") {
      batches = true;
    } else if (term.rfind("kernel:", 0) == 0) {
      bad(text, "kernel patterns are not replayed: wb whatif replays the host's step graph (main-thread ranges, "
                "collectives, input batches)");
    } else {
      const std::string_view glob = term.rfind("op:", 0) == 0 ? value("op:") : term;
      if (glob.empty()) bad(text, "an empty op pattern");
      c.globs.emplace_back(glob);
    }
  }
  if (collectives && batches) bad(text, "a pattern is either collectives (bucket:, class:communication) or data");
  if ((collectives || batches) && (!c.globs.empty() || c.category))
    bad(text, "op names and range classes do not combine with collectives or data");
  c.target = collectives ? WhatIfChange::Target::collectives
             : batches   ? WhatIfChange::Target::batches
                         : WhatIfChange::Target::ranges;
  return c;
}

std::size_t split_value(std::string_view text, std::string_view example) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
    bad(text, concat("expected PATTERN:", example));
  return colon;
}

// ---- the graph ----

struct Sub {  // a changed range inside an op
  std::int64_t start = 0, end = 0, delta = 0;
};

struct Op {
  enum Kind { plain, comm_wait, data_wait };
  const store::RangeRow* row = nullptr;
  Kind kind = plain;
  std::int64_t gap = 0;    // recorded time from the previous op's end (the step's start for the first)
  std::int64_t delta = 0;  // what the changes add to it
  std::vector<Sub> subs;   // by start
  std::int64_t start2 = 0, end2 = 0;
  std::int64_t dur() const { return row->end_ns - row->start_ns; }
};

struct RankStep {
  const store::StepRow* row = nullptr;
  int batch = -1;  // its batch's index in the rank's input pipeline
  bool has_data_wait = false;
  std::vector<Op> ops;
  std::vector<const store::AllreduceRow*> comm;  // by recorded start
  std::vector<std::int64_t> comm_end2;          // this rank's replayed end of each
  std::vector<std::int64_t> comm_start2;
  std::vector<std::int64_t> comm_ready2;
  std::int64_t start2 = 0, end2 = 0;
};

// A recorded instant on a rank's step moved to the replay.
std::int64_t map_time(const RankStep& rs, std::int64_t x) {
  const Op* op = nullptr;
  for (const auto& o : rs.ops) {
    if (o.row->start_ns > x) break;
    op = &o;
  }
  if (op == nullptr) return rs.start2 + (x - rs.row->start_ns);
  if (x >= op->row->end_ns) return op->end2 + (x - op->row->end_ns);
  std::int64_t t = op->start2 + (x - op->row->start_ns);
  if (op->kind != Op::plain) return std::min(t, op->end2);
  for (const auto& s : op->subs) {
    if (s.end <= x) t += s.delta;
    else if (s.start < x)
      t += static_cast<std::int64_t>(std::llround(static_cast<double>(s.delta) * static_cast<double>(x - s.start) /
                                                  static_cast<double>(std::max<std::int64_t>(1, s.end - s.start))));
  }
  return std::clamp(t, op->start2, op->end2);
}

// One rank's input pipeline, replayed batch by batch in order.
struct InputPipeline {
  int workers = 0, prefetch = 0;
  std::vector<std::int64_t> recorded_start, dur, dur2;
  std::vector<std::int64_t> release, pop;  // per batch: the end of the step that used it, of its data wait
  std::vector<std::int64_t> avail;         // replayed: when it is in the queue
  std::vector<std::int64_t> after_avail;   // its data wait's recorded end after the batch was there (replay pass)
  std::vector<std::int64_t> free_at;
  int next = 0;

  void reset() {
    avail.assign(dur.size(), 0);
    free_at.assign(static_cast<std::size_t>(workers), recorded_start.empty() ? 0 : recorded_start.front());
    next = 0;
  }
  std::int64_t available(int k, bool changed) {
    const int buffers = prefetch + workers + 1;
    for (; next <= k; ++next) {
      const auto j = static_cast<std::size_t>(next);
      auto w = std::min_element(free_at.begin(), free_at.end());
      std::int64_t start = std::max(*w, next < workers ? recorded_start[j] : kNever);
      if (next >= buffers) start = std::max(start, release[j - static_cast<std::size_t>(buffers)]);
      const std::int64_t done = start + (changed ? dur2[j] : dur[j]);
      *w = done;
      std::int64_t push = done;
      if (next > 0) push = std::max(push, avail[j - 1]);
      if (next >= prefetch) push = std::max(push, pop[j - static_cast<std::size_t>(prefetch)]);
      avail[j] = push;
    }
    return avail[static_cast<std::size_t>(k)];
  }
};

bool matches_range(const WhatIfChange& c, const RunData& run, int rank, const store::RangeRow& r) {
  if (c.target != WhatIfChange::Target::ranges) return false;
  if (c.rank && *c.rank != rank) return false;
  if (c.category && static_cast<std::uint8_t>(*c.category) != r.category) return false;
  const std::string& name = run.name(r.name);
  for (const auto& g : c.globs)
    if (fnmatch(g.c_str(), name.c_str(), 0) != 0) return false;
  return true;
}

bool matches_collective(const WhatIfChange& c, int rank, int bucket) {
  return c.target == WhatIfChange::Target::collectives && (!c.rank || *c.rank == rank) && (!c.bucket || *c.bucket == bucket);
}

std::int64_t change_of(const WhatIfChange& c, std::int64_t dur) {
  return c.add_ns + static_cast<std::int64_t>(std::llround((c.factor - 1.0) * static_cast<double>(dur)));
}

class Replay {
 public:
  Replay(const RunData& run, const std::vector<WhatIfChange>& changes) : run_(run), changes_(changes) {
    matched_.assign(changes.size(), 0);
    gather_steps();
    build_ops();
    build_pipelines();
    for (std::size_t i = 0; i < changes_.size(); ++i)
      if (matched_[i] == 0) throw AnalysisError(concat("'", changes_[i].text, "' matches nothing in the steps replayed"));
  }

  // Replays every step in order; `changed` applies the changes.
  void run(bool changed) {
    changed_ = changed;
    for (auto& [r, p] : pipelines_) p.reset();
    std::map<int, const RankStep*> prev;
    for (auto& [step, ranks] : steps_) {
      for (auto& [r, rs] : ranks) {
        auto it = prev.find(r);
        rs.start2 = it == prev.end() ? rs.row->start_ns : it->second->end2 + (rs.row->start_ns - it->second->row->end_ns);
      }
      std::map<int, std::size_t> resume;
      for (auto& [r, rs] : ranks) resume[r] = run_ops(r, rs, 0, true);
      collectives(ranks);
      for (auto& [r, rs] : ranks) {
        run_ops(r, rs, resume[r], false);
        prev[r] = &rs;
      }
    }
  }

  // Mean over the steps from `warmup` on (all of them when none is) of the ranks' mean step time,
  // recorded or replayed, and the step nearest that mean.
  std::pair<double, int> mean_step(bool recorded, int warmup) const {
    std::vector<std::pair<double, int>> v;
    for (const auto& [step, ranks] : steps_) {
      if (step < warmup && steps_.rbegin()->first >= warmup) continue;
      double sum = 0.0;
      for (const auto& [r, rs] : ranks)
        sum += recorded ? static_cast<double>(rs.row->end_ns - rs.row->start_ns) : static_cast<double>(rs.end2 - rs.start2);
      v.emplace_back(sum / static_cast<double>(ranks.size()), step);
    }
    double mean = 0.0;
    for (const auto& [d, s] : v) mean += d;
    mean /= static_cast<double>(v.size());
    auto nearest = std::min_element(v.begin(), v.end(), [&](const auto& a, const auto& b) {
      return std::abs(a.first - mean) < std::abs(b.first - mean);
    });
    return {mean, nearest->second};
  }
  int steps_used(int warmup) const {
    int n = 0;
    for (const auto& [step, ranks] : steps_) n += step >= warmup ? 1 : 0;
    return n > 0 ? n : static_cast<int>(steps_.size());
  }
  const std::vector<std::int64_t>& matched() const { return matched_; }
  bool batches_replayed() const { return !pipelines_.empty(); }

  // The replayed times as a run: main-thread ranges of the replayed steps, their step and allreduce rows.
  RunData replayed() const {
    RunData out;
    out.path = run_.path;
    out.meta = run_.meta;
    out.config = run_.config;
    out.strings = run_.strings;
    out.ranks = run_.ranks;
    for (const auto& [step, ranks] : steps_)
      for (const auto& [r, rs] : ranks) {
        store::StepRow s = *rs.row;
        s.start_ns = rs.start2;
        s.end_ns = rs.end2;
        out.steps.push_back(s);
        for (std::size_t i = 0; i < rs.comm.size(); ++i) {
          store::AllreduceRow a = *rs.comm[i];
          a.ready_ns = rs.comm_ready2[i];
          a.start_ns = rs.comm_start2[i];
          a.end_ns = rs.comm_end2[i];
          out.allreduces.push_back(a);
        }
      }
    for (const auto& [r, track] : main_tracks_) {
      if (const auto* t = run_.track(track)) out.tracks.push_back(*t);
      auto& rows = out.ranges[track];
      std::vector<const RankStep*> steps;  // this rank's replayed steps, by start
      for (const auto& [step, ranks] : steps_) steps.push_back(&ranks.at(r));
      std::sort(steps.begin(), steps.end(), [](auto* a, auto* b) { return a->row->start_ns < b->row->start_ns; });
      std::size_t k = 0;
      for (const auto& row : run_.ranges_of(track)) {  // by start, as the steps
        while (k < steps.size() && steps[k]->row->end_ns <= row.start_ns) ++k;
        if (k == steps.size()) break;
        const RankStep* rs = steps[k];
        if (row.start_ns < rs->row->start_ns) continue;
        store::RangeRow m = row;
        if (row.category == static_cast<std::uint8_t>(store::Category::step)) {
          m.start_ns = rs->start2;
          m.end_ns = rs->end2;
        } else {
          m.start_ns = map_time(*rs, row.start_ns);
          m.end_ns = std::max(m.start_ns, map_time(*rs, row.end_ns));
          for (const auto& op : rs->ops)
            if (op.row == &row) {
              m.start_ns = op.start2;
              m.end_ns = op.end2;
            }
        }
        rows.push_back(m);
      }
      store::sort_by_start(rows);
    }
    return out;
  }

 private:
  void gather_steps() {
    if (!run_.pipeline_spans.empty())
      throw AnalysisError(run_.path.string() + ": a pipeline run; wb whatif replays data-parallel steps");
    std::map<int, std::set<int>> ranks_of_step;
    std::set<int> ranks;
    for (const auto& s : run_.steps) {
      ranks_of_step[s.step].insert(s.rank);
      ranks.insert(s.rank);
    }
    for (int r : ranks) main_tracks_[r] = run_.main_track(r);
    std::map<std::pair<int, int>, std::vector<const store::AllreduceRow*>> comm;
    for (const auto& a : run_.allreduces) comm[{a.rank, a.step}].push_back(&a);
    for (const auto& s : run_.steps) {
      if (ranks_of_step[s.step].size() != ranks.size() || main_tracks_[s.rank] == 0) continue;
      RankStep rs;
      rs.row = &s;
      rs.comm = comm[{s.rank, s.step}];
      std::sort(rs.comm.begin(), rs.comm.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
      steps_[s.step][s.rank] = std::move(rs);
    }
    std::erase_if(steps_, [&](const auto& kv) { return kv.second.size() != ranks.size(); });
    if (steps_.empty()) throw AnalysisError(run_.path.string() + ": no step that every rank recorded on its main thread");
    for (const auto& [step, by_rank] : steps_)
      for (const auto& [r, rs] : by_rank)
        for (const auto* a : rs.comm)
          for (std::size_t c = 0; c < changes_.size(); ++c)
            if (matches_collective(changes_[c], r, a->bucket)) ++matched_[c];
  }

  // Each step's ops and the changed ranges inside them.
  void build_ops() {
    for (auto& [step, ranks] : steps_)
      for (auto& [r, rs] : ranks) {
        const auto& rows = run_.ranges_of(main_tracks_[r]);
        auto first = std::lower_bound(rows.begin(), rows.end(), rs.row->start_ns,
                                      [](const store::RangeRow& a, std::int64_t t) { return a.start_ns < t; });
        std::int64_t prev_end = rs.row->start_ns;
        for (auto it = first; it != rows.end() && it->start_ns < rs.row->end_ns; ++it) {
          if (it->category == static_cast<std::uint8_t>(store::Category::step) || it->depth != 1) continue;
          Op op;
          op.row = &*it;
          const std::string& name = run_.name(it->name);
          if (name == kWaitName && !rs.comm.empty()) op.kind = Op::comm_wait;
          else if (name == kDataWaitName && it->category == static_cast<std::uint8_t>(store::Category::data)) {
            op.kind = Op::data_wait;
            rs.has_data_wait = true;
          }
          op.gap = it->start_ns - prev_end;
          prev_end = std::max(prev_end, it->end_ns);
          add_subs(r, op, it, rows.end());
          rs.ops.push_back(std::move(op));
        }
      }
  }

  // The outermost range of each change within the op (the op itself included).
  void add_subs(int rank, Op& op, std::vector<store::RangeRow>::const_iterator it,
                std::vector<store::RangeRow>::const_iterator end) {
    std::vector<std::int64_t> covered(changes_.size(), kNever);
    for (; it != end && it->start_ns < op.row->end_ns; ++it) {
      if (it->depth < op.row->depth || (it->depth == op.row->depth && it->start_ns != op.row->start_ns)) continue;
      for (std::size_t c = 0; c < changes_.size(); ++c) {
        if (it->start_ns < covered[c] || !matches_range(changes_[c], run_, rank, *it)) continue;
        covered[c] = it->end_ns;
        const std::int64_t d = change_of(changes_[c], it->end_ns - it->start_ns);
        op.subs.push_back(Sub{it->start_ns, it->end_ns, d});
        op.delta += d;
        ++matched_[c];
      }
    }
    std::sort(op.subs.begin(), op.subs.end(), [](const Sub& a, const Sub& b) { return a.start < b.start; });
  }

  // Each rank's data workers' batches, when they can stand for the steps' batches one for one.
  void build_pipelines() {
    const bool wanted = std::any_of(changes_.begin(), changes_.end(),
                                    [](const auto& c) { return c.target == WhatIfChange::Target::batches; });
    std::string why;
    for (const auto& [r, track] : main_tracks_) {
      InputPipeline p;
      std::vector<const store::RangeRow*> batches;
      for (const auto& t : run_.tracks) {
        if (t.rank != r || t.kind != store::TrackKind::thread || run_.name(t.name).rfind("data-worker", 0) != 0) continue;
        bool any = false;
        for (const auto& row : run_.ranges_of(t.id))
          if (row.depth == 0 && run_.name(row.name) == "batch") {
            batches.push_back(&row);
            any = true;
          }
        p.workers += any ? 1 : 0;
      }
      std::sort(batches.begin(), batches.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
      std::vector<const store::StepRow*> rank_steps;
      for (const auto& s : run_.steps)
        if (s.rank == r) rank_steps.push_back(&s);
      std::sort(rank_steps.begin(), rank_steps.end(), [](auto* a, auto* b) { return a->step < b->step; });
      const auto prefetch = run_.config.find("prefetch");
      if (prefetch == run_.config.end() || !prefetch->is_number_integer() || prefetch->get<int>() < 1) {
        why = "the run records no prefetch depth (config prefetch)";
        break;
      }
      if (batches.size() < rank_steps.size() || p.workers == 0) {
        why = concat("rank ", std::to_string(r), " recorded ", std::to_string(batches.size()), " data-worker batches for ",
                     std::to_string(rank_steps.size()), " steps (data on the main thread?)");
        break;
      }
      p.prefetch = prefetch->get<int>();
      for (const auto* b : batches) {
        p.recorded_start.push_back(b->start_ns);
        p.dur.push_back(b->end_ns - b->start_ns);
        std::int64_t d = b->end_ns - b->start_ns;
        for (std::size_t c = 0; c < changes_.size(); ++c) {
          const auto& ch = changes_[c];
          if (ch.target != WhatIfChange::Target::batches || (ch.rank && *ch.rank != r)) continue;
          d += change_of(ch, b->end_ns - b->start_ns);
          ++matched_[c];
        }
        p.dur2.push_back(std::max<std::int64_t>(0, d));
      }
      p.release.assign(batches.size(), kNever);
      p.pop.assign(batches.size(), kNever);
      p.after_avail.assign(batches.size(), 0);
      for (std::size_t k = 0; k < rank_steps.size(); ++k) {
        p.release[k] = rank_steps[k]->end_ns;
        auto st = steps_.find(rank_steps[k]->step);
        if (st != steps_.end()) st->second.at(r).batch = static_cast<int>(k);
      }
      pipelines_[r] = std::move(p);
    }
    if (!why.empty()) {
      pipelines_.clear();
      for (auto& [step, ranks] : steps_)
        for (auto& [r, rs] : ranks) rs.batch = -1;
      if (wanted) throw AnalysisError(concat("a 'data' change cannot be replayed: ", why, "; change the data_wait ranges with class:data instead"));
    }
  }

  // Runs rank r's ops from index i to the end of the step, or with `to_wait` until its wait for the
  // allreduces (whose index it returns): that wait needs the step's collectives.
  std::size_t run_ops(int r, RankStep& rs, std::size_t i, bool to_wait) {
    std::int64_t t = i == 0 ? rs.start2 : rs.ops[i - 1].end2;
    if (i == 0 && rs.batch >= 0 && !rs.has_data_wait) {
      // wb-train records a data wait only when it waited: the batch was there when the step began, and
      // when the replayed batch is later, the step waits for it first.
      InputPipeline& p = pipelines_.at(r);
      t = std::max(t, p.available(rs.batch, changed_));
      p.pop[static_cast<std::size_t>(rs.batch)] = t;
    }
    for (; i < rs.ops.size(); ++i) {
      Op& op = rs.ops[i];
      const std::int64_t delta = changed_ ? op.delta : 0;
      op.start2 = t + op.gap;
      if (op.kind == Op::comm_wait) {
        if (to_wait) {
          op.end2 = std::numeric_limits<std::int64_t>::max();  // not known before the collectives
          return i;
        }
        std::int64_t last = kNever, last2 = kNever;
        for (std::size_t k = 0; k < rs.comm.size(); ++k) {
          last = std::max(last, rs.comm[k]->end_ns);
          last2 = std::max(last2, rs.comm_end2[k]);
        }
        const std::int64_t after = std::max<std::int64_t>(0, op.row->end_ns - std::max(op.row->start_ns, last));
        op.end2 = std::max(op.start2, last2) + after + delta;
      } else if (op.kind == Op::data_wait && rs.batch >= 0) {
        InputPipeline& p = pipelines_.at(r);
        const auto k = static_cast<std::size_t>(rs.batch);
        const std::int64_t avail = p.available(rs.batch, changed_);
        if (!changed_) p.after_avail[k] = std::max<std::int64_t>(0, op.row->end_ns - std::max(op.row->start_ns, avail));
        op.end2 = std::max(op.start2, avail) + p.after_avail[k] + delta;
        p.pop[k] = op.end2;
      } else {
        op.end2 = op.start2 + op.dur() + delta;
      }
      op.end2 = std::max(op.end2, op.start2);
      t = op.end2;
    }
    rs.end2 = (rs.ops.empty() ? rs.start2 : t) + (rs.row->end_ns - (rs.ops.empty() ? rs.row->start_ns : rs.ops.back().row->end_ns));
    if (rs.batch >= 0) pipelines_.at(rs.row->rank).release[static_cast<std::size_t>(rs.batch)] = rs.end2;
    return i;
  }

  std::int64_t collective_change(int rank, int bucket, std::int64_t dur) {
    std::int64_t d = dur;
    if (!changed_) return d;
    for (const auto& c : changes_)
      if (matches_collective(c, rank, bucket)) d += change_of(c, dur);
    return std::max<std::int64_t>(0, d);
  }

  // The step's collectives: each joins on a rank when its gradients are ready there (or the rank's
  // previous collective ends) and starts when the last rank has joined.
  void collectives(std::map<int, RankStep>& ranks) {
    for (auto& [r, rs] : ranks) {
      rs.comm_end2.assign(rs.comm.size(), 0);
      rs.comm_start2.assign(rs.comm.size(), 0);
      rs.comm_ready2.assign(rs.comm.size(), 0);
    }
    RankStep& lead = ranks.begin()->second;
    for (std::size_t k = 0; k < lead.comm.size(); ++k) {
      const int bucket = lead.comm[k]->bucket;
      std::int64_t last_join = kNever, last_start = kNever;
      std::map<int, std::size_t> index;
      for (auto& [r, rs] : ranks) {
        std::size_t i = 0;
        while (i < rs.comm.size() && rs.comm[i]->bucket != bucket) ++i;
        if (i == rs.comm.size())
          throw AnalysisError(concat("step ", std::to_string(rs.row->step), ": rank ", std::to_string(r),
                                     " recorded no collective for bucket ", std::to_string(bucket)));
        index[r] = i;
        const auto& a = *rs.comm[i];
        const std::int64_t prev_end = i > 0 ? rs.comm[i - 1]->end_ns : kNever;
        const std::int64_t prev_end2 = i > 0 ? rs.comm_end2[i - 1] : kNever;
        const std::int64_t handoff = std::max<std::int64_t>(0, a.start_ns - std::max(a.ready_ns, prev_end));
        rs.comm_ready2[i] = map_time(rs, a.ready_ns);
        // It joins once its gradients are ready and its previous collective is done, then hands off.
        rs.comm_start2[i] = std::max(rs.comm_ready2[i], prev_end2) + handoff;
        last_join = std::max(last_join, rs.comm_start2[i]);
        last_start = std::max(last_start, a.start_ns);
      }
      for (auto& [r, rs] : ranks) {
        const std::size_t i = index[r];
        const std::int64_t dur = std::max<std::int64_t>(0, rs.comm[i]->end_ns - last_start);
        rs.comm_end2[i] = last_join + collective_change(r, bucket, dur);
      }
    }
  }

  const RunData& run_;
  const std::vector<WhatIfChange>& changes_;
  std::vector<std::int64_t> matched_;
  std::map<int, std::uint32_t> main_tracks_;
  std::map<int, std::map<int, RankStep>> steps_;  // step -> rank -> its replay
  std::map<int, InputPipeline> pipelines_;
  bool changed_ = false;
};

}  // namespace

WhatIfChange parse_scale_change(std::string_view text) {
  const std::size_t colon = split_value(text, "FACTOR, e.g. layer3.*:1.5");
  const double f = parse_number(text, text.substr(colon + 1), "a factor");
  if (!(f >= 0.0)) bad(text, "expected a factor >= 0");
  WhatIfChange c = parse_pattern(text, text.substr(0, colon));
  c.factor = f;
  return c;
}

WhatIfChange parse_add_change(std::string_view text) {
  const std::size_t colon = split_value(text, "+US, e.g. rank:1&layer3.0.conv2:+20000");
  const double us = parse_number(text, text.substr(colon + 1), "microseconds such as +20000 or -500");
  WhatIfChange c = parse_pattern(text, text.substr(0, colon));
  c.add_ns = static_cast<std::int64_t>(std::llround(us * 1000.0));
  return c;
}

WhatIf what_if(const RunData& run, const std::vector<WhatIfChange>& changes, int warmup) {
  Replay replay(run, changes);
  WhatIf out;
  out.steps_used = replay.steps_used(warmup);
  out.measured_step_ns = replay.mean_step(true, warmup).first;
  replay.run(false);
  out.replay_step_ns = replay.mean_step(false, warmup).first;
  replay.run(true);
  const auto [changed, step] = replay.mean_step(false, warmup);
  out.changed_step_ns = changed;
  out.median_step = step;
  out.predicted_step_ns = out.replay_step_ns > 0 ? out.measured_step_ns * changed / out.replay_step_ns : changed;
  out.matched = replay.matched();
  out.batches_replayed = replay.batches_replayed();
  out.replayed = replay.replayed();
  out.before = critical_path(run);
  out.after = critical_path(out.replayed);
  return out;
}

std::string shared_cpu_caveat(const RunData& run) {
  auto meta_int = [&](const std::string& key) -> std::optional<long long> {
    auto it = run.meta.find(key);
    if (it == run.meta.end()) return std::nullopt;
    long long v = 0;
    const auto& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v <= 0) return std::nullopt;
    return v;
  };
  struct Host {
    int ranks = 0;
    long long threads = 0, cpus = 0;
  };
  std::map<std::string, Host> hosts;
  for (const auto& r : run.ranks) {
    const std::string suffix = ".rank" + std::to_string(r.rank);
    const auto cpus = meta_int("host_cpus" + suffix), threads = meta_int("threads" + suffix);
    if (!cpus || !threads) continue;  // a run from before they were recorded, or an imported trace
    Host& h = hosts[r.host];
    ++h.ranks;
    h.threads += *threads;
    h.cpus = std::max(h.cpus, *cpus);
  }
  for (const auto& [name, h] : hosts) {
    if (h.threads <= h.cpus) continue;
    return concat(std::to_string(h.ranks), h.ranks == 1 ? " rank" : " ranks", " on host ", name, " ask for ",
                  std::to_string(h.threads), " compute threads on its ", std::to_string(h.cpus),
                  " CPUs: a rank that waits (a slow rank, a sleep) gives its CPUs to the others, which then run "
                  "faster than recorded, and the replay keeps every op's recorded time, so it over-predicts what "
                  "one rank's slowdown costs");
  }
  return {};
}

}  // namespace wb::analysis
