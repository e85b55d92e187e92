#include "profiler/analysis/steps.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>

#include "profiler/analysis/allreduce.hpp"
#include "profiler/analysis/fc_shard.hpp"
#include "profiler/analysis/sync_bn.hpp"

namespace wb::analysis {

namespace {

using Intervals = std::vector<std::pair<std::int64_t, std::int64_t>>;

bool is_compute(std::uint8_t c) {
  using store::Category;
  return c == static_cast<std::uint8_t>(Category::forward) || c == static_cast<std::uint8_t>(Category::backward) ||
         c == static_cast<std::uint8_t>(Category::loss) || c == static_cast<std::uint8_t>(Category::optimizer);
}

// Durations of the ranges of `category` that no other range of the track contains. A worker records a
// sample's transforms before the batch range that encloses them (the batch ends last), all at the same
// recorded depth, so containment, not the depth column, tells a batch from its transforms.
std::vector<std::int64_t> outermost_durations(const std::vector<store::RangeRow>& rows, std::uint8_t category) {
  std::vector<std::pair<std::int64_t, std::int64_t>> iv;
  for (const auto& r : rows)
    if (r.category == category) iv.emplace_back(r.start_ns, r.end_ns);
  // By start, the longer first on a tie, so an enclosing range comes before what it contains.
  std::sort(iv.begin(), iv.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
  std::vector<std::int64_t> out;
  std::int64_t reach = INT64_MIN;  // the latest end so far
  for (const auto& [start, end] : iv) {
    if (end <= reach) continue;  // inside an earlier range (which starts no later)
    out.push_back(end - start);
    reach = end;
  }
  return out;
}

}  // namespace

std::vector<StepBreakdown> step_breakdown(const RunData& run) {
  std::map<std::pair<int, int>, std::int64_t> exposed;
  for (const auto& c : step_comms(run)) exposed[{c.rank, c.step}] = c.exposed_ns;
  const std::vector<bool> sync_bn = sync_bn_name_ids(run), fc_shard = fc_shard_name_ids(run);
  const bool have_sync_bn = std::find(sync_bn.begin(), sync_bn.end(), true) != sync_bn.end();
  const bool have_fc_shard = std::find(fc_shard.begin(), fc_shard.end(), true) != fc_shard.end();
  StepIndex index(run);  // each step reads its own rows of its rank's main track, not the whole track
  std::vector<StepBreakdown> out;
  for (const auto& s : run.steps) {
    StepBreakdown b;
    b.rank = s.rank;
    b.step = s.step;
    b.start_ns = s.start_ns;
    b.total_ns = s.end_ns - s.start_ns;
    Intervals compute, sync_bn_iv, fc_shard_iv, data, h2d;
    index.each(s.rank, s.start_ns, s.end_ns, [&](const store::RangeRow& r) {
      const std::pair<std::int64_t, std::int64_t> iv{r.start_ns, r.end_ns};
      if (is_compute(r.category)) compute.push_back(iv);
      if (r.category == static_cast<std::uint8_t>(store::Category::comm)) {
        if (have_sync_bn && r.name < sync_bn.size() && sync_bn[r.name]) sync_bn_iv.push_back(iv);
        if (have_fc_shard && r.name < fc_shard.size() && fc_shard[r.name]) fc_shard_iv.push_back(iv);
      }
      if (r.category == static_cast<std::uint8_t>(store::Category::data)) data.push_back(iv);
      if (r.category == static_cast<std::uint8_t>(store::Category::h2d)) h2d.push_back(iv);
    });
    b.compute_ns = union_length(compute, s.start_ns, s.end_ns);
    // SyncBatchNorm's and the sharded classifier's collectives run inside the modules' ranges and block
    // the training thread: exposed communication, taken out of compute.
    auto blocking = [&](Intervals& sync) {
      const std::int64_t ns = union_length(std::move(sync), s.start_ns, s.end_ns);
      b.compute_ns = std::max<std::int64_t>(0, b.compute_ns - ns);
      return ns;
    };
    if (have_sync_bn) b.sync_bn_ns = blocking(sync_bn_iv);
    if (have_fc_shard) b.fc_shard_ns = blocking(fc_shard_iv);
    b.data_wait_ns = s.data_wait_ns > 0 ? s.data_wait_ns : union_length(std::move(data), s.start_ns, s.end_ns);
    b.h2d_ns = union_length(std::move(h2d), s.start_ns, s.end_ns);
    auto it = exposed.find({s.rank, s.step});
    b.comm_exposed_ns = (it != exposed.end() ? it->second : s.comm_exposed_ns) + b.sync_bn_ns + b.fc_shard_ns;
    b.other_ns = std::max<std::int64_t>(0, b.total_ns - b.compute_ns - b.data_wait_ns - b.comm_exposed_ns);
    out.push_back(b);
  }
  return out;
}

InputBound classify_input_bound(double percent) {
  if (percent > 20.0) return InputBound::highly;
  if (percent >= 5.0) return InputBound::moderately;
  return InputBound::no;
}

const char* input_bound_name(InputBound b) {
  switch (b) {
    case InputBound::highly: return "highly input-bound";
    case InputBound::moderately: return "moderately input-bound";
    default: return "not input-bound";
  }
}

std::vector<Spell> empty_spells(const std::vector<store::CounterRow>& samples) {
  std::vector<Spell> out;
  bool open = false;
  Spell cur;
  for (const auto& s : samples) {
    if (!open && s.value <= 0.0) {
      open = true;
      cur = Spell{};
      cur.start_ns = s.t_ns;
    } else if (open && s.value > 0.0) {
      cur.end_ns = s.t_ns;
      out.push_back(cur);
      open = false;
    }
  }
  if (open && !samples.empty()) {
    cur.end_ns = samples.back().t_ns;
    if (cur.end_ns > cur.start_ns) out.push_back(cur);
  }
  return out;
}

Starvation starvation(const RunData& run, std::size_t top_spells) {
  Starvation st;
  auto breakdown = step_breakdown(run);
  std::map<int, InputBoundStats> per_rank;
  std::int64_t busy_ns = 0;  // step time not spent waiting for input, all ranks
  for (const auto& b : breakdown) {
    InputBoundStats& r = per_rank[b.rank];
    r.rank = b.rank;
    ++r.steps;
    r.step_ns += b.total_ns;
    r.wait_ns += b.data_wait_ns + b.h2d_ns;
    busy_ns += b.total_ns - b.data_wait_ns;
  }
  st.overall.rank = -1;
  for (auto& [rank, r] : per_rank) {
    r.percent = r.step_ns > 0 ? 100.0 * static_cast<double>(r.wait_ns) / static_cast<double>(r.step_ns) : 0.0;
    r.level = classify_input_bound(r.percent);
    st.per_rank.push_back(r);
    st.overall.steps += r.steps;
    st.overall.step_ns += r.step_ns;
    st.overall.wait_ns += r.wait_ns;
  }
  st.overall.percent =
      st.overall.step_ns > 0 ? 100.0 * static_cast<double>(st.overall.wait_ns) / static_cast<double>(st.overall.step_ns) : 0.0;
  st.overall.level = classify_input_bound(st.overall.percent);

  auto step_at = [&](int rank, std::int64_t t) {
    for (const auto& s : run.steps)
      if (s.rank == rank && s.start_ns <= t && t < s.end_ns) return s.step;
    return -1;
  };
  double producer_total = 0.0;
  for (const auto& [id, samples] : run.counters) {
    const store::TrackRow* t = run.track(id);
    if (t == nullptr || samples.empty()) continue;
    if (std::string_view(run.name(t->name)).ends_with(store::kLaunchQueueSuffix)) continue;  // a GPU stream's
    QueueStats q;
    q.track = id;
    q.rank = t->rank;
    q.name = run.name(t->name);
    q.samples = static_cast<std::int64_t>(samples.size());
    double prev = 0.0;
    for (const auto& s : samples) {
      if (s.value <= 0.0) ++q.empty_samples;
      if (s.value > prev) ++q.pushes;
      if (s.value < prev) ++q.pops;
      prev = s.value;
    }
    q.empty_ratio = static_cast<double>(q.empty_samples) / static_cast<double>(q.samples);
    q.flagged = q.empty_ratio > kEmptyQueueWarning;
    std::int64_t span = samples.back().t_ns - samples.front().t_ns;
    if (span > 0) {
      q.producer_per_s = static_cast<double>(q.pushes) * 1e9 / static_cast<double>(span);
      q.consumer_per_s = static_cast<double>(q.pops) * 1e9 / static_cast<double>(span);
    }
    producer_total += q.producer_per_s;
    auto spells = empty_spells(samples);
    for (auto& sp : spells) {
      sp.rank = q.rank;
      sp.step = step_at(q.rank, sp.start_ns);
    }
    std::stable_sort(spells.begin(), spells.end(), [](const Spell& a, const Spell& b) { return a.duration_ns() > b.duration_ns(); });
    st.longest_spells.insert(st.longest_spells.end(), spells.begin(), spells.end());
    if (spells.size() > top_spells) spells.resize(top_spells);
    q.longest_spells = std::move(spells);
    st.queues.push_back(std::move(q));
  }
  std::stable_sort(st.longest_spells.begin(), st.longest_spells.end(),
                   [](const Spell& a, const Spell& b) { return a.duration_ns() > b.duration_ns(); });
  if (st.longest_spells.size() > top_spells) st.longest_spells.resize(top_spells);

  // Workers: the configured count, else the data-worker tracks of one rank.
  std::map<int, int> worker_tracks;
  std::vector<std::int64_t> batch_ns;  // outermost data ranges on worker tracks: one batch each
  std::map<std::string, std::pair<double, std::int64_t>> stage_ns;  // per-sample stage: total ns, count
  for (const auto& t : run.tracks) {
    if (t.kind != store::TrackKind::thread || run.name(t.name).rfind("data-worker", 0) != 0) continue;
    ++worker_tracks[t.rank];
    for (const auto& r : run.ranges_of(t.id)) {
      if (r.category != static_cast<std::uint8_t>(store::Category::data) || r.depth == 0) continue;
      auto& [ns, count] = stage_ns[run.name(r.name)];
      ns += static_cast<double>(r.end_ns - r.start_ns);
      ++count;
    }
    for (std::int64_t d : outermost_durations(run.ranges_of(t.id), static_cast<std::uint8_t>(store::Category::data)))
      batch_ns.push_back(d);
  }
  if (run.config.contains("data_workers") && run.config["data_workers"].is_number_integer()) {
    st.workers = run.config["data_workers"].get<int>();
  } else if (!worker_tracks.empty()) {
    st.workers = worker_tracks.begin()->second;
  }
  if (st.overall.steps > 0 && busy_ns > 0) {
    st.demand_per_s = static_cast<double>(st.overall.steps) * 1e9 / static_cast<double>(busy_ns);
  }
  if (!batch_ns.empty()) {
    double mean = 0;
    for (auto v : batch_ns) mean += static_cast<double>(v);
    mean /= static_cast<double>(batch_ns.size());
    if (mean > 0) st.per_worker_per_s = 1e9 / mean;
  } else if (st.workers > 0 && !st.queues.empty()) {
    // Without per-batch ranges, the measured production rate shared by the workers of one queue.
    st.per_worker_per_s = producer_total / static_cast<double>(st.queues.size()) / st.workers;
  }
  // Every sample goes through decode once (the in-memory sets' uint8 -> float, an image file's decode).
  if (auto it = stage_ns.find("decode"); it != stage_ns.end() && it->second.second > 0) {
    const auto images = static_cast<double>(it->second.second);
    for (const auto& [name, v] : stage_ns) {
      st.per_image_stages.emplace_back(name, v.first / images);
      st.per_image_ns += v.first / images;
    }
    std::stable_sort(st.per_image_stages.begin(), st.per_image_stages.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
  }
  if (st.per_worker_per_s > 0 && st.demand_per_s > 0) {
    st.workers_needed = static_cast<int>(std::ceil(st.demand_per_s / st.per_worker_per_s - 1e-9));
  }
  return st;
}

}  // namespace wb::analysis
