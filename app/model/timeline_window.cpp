#include "app/model/timeline_window.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "app/model/run_model.hpp"
#include "store/reader.hpp"

namespace wb::app_model {

namespace {

// The level of `t` whose bucket is the narrowest at least `ns` wide (its top level when none is).
int level_at_least(const store::SummaryTrack& t, double ns) {
  int level = 0;
  while (level + 1 < t.levels && static_cast<double>(t.width(level)) < ns) ++level;
  return level;
}

// The coarse level of a (track, depth): at most kCoarseBuckets buckets (the top level has one).
int coarse_level(const store::SummaryTrack& t) {
  const int below_top = static_cast<int>(std::log2(static_cast<double>(TimelineWindow::kCoarseBuckets)));
  return std::max(0, t.levels - 1 - below_top);
}

std::int64_t pow2_at_least(double ns) {
  std::int64_t p = 1;
  while (static_cast<double>(p) < ns && p < (std::int64_t{1} << 62)) p <<= 1;
  return p;
}

}  // namespace

TimelineWindow::TimelineWindow(const std::filesystem::path& path, std::shared_ptr<const RunModel> lean)
    : path_(path), lean_(std::move(lean)) {
  for (const auto& t : lean_->run.tracks) rank_of_[t.id] = t.rank;
  store::Reader reader(path_);
  tracks_ = store::summary_tracks(reader.db());
  auto coarse = std::make_shared<SummaryView>();
  std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = std::numeric_limits<std::int64_t>::min();
  for (std::size_t i = 0; i < tracks_.size(); ++i) {
    const auto& t = tracks_[i];
    info_[{t.track, t.depth}] = i;
    depths_[t.track] = std::max(depths_[t.track], t.depth + 1);
    rows_ += t.rows;
    const int level = coarse_level(t);
    auto buckets = store::summary_buckets(reader.db(), t, level, std::numeric_limits<std::int64_t>::min() / 4,
                                          std::numeric_limits<std::int64_t>::max() / 4);
    if (t.rows > 0) {
      lo = std::min(lo, t.first_ns);
      hi = std::max(hi, t.last_ns);
    }
    coarse->bucket_ns = std::max(coarse->bucket_ns, t.width(level));
    coarse->buckets[{t.track, t.depth}] = std::move(buckets);
  }
  extent_ = {lo, hi};
  // The depths held whole: every range of them is among the track's long ones.
  for (const auto& entry : depths_) {
    const std::uint32_t track = entry.first;
    const auto* first = info(track, 0);
    if (first == nullptr || first->long_ns == 0) continue;
    auto rows = store::summary_long_rows(reader.db(), track);
    std::map<int, std::int64_t> per_depth;
    for (const auto& r : rows) ++per_depth[r.depth];
    for (const auto& [depth, count] : per_depth)
      if (const auto* s = info(track, depth); s && s->rows == count) whole_.insert({track, depth});
    std::erase_if(rows, [&](const store::RangeRow& r) { return !held_whole(track, r.depth); });
    if (!rows.empty()) held_[track] = std::move(rows);
  }
  coarse->t0_ns = extent_.first;
  coarse->t1_ns = extent_.second;
  coarse_ = std::move(coarse);
  thread_ = std::thread([this] { run(); });
}

TimelineWindow::~TimelineWindow() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

const store::SummaryTrack* TimelineWindow::info(std::uint32_t track, int depth) const {
  auto it = info_.find({track, depth});
  return it == info_.end() ? nullptr : &tracks_[it->second];
}

const std::vector<store::RangeRow>& TimelineWindow::held(std::uint32_t track) const {
  static const std::vector<store::RangeRow> none;
  auto it = held_.find(track);
  return it == held_.end() ? none : it->second;
}

int TimelineWindow::depths(std::uint32_t track) const {
  auto it = depths_.find(track);
  return it == depths_.end() ? 0 : it->second;
}

namespace {
// The rows of the buckets that overlap [t0, t1].
std::int64_t rows_in(const std::vector<store::SummaryBucket>& buckets, std::int64_t t0_ns, std::int64_t t1_ns) {
  auto first = std::lower_bound(buckets.begin(), buckets.end(), t0_ns,
                                [](const store::SummaryBucket& b, std::int64_t t) { return b.end_ns <= t; });
  std::int64_t n = 0;
  for (auto it = first; it != buckets.end() && it->start_ns <= t1_ns; ++it) n += it->count;
  return n;
}
}  // namespace

std::int64_t TimelineWindow::estimate_rows(std::int64_t t0_ns, std::int64_t t1_ns) const {
  std::int64_t n = 0;
  for (const auto& [key, buckets] : coarse_->buckets) n += rows_in(buckets, t0_ns, t1_ns);
  return n;
}

std::int64_t TimelineWindow::estimate_rows(const RankSpans& spans) const {
  std::int64_t n = 0;
  for (const auto& [key, buckets] : coarse_->buckets) {
    auto rank = rank_of_.find(key.first);
    if (rank == rank_of_.end()) continue;
    if (auto span = spans.find(rank->second); span != spans.end())
      n += rows_in(buckets, span->second.first, span->second.second);
  }
  return n;
}

TimelineWindow::Request TimelineWindow::plan(double t0_ns, double t1_ns, double width_px) const {
  Request r;
  r.want_t0 = static_cast<std::int64_t>(std::floor(t0_ns));
  r.want_t1 = static_cast<std::int64_t>(std::ceil(t1_ns));
  const std::int64_t span = std::max<std::int64_t>(r.want_t1 - r.want_t0, 1);
  r.ns_per_px = static_cast<double>(span) / std::max(width_px, 1.0);
  if (estimate_rows(r.want_t0, r.want_t1) <= kRowBudget) {
    r.rows = true;
    r.t0_ns = r.want_t0 - span / 2;  // half a window either side, so a pan does not wait at once
    r.t1_ns = r.want_t1 + span / 2;
  } else {
    r.level = pow2_at_least(r.ns_per_px);  // for a summary: the bucket width wanted
    r.t0_ns = r.want_t0 - span / 2;
    r.t1_ns = r.want_t1 + span / 2;
  }
  return r;
}

bool TimelineWindow::satisfied_locked(const Request& r) const {
  if (r.rows) return rows_span_.first <= r.want_t0 && rows_span_.second >= r.want_t1;
  if (static_cast<double>(coarse_->bucket_ns) <= 2.0 * r.ns_per_px) return true;  // the coarse levels are fine enough
  return fine_ && fine_level_ == r.level && fine_->t0_ns <= r.want_t0 && fine_->t1_ns >= r.want_t1;
}

bool TimelineWindow::shows(double t0_ns, double t1_ns, double width_px) const {
  const Request r = plan(t0_ns, t1_ns, width_px);
  std::lock_guard lock(mutex_);
  return satisfied_locked(r);
}

void TimelineWindow::want(double t0_ns, double t1_ns, double width_px) {
  const Request r = plan(t0_ns, t1_ns, width_px);
  auto covers = [&](const Request& q) {
    return q.rows == r.rows && q.t0_ns <= r.want_t0 && q.t1_ns >= r.want_t1 && (q.rows || q.level == r.level);
  };
  std::lock_guard lock(mutex_);
  if (satisfied_locked(r)) return;
  if ((in_flight_ && covers(*in_flight_)) || (pending_ && covers(*pending_))) return;
  pending_ = r;
  wake_.notify_all();
}

std::shared_ptr<const RunModel> TimelineWindow::take() {
  std::shared_ptr<RunModel> model;
  {
    std::lock_guard lock(mutex_);
    model = std::exchange(fresh_, nullptr);
  }
  if (model) model->window = shared_from_this();
  return model;
}

std::shared_ptr<const SummaryView> TimelineWindow::summary_for(double t0_ns, double t1_ns, double ns_per_px) const {
  std::lock_guard lock(mutex_);
  if (fine_ && static_cast<double>(fine_->t0_ns) <= t0_ns && static_cast<double>(fine_->t1_ns) >= t1_ns &&
      static_cast<double>(fine_level_) <= 2.0 * ns_per_px && static_cast<double>(fine_level_) * 4.0 >= ns_per_px)
    return fine_;
  return coarse_;
}

void TimelineWindow::run() {
  // One connection for the thread's life, opened at its first request (the file was open a moment ago).
  std::optional<store::Reader> reader;
  for (;;) {
    Request r;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || pending_; });
      if (stop_) return;
      r = *pending_;
      pending_.reset();
      in_flight_ = r;
      busy_.store(true);
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      if (!reader) reader.emplace(path_);
      if (r.rows) read_rows(*reader, r);
      else read_summary(*reader, r);
    } catch (const std::exception& e) {
      // The file was open a moment ago; a read that fails now (deleted, damaged) leaves the summary drawn.
      std::fprintf(stderr, "wb-view: %s: reading the timeline window failed: %s\n", path_.c_str(), e.what());
    }
    last_read_s_.store(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::lock_guard lock(mutex_);
    in_flight_.reset();
    busy_.store(false);
  }
}

