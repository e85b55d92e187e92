#include "store/summary.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "store/one_line.hpp"
#include "store/range_table.hpp"

namespace wb::store {

namespace {

constexpr std::int64_t kMinBucketNs = 1024;       // level 0's narrowest bucket, about 1 us
constexpr std::size_t kMaxBuckets = 65536;        // level 0's widest span in buckets
constexpr std::int64_t kRowsPerBucket = 32;       // level 0's stored buckets hold at least this many rows on average

// One bucket while building. The name is the weighted majority candidate (Misra-Gries with one counter):
// a name holding more than half of the busy time is always the one kept.
struct Cell {
  std::int64_t count = 0;
  std::int64_t busy = 0;
  std::uint32_t name = 0;
  int category = 0;  // of the name kept
  std::int64_t score = 0;
  bool used() const { return count > 0 || busy > 0; }
  void vote(std::uint32_t n, int cat, std::int64_t weight) {
    if (n == name && cat == category) score += weight;
    else if (score >= weight) score -= weight;
    else name = n, category = cat, score = weight - score;
  }
};

Cell merge(const Cell& a, const Cell& b) {
  if (!b.used()) return a;
  if (!a.used()) return b;
  Cell c;
  c.count = a.count + b.count;
  c.busy = a.busy + b.busy;
  const bool same = a.name == b.name && a.category == b.category;
  const Cell& win = a.score >= b.score ? a : b;
  c.name = win.name;
  c.category = win.category;
  c.score = same ? a.score + b.score : (a.score >= b.score ? a.score - b.score : b.score - a.score);
  return c;
}

std::vector<Cell> halve(const std::vector<Cell>& cells) {
  std::vector<Cell> out((cells.size() + 1) / 2);
  for (std::size_t i = 0; i < cells.size(); ++i) out[i / 2] = merge(out[i / 2], cells[i]);
  return out;
}

// A stored bucket, before it is written.
struct BucketRow {
  std::uint32_t track;
  int depth;
  int level;
  std::int64_t bucket;
  Cell cell;
};

std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Level 0 of one (track, depth), fed rows in start order. The bucket width doubles whenever a row
// would fall past kMaxBuckets.
class DepthBuilder {
 public:
  void add(std::int64_t start, std::int64_t end, std::uint32_t name, int category) {
    if (rows_ == 0) origin_ = floor_div(start, kMinBucketNs) * kMinBucketNs, first_ = start, last_ = end;
    ++rows_;
    end = std::max(end, start);
    longest_ = std::max(longest_, end - start);
    first_ = std::min(first_, start);
    last_ = std::max(last_, end);
    while (static_cast<std::size_t>((std::max(end - 1, start) - origin_) / width_) >= kMaxBuckets) coarsen();
    const auto first = static_cast<std::size_t>((start - origin_) / width_);
    const auto last = static_cast<std::size_t>((std::max(end - 1, start) - origin_) / width_);
    if (cells_.size() <= last) cells_.resize(last + 1);
    Cell& head = cells_[first];
    ++head.count;
    if (head.count == 1 && head.score == 0) head.name = name, head.category = category;
    for (std::size_t b = first; b <= last && end > start; ++b) {
      const std::int64_t b0 = origin_ + static_cast<std::int64_t>(b) * width_;
      const std::int64_t inside = std::min(end, b0 + width_) - std::max(start, b0);
      cells_[b].busy += inside;
      cells_[b].vote(name, category, inside);
    }
  }