void TimelineWindow::read_rows(store::Reader& reader, const Request& r) {
  auto model = read_window(reader, r.t0_ns, r.t1_ns);
  std::lock_guard lock(mutex_);
  fresh_ = std::move(model);
  rows_span_ = {r.t0_ns, r.t1_ns};
}

std::shared_ptr<RunModel> TimelineWindow::read_window(store::Reader& reader, std::int64_t t0_ns,
                                                      std::int64_t t1_ns) const {
  auto model = read_tracks(reader, [&](const store::TrackRow&) { return Span({t0_ns, t1_ns}); }, true);
  model->rows_t0_ns = t0_ns;
  model->rows_t1_ns = t1_ns;
  return model;
}

std::shared_ptr<RunModel> TimelineWindow::read_window(store::Reader& reader, const RankSpans& spans) const {
  return read_tracks(
      reader,
      [&](const store::TrackRow& t) {
        auto it = spans.find(t.rank);
        return it != spans.end() ? Span(it->second) : std::nullopt;
      },
      false);
}

std::shared_ptr<RunModel> TimelineWindow::read_tracks(store::Reader& reader,
                                                      const std::function<Span(const store::TrackRow&)>& span,
                                                      bool with_levels) const {
  auto model = copy_without_rows(lean_);
  std::map<std::uint32_t, std::int64_t> longest, long_ns;
  for (const auto& t : tracks_) longest[t.track] = std::max(longest[t.track], t.longest_ns), long_ns[t.track] = t.long_ns;
  for (const auto& t : lean_->run.tracks) {
    const auto window = span(t);
    if (!window) continue;
    const auto [t0_ns, t1_ns] = *window;
    if (t.kind == store::TrackKind::thread) {
      // Ranges starting at most long_ns before the window through the key, and the track's few longer
      // ones that reach into it (summary_long): never a scan back by the longest range of all.
      const std::int64_t near = std::min(long_ns[t.id], longest[t.id]);
      reader.known_longest(t.id, near, 0);
      auto rows = reader.ranges(t.id, t0_ns, t1_ns);
      if (near < longest[t.id])
        for (std::int64_t start :
             store::summary_long_starts(reader.db(), t.id, t0_ns - longest[t.id], t0_ns - near, t0_ns))
          for (const auto& row : reader.ranges_starting(t.id, start))
            if (row.end_ns >= t0_ns) rows.push_back(row);
      // The depths held whole come whole (so they draw outside the window too), with their steps and ids.
      const auto& held = this->held(t.id);
      if (!held.empty()) {
        std::set<std::pair<std::int64_t, int>> in_window;
        for (const auto& row : rows)
          if (held_whole(t.id, row.depth)) in_window.insert({row.start_ns, row.depth * 16 + row.category});
        for (const auto& row : held)
          if (!in_window.count({row.start_ns, row.depth * 16 + row.category})) rows.push_back(row);
      }
      store::sort_by_start(rows);
      if (with_levels) model->levels[t.id] = build_levels(rows);
      model->run.ranges[t.id] = std::move(rows);
    } else if (t.kind == store::TrackKind::stream) {
      reader.known_longest(t.id, 0, longest.count(t.id) ? longest.at(t.id) : 0);
      auto rows = reader.kernels(t.id, t0_ns, t1_ns);
      if (with_levels) model->levels[t.id] = build_levels(rows);
      model->run.kernels[t.id] = std::move(rows);
    }
  }
  return model;
}

std::shared_ptr<const RunModel> TimelineWindow::sample() const {
  std::lock_guard lock(mutex_);
  return sample_;
}

std::string TimelineWindow::sample_status() const {
  std::lock_guard lock(mutex_);
  return sample_status_;
}

void TimelineWindow::set_sample(std::shared_ptr<const RunModel> model, std::string status) {
  std::lock_guard lock(mutex_);
  sample_ = std::move(model);
  sample_status_ = std::move(status);
}

void TimelineWindow::read_summary(store::Reader& reader, const Request& r) {
  auto view = std::make_shared<SummaryView>();
  view->t0_ns = r.t0_ns;
  view->t1_ns = r.t1_ns;
  for (const auto& t : tracks_) {
    const int level = level_at_least(t, static_cast<double>(r.level));
    view->bucket_ns = std::max(view->bucket_ns, t.width(level));
    view->buckets[{t.track, t.depth}] = store::summary_buckets(reader.db(), t, level, r.t0_ns, r.t1_ns);
  }
  std::lock_guard lock(mutex_);
  fine_ = std::move(view);
  fine_level_ = r.level;
}

}  // namespace wb::app_model