  // Coarsens until the stored buckets hold kRowsPerBucket rows on average, then adds every level's stored
  // buckets to `out`.
  SummaryTrack finish(std::vector<BucketRow>& out, std::uint32_t track, int depth) {
    auto used = [](const std::vector<Cell>& v) {
      return static_cast<std::int64_t>(std::count_if(v.begin(), v.end(), [](const Cell& c) { return c.used(); }));
    };
    while (cells_.size() > 1 && used(cells_) * kRowsPerBucket > rows_) coarsen();
    SummaryTrack t{track, depth, origin_, width_, 0, rows_, longest_, first_, last_};
    std::vector<Cell> level = std::move(cells_);
    for (int l = 0;; ++l) {
      for (std::size_t b = 0; b < level.size(); ++b)
        if (level[b].used()) out.push_back({track, depth, l, static_cast<std::int64_t>(b), level[b]});
      t.levels = l + 1;
      if (level.size() <= 1) break;
      level = halve(level);
    }
    return t;
  }

 private:
  void coarsen() {
    cells_ = halve(cells_);
    width_ *= 2;
  }

  std::int64_t origin_ = 0;
  std::int64_t width_ = kMinBucketNs;
  std::int64_t rows_ = 0;
  std::int64_t longest_ = 0;
  std::int64_t first_ = 0, last_ = 0;
  std::vector<Cell> cells_;
};

// A track's longest ranges: those of at least `threshold` ns, the threshold doubling (from 1 us) whenever
// more than kLongRows are kept, so a window read need not scan back by the longest range of all
// (TimelineWindow: rows starting within `threshold` before the window, and these).
constexpr std::size_t kLongRows = 4096;
struct LongRow {
  std::int64_t start, end;
  std::int64_t kind;  // range_data.kind
  std::uint32_t name;
};
class LongRows {
 public:
  void add(std::int64_t start, std::int64_t end, std::int64_t kind, std::uint32_t name) {
    if (end - start < threshold_) return;
    rows_.push_back({start, end, kind, name});
    if (rows_.size() <= 2 * kLongRows) return;
    while (rows_.size() > kLongRows) {
      threshold_ *= 2;
      std::erase_if(rows_, [&](const LongRow& r) { return r.end - r.start < threshold_; });
    }
  }
  std::int64_t threshold() const { return threshold_; }
  const std::vector<LongRow>& rows() const { return rows_; }

 private:
  std::int64_t threshold_ = kMinBucketNs;
  std::vector<LongRow> rows_;
};

constexpr const char* kCreate =
    "CREATE TABLE IF NOT EXISTS summary_track (track_id INTEGER NOT NULL, depth INTEGER NOT NULL, "
    "origin_ns INTEGER NOT NULL, bucket_ns INTEGER NOT NULL, levels INTEGER NOT NULL, rows INTEGER NOT NULL, "
    "longest_ns INTEGER NOT NULL, first_ns INTEGER NOT NULL, last_ns INTEGER NOT NULL, long_ns INTEGER NOT NULL, PRIMARY KEY (track_id, depth)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS summary_bucket (track_id INTEGER NOT NULL, depth INTEGER NOT NULL, "
    "level INTEGER NOT NULL, bucket INTEGER NOT NULL, count INTEGER NOT NULL, busy_ns INTEGER NOT NULL, "
    "name_id INTEGER NOT NULL, category INTEGER NOT NULL, PRIMARY KEY (track_id, depth, level, bucket)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS summary_long (track_id INTEGER NOT NULL, start_ns INTEGER NOT NULL, kind INTEGER NOT NULL, "
    "end_ns INTEGER NOT NULL, name_id INTEGER NOT NULL, PRIMARY KEY (track_id, start_ns, kind)) WITHOUT ROWID;";

bool table_exists(Db& db, const char* name) {
  auto& st = db.prepare("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1");
  st.bind(1, name);
  bool found = st.step() && st.column_int64(0) > 0;
  st.reset();
  return found;
}


// Feeds one track's rows, as read from the file, to `builder`; false when cancelled.
bool feed_track(Db& db, const TrackRow& t, std::int64_t origin, SummaryBuilder& builder,
                const std::atomic<bool>* cancel) {
  const bool thread = t.kind == TrackKind::thread;
  auto& st = db.prepare(thread ? "SELECT start_ns, dur_ns, kind, name_id FROM range_data WHERE track_id = ?1 ORDER BY start_ns, kind"
                               : "SELECT start_ns, end_ns - start_ns, kind, name_id FROM kernel WHERE track_id = ?1 ORDER BY start_ns");
  st.bind(1, t.id);
  const std::int64_t shift = thread ? origin : 0;
  std::int64_t n = 0;
  while (st.step()) {
    if ((++n & 0xFFFFF) == 0 && cancel && cancel->load()) {
      st.reset();
      return false;
    }
    const std::int64_t start = st.column_int64(0) + shift;
    builder.add(t.id, thread, start, start + st.column_int64(1), st.column_int64(2),
                static_cast<std::uint32_t>(st.column_int64(3)));
  }
  st.reset();
  builder.end_track(t.id);
  return true;
}

}  // namespace

bool has_summary(Db& db) {
  if (!table_exists(db, "summary_track") || !table_exists(db, "summary_bucket")) return false;
  auto& st = db.prepare("SELECT value FROM meta WHERE key = 'summary_version'");
  bool ok = st.step() && st.column_text(0) == std::to_string(kSummaryVersion);
  st.reset();
  return ok;
}

namespace {

// One track while its rows go by.
struct LiveTrack {
  std::map<int, DepthBuilder> depths;
  LongRows long_rows;
  std::int64_t last_start = std::numeric_limits<std::int64_t>::min();
  std::int64_t last_kind = std::numeric_limits<std::int64_t>::min();
};

}  // namespace

struct SummaryBuilder::State {
  std::map<std::uint32_t, LiveTrack> live;
  std::set<std::uint32_t> ended;
  // What the ended tracks left to write.
  std::vector<BucketRow> buckets;
  std::vector<SummaryTrack> tracks;
  std::vector<std::pair<std::uint32_t, LongRow>> long_rows;

  // The live track `id`, begun on its first row. A track that had been ended clears `in_order`.
  LiveTrack& track(std::uint32_t id, bool& in_order) {
    auto it = live.find(id);
    if (it == live.end()) {
      it = live.try_emplace(id).first;
      if (!ended.insert(id).second) in_order = false;  // more rows after the track was ended
    }
    return it->second;
  }

  // The order the file is read in: by start, then (ranges) by kind. Past a row out of it the builder is of
  // no use, and takes no more (a start before a track's first would index before its buckets).
  static void add(LiveTrack& t, bool& in_order, bool thread, std::int64_t start, std::int64_t end, std::int64_t kind,
                  std::uint32_t name) {
    if (start < t.last_start || (thread && start == t.last_start && kind < t.last_kind)) in_order = false;
    if (!in_order) return;
    t.last_start = start;
    t.last_kind = kind;
    const int depth = thread ? static_cast<int>((kind >> 4) & 255) : 0;
    const int category = thread ? static_cast<int>(kind & 15) : static_cast<int>(kind);
    t.depths[depth].add(start, end, name, category);
    if (thread) t.long_rows.add(start, end, kind, name);
  }
};

SummaryBuilder::SummaryBuilder() : s_(std::make_unique<State>()) {}
SummaryBuilder::~SummaryBuilder() = default;

void SummaryBuilder::add(std::uint32_t track, bool thread, std::int64_t start, std::int64_t end, std::int64_t kind,
                         std::uint32_t name) {
  State::add(s_->track(track, in_order_), in_order_, thread, start, end, kind, name);
}

void SummaryBuilder::add(const RangeRow& r) {
  LiveTrack& t = s_->track(r.track, in_order_);
  // Numbered among the ranges of equal key as the file stores them (range_table.hpp): adjacent ones, so
  // the track's last row, whose stored kind is base + kEqualKeyStep * its number.
  const std::int64_t base = range_kind(r);
  const std::int64_t number =
      t.last_start == r.start_ns && t.last_kind % kEqualKeyStep == base ? t.last_kind / kEqualKeyStep + 1 : 0;
  State::add(t, in_order_, true, r.start_ns, r.end_ns, base + kEqualKeyStep * number, r.name);
}

void SummaryBuilder::add(const KernelRow& k) { add(k.track, false, k.start_ns, k.end_ns, k.kind, k.name); }

void SummaryBuilder::end_track(std::uint32_t track) {
  auto it = s_->live.find(track);
  if (it == s_->live.end()) return;
  LiveTrack& t = it->second;
  for (const auto& r : t.long_rows.rows()) s_->long_rows.emplace_back(track, r);
  for (auto& [depth, builder] : t.depths) {
    SummaryTrack s = builder.finish(s_->buckets, track, depth);
    s.long_ns = t.long_rows.threshold();
    s_->tracks.push_back(s);
  }
  s_->live.erase(it);
}

void SummaryBuilder::write(Db& db) {
  while (!s_->live.empty()) end_track(s_->live.begin()->first);
  Transaction tx(db);
  db.exec("DELETE FROM meta WHERE key = 'summary_version'");
  db.exec("DROP TABLE IF EXISTS summary_track; DROP TABLE IF EXISTS summary_bucket; "
          "DROP TABLE IF EXISTS summary_long;");
  db.exec(kCreate);
  auto& insert = db.prepare("INSERT INTO summary_bucket VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  for (const BucketRow& b : s_->buckets) {
    insert.bind(1, b.track).bind(2, b.depth).bind(3, b.level).bind(4, b.bucket).bind(5, b.cell.count);
    insert.bind(6, b.cell.busy).bind(7, b.cell.name).bind(8, b.cell.category).run();
  }
  auto& insert_long = db.prepare("INSERT INTO summary_long VALUES (?1, ?2, ?3, ?4, ?5)");
  for (const auto& [track, r] : s_->long_rows)
    insert_long.bind(1, track).bind(2, r.start).bind(3, r.kind).bind(4, r.end).bind(5, r.name).run();
  auto& insert_track = db.prepare("INSERT INTO summary_track VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)");
  for (const SummaryTrack& s : s_->tracks) {
    insert_track.bind(1, s.track).bind(2, s.depth).bind(3, s.origin_ns).bind(4, s.bucket_ns).bind(5, s.levels);
    insert_track.bind(6, s.rows).bind(7, s.longest_ns).bind(8, s.first_ns).bind(9, s.last_ns).bind(10, s.long_ns);
    insert_track.run();
  }
  db.exec("INSERT OR REPLACE INTO meta(key, value) VALUES ('summary_version', '" + std::to_string(kSummaryVersion) +
          "')");
  tx.commit();
}

bool build_summary(Db& db, const ProgressFn& progress, const std::atomic<bool>* cancel) {
  std::vector<TrackRow> tracks;
  {
    auto& st = db.prepare("SELECT id, rank, kind FROM track WHERE kind IN ('thread', 'stream') ORDER BY id");
    while (st.step()) {
      TrackRow t;
      t.id = static_cast<std::uint32_t>(st.column_int64(0));
      t.rank = static_cast<std::int32_t>(st.column_int64(1));
      t.kind = st.column_text(2) == "thread" ? TrackKind::thread : TrackKind::stream;
      tracks.push_back(t);
    }
    st.reset();
  }
  const std::int64_t origin = time_origin(db);
  SummaryBuilder builder;
  {
    // One read transaction for every track's rows.
    Transaction tx(db);
    for (std::size_t i = 0; i < tracks.size(); ++i) {
      if (progress) progress(i, tracks.size());
      if (cancel && cancel->load()) return false;  // nothing written: the file is as it was
      if (!feed_track(db, tracks[i], origin, builder, cancel)) return false;
    }
    tx.commit();
  }
  builder.write(db);
  if (progress) progress(tracks.size(), tracks.size());
  return true;
}

std::vector<SummaryTrack> summary_tracks(Db& db) {
  std::vector<SummaryTrack> out;
  if (!has_summary(db)) return out;
  auto& st = db.prepare("SELECT track_id, depth, origin_ns, bucket_ns, levels, rows, longest_ns, first_ns, last_ns, long_ns FROM summary_track ORDER BY track_id, depth");
  while (st.step()) {
    SummaryTrack s;
    s.track = static_cast<std::uint32_t>(st.column_int64(0));
    s.depth = static_cast<int>(st.column_int64(1));
    s.origin_ns = st.column_int64(2);
    s.bucket_ns = st.column_int64(3);
    s.levels = static_cast<int>(st.column_int64(4));
    s.rows = st.column_int64(5);
    s.longest_ns = st.column_int64(6);
    s.first_ns = st.column_int64(7);
    s.last_ns = st.column_int64(8);
    s.long_ns = st.column_int64(9);
    if (s.bucket_ns <= 0 || s.levels <= 0 || s.levels > 62)
      throw StoreError(one_line("summary_track: track " + std::to_string(s.track) + " has bucket " +
                                std::to_string(s.bucket_ns) + " ns and " + std::to_string(s.levels) + " levels"));
    out.push_back(s);
  }
  st.reset();
  return out;
}

std::vector<std::int64_t> summary_long_starts(Db& db, std::uint32_t track, std::int64_t from_ns, std::int64_t before_ns,
                                             std::int64_t ends_at_or_after_ns) {
  std::vector<std::int64_t> out;
  auto& st = db.prepare(
      "SELECT DISTINCT start_ns FROM summary_long WHERE track_id = ?1 AND start_ns >= ?2 AND start_ns < ?3 AND end_ns >= ?4 "
      "ORDER BY start_ns");
  st.bind(1, track).bind(2, from_ns).bind(3, before_ns).bind(4, ends_at_or_after_ns);
  while (st.step()) out.push_back(st.column_int64(0));
  st.reset();
  return out;
}

std::vector<RangeRow> summary_long_rows(Db& db, std::uint32_t track) {
  std::vector<RangeRow> out;
  auto& st = db.prepare("SELECT start_ns, end_ns, kind, name_id FROM summary_long WHERE track_id = ?1 ORDER BY start_ns, kind");
  st.bind(1, track);
  while (st.step()) {
    RangeRow r;
    r.track = track;
    r.start_ns = st.column_int64(0);
    r.end_ns = st.column_int64(1);
    r.category = static_cast<std::uint8_t>(st.column_int64(2) & 15);
    r.depth = static_cast<std::uint8_t>((st.column_int64(2) >> 4) & 255);
    r.name = static_cast<std::uint32_t>(st.column_int64(3));
    out.push_back(r);
  }
  st.reset();
  return out;
}

std::vector<SummaryBucket> summary_buckets(Db& db, const SummaryTrack& track, int level, std::int64_t t0_ns,
                                           std::int64_t t1_ns) {
  std::vector<SummaryBucket> out;
  level = std::clamp(level, 0, track.levels - 1);
  const std::int64_t w = track.width(level);
  auto& st = db.prepare(
      "SELECT bucket, count, busy_ns, name_id, category FROM summary_bucket WHERE track_id = ?1 AND depth = ?2 AND level = ?3 "
      "AND bucket >= ?4 AND bucket <= ?5 ORDER BY bucket");
  st.bind(1, track.track).bind(2, track.depth).bind(3, level);
  st.bind(4, floor_div(t0_ns - track.origin_ns, w)).bind(5, floor_div(t1_ns - track.origin_ns, w));
  while (st.step()) {
    SummaryBucket b;
    b.start_ns = track.origin_ns + st.column_int64(0) * w;
    b.end_ns = b.start_ns + w;
    b.count = st.column_int64(1);
    b.busy_ns = st.column_int64(2);
    b.name = static_cast<std::uint32_t>(st.column_int64(3));
    b.category = static_cast<std::uint8_t>(st.column_int64(4));
    out.push_back(b);
  }
  st.reset();
  return out;
}

}  // namespace wb::store
