// Reader: the queries the app, the CLI and compare run on a run file. Bulk loads (all ranges of a track)
// read rows with the raw SQLite API (row_decode.hpp); a track's ranges are one walk of range_data's key.
#include "store/reader.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "store/db.hpp"
#include "store/row_decode.hpp"

namespace wb::store {
namespace {

using detail::decoded;
using detail::range_from;
using detail::time_ns;

// A REAL column that the Writer may have given the text 'nan' (SQLite cannot store a NaN REAL).
double real_or_nan(sqlite3_stmt* h, int col) {
  if (sqlite3_column_type(h, col) == SQLITE_TEXT) {
    const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(h, col));
    if (text != nullptr && std::string_view(text) == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  return sqlite3_column_double(h, col);
}

constexpr const char* kKernelColumns =
    "track_id, start_ns, end_ns, name_id, corr_id, kind, grid_x, grid_y, grid_z, block_x, block_y, block_z, bytes, "
    "blocks_per_sm, occupancy, launch_ns, launch_end_ns";

// range_data's rows of track ?1 as `range`'s columns (range_from's positions), times shifted by the
// origin ?2; the caller adds its WHERE, starting with "track_id = ?1".
constexpr const char* kRangeDataSelect =
    "SELECT ?1 AS track, start_ns + ?2 AS start_ns, start_ns + dur_ns + ?2 AS end_ns, name_id, kind & 15 AS category, "
    "(kind >> 4) & 255 AS depth, step, corr_id FROM range_data ";


KernelRow kernel_from(sqlite3_stmt* h) {
  KernelRow k;
  k.track = static_cast<std::uint32_t>(sqlite3_column_int64(h, 0));
  k.start_ns = time_ns(h, 1);
  k.end_ns = time_ns(h, 2);
  k.name = static_cast<std::uint32_t>(sqlite3_column_int64(h, 3));
  k.corr_id = static_cast<std::uint64_t>(sqlite3_column_int64(h, 4));
  k.kind = static_cast<std::uint8_t>(sqlite3_column_int(h, 5));
  for (int i = 0; i < 3; ++i) {
    k.grid[i] = sqlite3_column_int(h, 6 + i);
    k.block[i] = sqlite3_column_int(h, 9 + i);
  }
  k.bytes = sqlite3_column_int64(h, 12);
  k.blocks_per_sm = static_cast<float>(sqlite3_column_double(h, 13));
  k.occupancy = static_cast<float>(sqlite3_column_double(h, 14));
  k.launch_ns = sqlite3_column_int64(h, 15);
  k.launch_end_ns = sqlite3_column_int64(h, 16);
  return k;
}

template <typename Row, typename Decode>
std::vector<Row> collect(Statement& st, Decode decode, const ProgressFn& progress = {}, std::uint64_t total = 0) {
  std::vector<Row> out;
  if (total > 0) out.reserve(total);
  while (st.step()) {
    out.push_back(decoded(st, decode));
    if (progress && (out.size() & 0xFFFFF) == 0) progress(out.size(), total);
  }
  st.reset();
  if (progress) progress(out.size(), total);
  return out;
}

std::vector<std::int64_t> parse_shape(Db& db, std::string_view text) {
  try {
    return shape_from_json(text);
  } catch (const std::invalid_argument& e) {
    throw StoreError(db.path().string() + ": " + e.what());
  }
}

}  // namespace

Reader::Reader(const std::filesystem::path& path)
    : db_(std::make_unique<Db>(open_run(path, OpenMode::read_only))) {}
Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

const std::filesystem::path& Reader::path() const { return db_->path(); }
Db& Reader::db() { return *db_; }

std::map<std::string, std::string> Reader::meta() {
  std::map<std::string, std::string> out;
  auto& st = db_->prepare("SELECT key, value FROM meta");
  while (st.step()) out.emplace(st.column_text(0), st.column_text(1));
  st.reset();
  return out;
}

nlohmann::json Reader::config() {
  auto m = meta();
  auto it = m.find("config_json");
  if (it == m.end() || it->second.empty()) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw StoreError(path().string() + ": meta.config_json is not valid JSON (" + e.what() + ")");
  }
}

bool Reader::complete() {
  auto m = meta();
  auto it = m.find("complete");
  return it != m.end() && it->second == "1";
}

int Reader::world_size() {
  auto m = meta();
  auto it = m.find("world_size");
  if (it == m.end()) return 1;
  try {
    return std::stoi(it->second);
  } catch (const std::exception&) {
    throw StoreError(path().string() + ": meta.world_size is '" + it->second + "', expected an integer");
  }
}

std::vector<RankRow> Reader::ranks() {
  std::vector<RankRow> out;
  auto& st = db_->prepare(
      "SELECT rank, host, device, pid, clock_offset_ns, clock_offset_end_ns, dropped_events FROM rank ORDER BY rank");
  while (st.step()) {
    out.push_back(decoded(st, [&st](sqlite3_stmt* h) {
      return RankRow{static_cast<std::int32_t>(st.column_int64(0)), st.column_text(1), st.column_text(2),
                     st.column_int64(3), time_ns(h, 4), time_ns(h, 5), st.column_int64(6)};
    }));
  }
  st.reset();
  return out;
}

std::vector<TrackRow> Reader::tracks() {
  std::vector<TrackRow> out;
  auto& st = db_->prepare("SELECT id, rank, kind, name_id FROM track ORDER BY id");
  while (st.step()) {
    TrackRow t;
    t.id = static_cast<std::uint32_t>(st.column_int64(0));
    t.rank = static_cast<std::int32_t>(st.column_int64(1));
    try {
      t.kind = track_kind_from_name(st.column_text_view(2));
    } catch (const std::invalid_argument& e) {
      st.reset();
      throw StoreError(path().string() + ": track " + std::to_string(t.id) + ": " + e.what());
    }
    t.name = static_cast<std::uint32_t>(st.column_int64(3));
    out.push_back(t);
  }
  st.reset();
  return out;
}

const std::vector<std::string>& Reader::strings() {
  if (!strings_) {
    // Writers number strings 1..N; a damaged file may hold any id, which must not index or size memory.
    const std::int64_t count = db_->query_int64("SELECT count(*) FROM string");
    const std::int64_t max_id = db_->query_int64("SELECT coalesce(max(id), 0) FROM string");
    const std::int64_t min_id = db_->query_int64("SELECT coalesce(min(id), 1) FROM string");
    if (min_id < 1 || max_id > 2 * count + 1024)
      throw StoreError(path().string() + ": damaged string table (ids " + std::to_string(min_id) + ".." +
                       std::to_string(max_id) + " for " + std::to_string(count) + " strings)");
    std::vector<std::string> out(static_cast<std::size_t>(max_id + 1));
    auto& st = db_->prepare("SELECT id, text FROM string");
    while (st.step()) {
      const std::int64_t id = st.column_int64(0);
      if (id < 1 || id > max_id) {  // a non-integer id reads as 0
        const std::string text = st.column_text(0);
        st.reset();
        throw StoreError(path().string() + ": damaged string table (id '" + text + "')");
      }
      out[static_cast<std::size_t>(id)] = st.column_text(1);
    }
    st.reset();
    strings_ = std::move(out);
  }
  return *strings_;
}

const std::string& Reader::string_at(std::uint32_t id) {
  const auto& s = strings();
  if (id == 0 || id >= s.size())
    throw StoreError(path().string() + ": no string with id " + std::to_string(id));
  return s[id];
}

std::int64_t Reader::time_origin_ns() {
  if (!time_origin_ns_) time_origin_ns_ = time_origin(*db_);
  return *time_origin_ns_;
}

std::vector<RangeRow> Reader::ranges(std::uint32_t track, const ProgressFn& progress) {
  std::uint64_t in_track = 0;
  if (progress) {
    auto& c = db_->prepare("SELECT count(*) FROM range_data WHERE track_id = ?");
    c.bind(1, track);
    in_track = c.step() ? static_cast<std::uint64_t>(c.column_int64(0)) : 0;
    c.reset();
  }
  // range_data's key is (track, start, depth * 16 + category + 4096 x seq): the track's rows come in start order, an
  // enclosing range before the ranges it contains. track_id is bound rather than read from every row
  // (each column read costs at millions of rows); "? AS track" keeps range_from's column positions.
  auto& st = db_->prepare(std::string(kRangeDataSelect) + "WHERE track_id = ?1");
  st.bind(1, track).bind(2, time_origin_ns());
  auto rows = collect<RangeRow>(st, range_from, progress, in_track);
  sort_by_start(rows);
  return rows;
}

std::vector<RangeRow> Reader::ranges(std::uint32_t track, std::int64_t t0_ns, std::int64_t t1_ns) {
  // The key orders by start; a range that overlaps [t0, t1] starts at most its track's longest duration
  // before t0, which bounds the key scan.
  auto it = max_range_ns_.find(track);
  if (it == max_range_ns_.end()) {
    auto& m = db_->prepare("SELECT coalesce(max(dur_ns), 0) FROM range_data WHERE track_id = ?");
    m.bind(1, track);
    std::int64_t longest = m.step() ? m.column_int64(0) : 0;
    m.reset();
    it = max_range_ns_.emplace(track, longest).first;
  }
  const std::int64_t origin = time_origin_ns();
  auto& st = db_->prepare(std::string(kRangeDataSelect) +
                          "WHERE track_id = ?1 AND start_ns >= ?3 AND start_ns <= ?4 AND start_ns + dur_ns >= ?5");
  st.bind(1, track).bind(2, origin).bind(3, t0_ns - it->second - origin).bind(4, t1_ns - origin).bind(5, t0_ns - origin);
  auto rows = collect<RangeRow>(st, range_from);
  sort_by_start(rows);
  return rows;
}

std::vector<RangeRow> Reader::ranges_starting(std::uint32_t track, std::int64_t start_ns) {
  const std::int64_t origin = time_origin_ns();
  auto& st = db_->prepare(std::string(kRangeDataSelect) + "WHERE track_id = ?1 AND start_ns = ?3");
  st.bind(1, track).bind(2, origin).bind(3, start_ns - origin);
  auto rows = collect<RangeRow>(st, range_from);
  sort_by_start(rows);
  return rows;
}

void Reader::known_longest(std::uint32_t track, std::int64_t range_ns, std::int64_t kernel_ns) {
  max_range_ns_[track] = range_ns;
  max_kernel_ns_[track] = kernel_ns;
}

std::vector<KernelRow> Reader::kernels(std::uint32_t track, const ProgressFn& progress) {
  auto& st = db_->prepare(std::string("SELECT ") + kKernelColumns + " FROM kernel WHERE track_id = ? ORDER BY start_ns");
  st.bind(1, track);
  return collect<KernelRow>(st, kernel_from, progress);
}

std::vector<KernelRow> Reader::kernels(std::uint32_t track, std::int64_t t0_ns, std::int64_t t1_ns) {
  auto it = max_kernel_ns_.find(track);
  if (it == max_kernel_ns_.end()) {
    auto& m = db_->prepare("SELECT coalesce(max(end_ns - start_ns), 0) FROM kernel WHERE track_id = ?");
    m.bind(1, track);
    std::int64_t longest = m.step() ? m.column_int64(0) : 0;
    m.reset();
    it = max_kernel_ns_.emplace(track, longest).first;
  }
  auto& st = db_->prepare(std::string("SELECT ") + kKernelColumns +
                          " FROM kernel WHERE track_id = ? AND start_ns >= ? AND start_ns <= ? AND end_ns >= ? "
                          "ORDER BY start_ns");
  st.bind(1, track).bind(2, t0_ns - it->second).bind(3, t1_ns).bind(4, t0_ns);
  return collect<KernelRow>(st, kernel_from);
}

std::vector<KernelRow> Reader::kernels_by_corr(std::uint64_t corr_id) {
  auto& st = db_->prepare(std::string("SELECT ") + kKernelColumns + " FROM kernel WHERE corr_id = ? ORDER BY start_ns");
  st.bind(1, static_cast<std::int64_t>(corr_id));
  return collect<KernelRow>(st, kernel_from);
}

std::vector<CounterRow> Reader::counters(std::uint32_t track) {
  auto& st = db_->prepare("SELECT track_id, t_ns, value FROM counter WHERE track_id = ? ORDER BY t_ns");
  st.bind(1, track);
  std::vector<CounterRow> stored = collect<CounterRow>(st, [](sqlite3_stmt* h) {
    return CounterRow{static_cast<std::uint32_t>(sqlite3_column_int64(h, 0)), time_ns(h, 1),
                      sqlite3_column_double(h, 2)};
  });
  if (!stored.empty()) return stored;
  // A GPU stream's launch queue is not stored (files imported before it was derived hold its samples):
  // it follows from the kernels of the stream of its name, on its rank.
  auto& q = db_->prepare(
      "SELECT s.id FROM track q JOIN string qn ON qn.id = q.name_id "
      "JOIN track s ON s.rank = q.rank AND s.kind = 'stream' JOIN string sn ON sn.id = s.name_id "
      "WHERE q.id = ? AND q.kind = 'queue' AND qn.text = sn.text || ?");
  q.bind(1, track).bind(2, std::string(kLaunchQueueSuffix));
  std::optional<std::int64_t> stream;
  if (q.step()) stream = q.column_int64(0);
  q.reset();
  if (!stream) return stored;
  auto& k = db_->prepare("SELECT launch_ns, start_ns FROM kernel WHERE track_id = ? AND launch_ns >= 0");
  k.bind(1, *stream);
  return launch_queue(track, collect<std::pair<std::int64_t, std::int64_t>>(k, [](sqlite3_stmt* h) {
                        return std::pair{time_ns(h, 0), time_ns(h, 1)};
                      }));
}

std::vector<StepRow> Reader::steps(std::optional<std::int32_t> rank) {
  constexpr const char* kCols = "SELECT rank, step, start_ns, end_ns, data_wait_ns, comm_exposed_ns, loss, lr, images FROM step";
  auto& st = rank ? db_->prepare(std::string(kCols) + " WHERE rank = ? ORDER BY rank, step")
                  : db_->prepare(std::string(kCols) + " ORDER BY rank, step");
  if (rank) st.bind(1, *rank);
  return collect<StepRow>(st, [](sqlite3_stmt* h) {
    return StepRow{sqlite3_column_int(h, 0), sqlite3_column_int(h, 1), time_ns(h, 2),
                   time_ns(h, 3),            time_ns(h, 4),            time_ns(h, 5),
                   real_or_nan(h, 6),           real_or_nan(h, 7),           sqlite3_column_int64(h, 8)};
  });
}

namespace {
// A memory row from the columns rank, t_ns, step, bytes, live_bytes, role, name_id.
MemoryRow memory_row(sqlite3_stmt* h) {
  return MemoryRow{sqlite3_column_int(h, 0), time_ns(h, 1), sqlite3_column_int(h, 2),
                   sqlite3_column_int64(h, 3), sqlite3_column_int64(h, 4),
                   static_cast<std::uint8_t>(std::clamp(sqlite3_column_int(h, 5), 0, kMemoryRoles - 1)),
                   static_cast<std::uint32_t>(sqlite3_column_int64(h, 6))};
}
}  // namespace

std::vector<MemoryRow> Reader::memory(std::optional<std::int32_t> rank) {
  static constexpr const char* kCols = "SELECT rank, t_ns, step, bytes, live_bytes, role, name_id FROM memory";
  auto& st = rank ? db_->prepare(std::string(kCols) + " WHERE rank = ? ORDER BY t_ns, rowid")
                  : db_->prepare(std::string(kCols) + " ORDER BY rank, t_ns, rowid");
  if (rank) st.bind(1, *rank);
  return collect<MemoryRow>(st, memory_row);
}

std::vector<MemoryRow> Reader::memory_between(const std::map<int, std::pair<std::int64_t, std::int64_t>>& windows) {
  if (windows.empty()) return {};
  std::string sql = "SELECT rank, t_ns, step, bytes, live_bytes, role, name_id FROM memory WHERE ";
  for (std::size_t i = 0; i < windows.size(); ++i) sql += i ? " OR " : "", sql += "(rank = ? AND t_ns BETWEEN ? AND ?)";
  auto& st = db_->prepare(sql + " ORDER BY rank, t_ns, rowid");
  int k = 1;
  for (const auto& [rank, w] : windows) {
    st.bind(k, rank).bind(k + 1, w.first).bind(k + 2, w.second);
    k += 3;
  }
  return collect<MemoryRow>(st, memory_row);
}

std::vector<MemoryRow> Reader::memory_before(const std::map<int, std::int64_t>& t0_by_rank) {
  if (t0_by_rank.empty()) return {};
  struct Last {
    std::int64_t t_ns = 0, rowid = 0;
    MemoryRow row;
    bool set = false;
    void offer(const MemoryRow& r, std::int64_t id) {
      if (set && (r.t_ns < t_ns || (r.t_ns == t_ns && id < rowid))) return;
      t_ns = r.t_ns, rowid = id, row = r, set = true;
    }
  };
  struct State {
    std::int64_t t0 = 0;
    Last last, last_alloc;
    std::map<std::pair<std::uint32_t, std::uint8_t>, std::int64_t> net;  // (name, role) -> bytes
  };
  std::map<int, State> ranks;
  std::int64_t latest = INT64_MIN;
  for (const auto& [rank, t0] : t0_by_rank) {
    ranks[rank].t0 = t0;
    latest = std::max(latest, t0);
  }
  // One scan of the events before the latest window (the table has no time index), kept per rank.
  auto& st =
      db_->prepare("SELECT rank, t_ns, step, bytes, live_bytes, role, name_id, rowid FROM memory WHERE t_ns < ?");
  st.bind(1, latest);
  while (st.step()) {
    const MemoryRow r = memory_row(st.handle());
    auto it = ranks.find(r.rank);
    if (it == ranks.end() || r.t_ns >= it->second.t0) continue;
    State& s = it->second;
    const std::int64_t id = st.column_int64(7);
    s.last.offer(r, id);
    if (r.bytes > 0) s.last_alloc.offer(r, id);
    s.net[{r.name, r.role}] += r.bytes;
  }
  st.reset();
  std::vector<MemoryRow> out;
  for (const auto& entry : ranks) {
    const State& s = entry.second;
    if (!s.last.set) continue;
    auto row = [&](std::uint32_t name, std::uint8_t role, std::int64_t bytes, std::int32_t step) {
      out.push_back(MemoryRow{entry.first, s.t0 - 1, step, bytes, s.last.row.live_bytes, role, name});
    };
    const MemoryRow* alloc = s.last_alloc.set ? &s.last_alloc.row : nullptr;
    for (auto [key, bytes] : s.net) {
      if (alloc != nullptr && alloc->name == key.first && alloc->role == key.second) bytes -= alloc->bytes;
      if (bytes != 0) row(key.first, key.second, bytes, -1);
    }
    if (alloc != nullptr) row(alloc->name, alloc->role, alloc->bytes, alloc->step);
  }
  return out;
}

std::vector<EvaluationRow> Reader::evaluations() {
  auto& st = db_->prepare("SELECT step, top1, top5, images, seconds FROM evaluation ORDER BY rowid");
  return collect<EvaluationRow>(st, [](sqlite3_stmt* h) {
    return EvaluationRow{sqlite3_column_int(h, 0), sqlite3_column_double(h, 1), sqlite3_column_double(h, 2),
                         sqlite3_column_int64(h, 3), sqlite3_column_double(h, 4)};
  });
}

namespace {

std::string column_string(sqlite3_stmt* h, int i) {
  const unsigned char* t = sqlite3_column_text(h, i);
  return t != nullptr ? std::string(reinterpret_cast<const char*>(t)) : std::string();
}

}  // namespace

std::vector<CaptureWindowRow> Reader::capture_windows() {
  auto& st = db_->prepare(
      "SELECT rank, first_step, last_step, trigger, trigger_step, detail FROM capture_window ORDER BY rank, first_step");
  return collect<CaptureWindowRow>(st, [](sqlite3_stmt* h) {
    return CaptureWindowRow{sqlite3_column_int(h, 0), sqlite3_column_int(h, 1), sqlite3_column_int(h, 2),
                            column_string(h, 3), sqlite3_column_int(h, 4), column_string(h, 5)};
  });
}

std::vector<CommCalibrationRow> Reader::comm_calibrations() {
  auto& st = db_->prepare("SELECT rank, kind, bytes, reps, median_ns, min_ns FROM comm_calibration ORDER BY rank, kind, bytes");
  return collect<CommCalibrationRow>(st, [](sqlite3_stmt* h) {
    return CommCalibrationRow{sqlite3_column_int(h, 0), column_string(h, 1), sqlite3_column_int64(h, 2),
                              sqlite3_column_int(h, 3), sqlite3_column_int64(h, 4), sqlite3_column_int64(h, 5)};
  });
}

std::vector<SplitTrialRow> Reader::split_trials() {
  auto& st = db_->prepare(
      "SELECT round, candidate, split, steps, median_step_ns, predicted_step_ns, alpha_beta_ns, exit_code, run, utc "
      "FROM split_trial "
      "ORDER BY rowid");
  return collect<SplitTrialRow>(st, [](sqlite3_stmt* h) {
    return SplitTrialRow{sqlite3_column_int(h, 0),   column_string(h, 1),        column_string(h, 2),
                         sqlite3_column_int(h, 3),   sqlite3_column_int64(h, 4), sqlite3_column_int64(h, 5),
                         sqlite3_column_int64(h, 6), sqlite3_column_int(h, 7),   column_string(h, 8),
                         column_string(h, 9)};
  });
}

std::vector<PipelineSpanRow> Reader::pipeline_spans() {
  auto& st = db_->prepare(
      "SELECT rank, step, stage, micro, kind, peer, bytes, post_ns, start_ns, end_ns FROM pipeline_span "
      "ORDER BY rank, step, start_ns");
  return collect<PipelineSpanRow>(st, [](sqlite3_stmt* h) {
    PipelineSpanRow r;
    r.rank = sqlite3_column_int(h, 0);
    r.step = sqlite3_column_int(h, 1);
    r.stage = sqlite3_column_int(h, 2);
    r.micro = sqlite3_column_int(h, 3);
    const unsigned char* kind = sqlite3_column_text(h, 4);
    r.kind = kind ? reinterpret_cast<const char*>(kind) : "";
    r.peer = sqlite3_column_int(h, 5);
    r.bytes = sqlite3_column_int64(h, 6);
    r.post_ns = time_ns(h, 7);
    r.start_ns = time_ns(h, 8);
    r.end_ns = time_ns(h, 9);
    return r;
  });
}

std::vector<PipelineStepRow> Reader::pipeline_steps() {
  auto& st = db_->prepare(
      "SELECT rank, step, stage, replica, start_ns, end_ns, busy_ns, wait_act_ns, wait_grad_ns, wait_allreduce_ns "
      "FROM pipeline_step ORDER BY step, rank");
  return collect<PipelineStepRow>(st, [](sqlite3_stmt* h) {
    return PipelineStepRow{sqlite3_column_int(h, 0),   sqlite3_column_int(h, 1),   sqlite3_column_int(h, 2),
                           sqlite3_column_int(h, 3),   time_ns(h, 4),              time_ns(h, 5),
                           time_ns(h, 6),              time_ns(h, 7),              time_ns(h, 8),
                           time_ns(h, 9)};
  });
}

std::vector<AllreduceRow> Reader::allreduces(std::optional<std::int32_t> rank) {
  constexpr const char* kCols =
      "SELECT rank, step, bucket, first_param, last_param, bytes, ready_ns, start_ns, end_ns FROM allreduce";
  auto& st = rank ? db_->prepare(std::string(kCols) + " WHERE rank = ? ORDER BY rank, step, start_ns, bucket")
                  : db_->prepare(std::string(kCols) + " ORDER BY rank, step, start_ns, bucket");
  if (rank) st.bind(1, *rank);
  return collect<AllreduceRow>(st, [](sqlite3_stmt* h) {
    return AllreduceRow{sqlite3_column_int(h, 0),   sqlite3_column_int(h, 1),   sqlite3_column_int(h, 2),
                        sqlite3_column_int(h, 3),   sqlite3_column_int(h, 4),   sqlite3_column_int64(h, 5),
                        time_ns(h, 6),              time_ns(h, 7),              time_ns(h, 8)};
  });
}

std::vector<ParamRow> Reader::params() {
  std::vector<ParamRow> out;
  auto& st = db_->prepare("SELECT idx, name, shape, numel, bucket, decay FROM param ORDER BY idx");
  while (st.step()) {
    ParamRow p;
    p.idx = static_cast<std::int32_t>(st.column_int64(0));
    p.name = st.column_text(1);
    p.shape = parse_shape(*db_, st.column_text_view(2));
    p.numel = st.column_int64(3);
    p.bucket = static_cast<std::int32_t>(st.column_int64(4));
    p.decay = st.column_int64(5) != 0;
    out.push_back(std::move(p));
  }
  st.reset();
  return out;
}

std::vector<TensorInfo> Reader::tensors(std::optional<std::string_view> source) {
  constexpr const char* kCols = "SELECT source, step, rank, kind, name, exec_order, dtype, shape, length(data) FROM tensor";
  auto& st = source ? db_->prepare(std::string(kCols) + " WHERE source = ? ORDER BY source, step, rank, exec_order")
                    : db_->prepare(std::string(kCols) + " ORDER BY source, step, rank, exec_order");
  if (source) st.bind(1, *source);
  std::vector<TensorInfo> out;
  while (st.step()) {
    TensorInfo t;
    t.source = st.column_text(0);
    t.step = static_cast<std::int32_t>(st.column_int64(1));
    t.rank = static_cast<std::int32_t>(st.column_int64(2));
    t.kind = st.column_text(3);
    t.name = st.column_text(4);
    t.exec_order = static_cast<std::int32_t>(st.column_int64(5));
    t.dtype = st.column_text(6);
    t.shape = parse_shape(*db_, st.column_text_view(7));
    t.bytes = st.column_int64(8);
    out.push_back(std::move(t));
  }
  st.reset();
  return out;
}

TensorRow Reader::tensor(std::string_view source, std::string_view kind, std::string_view name, std::int32_t step,
                         std::int32_t rank) {
  auto& st = db_->prepare(
      "SELECT source, step, rank, kind, name, exec_order, dtype, shape, data FROM tensor "
      "WHERE source = ? AND name = ? AND kind = ? AND step = ? AND rank = ?");
  st.bind(1, source).bind(2, name).bind(3, kind).bind(4, step).bind(5, rank);
  if (!st.step())
    throw StoreError(path().string() + ": no tensor " + std::string(kind) + " '" + std::string(name) + "' (source " +
                     std::string(source) + ", step " + std::to_string(step) + ", rank " + std::to_string(rank) + ")");
  TensorRow t;
  t.source = st.column_text(0);
  t.step = static_cast<std::int32_t>(st.column_int64(1));
  t.rank = static_cast<std::int32_t>(st.column_int64(2));
  t.kind = st.column_text(3);
  t.name = st.column_text(4);
  t.exec_order = static_cast<std::int32_t>(st.column_int64(5));
  t.dtype = st.column_text(6);
  std::string shape = st.column_text(7);
  auto blob = st.column_blob(8);
  t.data.assign(blob.begin(), blob.end());
  st.reset();
  t.shape = parse_shape(*db_, shape);
  return t;
}

TensorRow Reader::tensor(std::string_view source, std::string_view name, std::int32_t step, std::int32_t rank) {
  auto& st = db_->prepare("SELECT DISTINCT kind FROM tensor WHERE source = ? AND name = ? AND step = ? AND rank = ?");
  st.bind(1, source).bind(2, name).bind(3, step).bind(4, rank);
  std::vector<std::string> kinds;
  while (st.step()) kinds.push_back(st.column_text(0));
  st.reset();
  if (kinds.size() > 1) {
    std::string list;
    for (const auto& k : kinds) list += (list.empty() ? "" : ", ") + k;
    throw StoreError(path().string() + ": tensor name '" + std::string(name) + "' exists under several kinds (" + list +
                     "); name the kind");
  }
  if (kinds.empty())
    throw StoreError(path().string() + ": no tensor '" + std::string(name) + "' (source " + std::string(source) +
                     ", step " + std::to_string(step) + ", rank " + std::to_string(rank) + ")");
  return tensor(source, kinds[0], name, step, rank);
}

std::map<std::string, std::int64_t> Reader::row_counts() {
  std::vector<std::string> tables;
  // A file opened read-only at an older schema version has its newer tables as temp tables (migrate.hpp).
  // Ranges count under `range`, the view they are read through, not under range_data, where they are stored.
  auto& st = db_->prepare(
      "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' UNION "
      "SELECT name FROM sqlite_temp_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' "
      "EXCEPT SELECT 'range_data' ORDER BY name");
  while (st.step()) tables.push_back(st.column_text(0));
  st.reset();
  std::map<std::string, std::int64_t> out;
  for (const auto& t : tables) out[t] = db_->query_int64("SELECT count(*) FROM \"" + t + "\"");
  return out;
}

std::vector<ComparisonRow> Reader::comparisons() {
  std::vector<ComparisonRow> out;
  auto& st = db_->prepare(
      "SELECT id, created_utc, a_path, b_path, profile, passed, failed, first_divergence, json FROM comparison ORDER BY id");
  while (st.step())
    out.push_back(ComparisonRow{st.column_int64(0), st.column_text(1), st.column_text(2), st.column_text(3),
                                st.column_text(4), st.column_int64(5), st.column_int64(6), st.column_text(7),
                                st.column_text(8)});
  st.reset();
  return out;
}

std::vector<ComparisonEntryRow> Reader::comparison_rows(std::int64_t comparison_id) {
  std::vector<ComparisonEntryRow> out;
  auto& st = db_->prepare(
      "SELECT comparison_id, exec_order, name, kind, status, metrics_json FROM comparison_row "
      "WHERE comparison_id = ? ORDER BY exec_order");
  st.bind(1, comparison_id);
  while (st.step())
    out.push_back(ComparisonEntryRow{st.column_int64(0), static_cast<std::int32_t>(st.column_int64(1)),
                                     st.column_text(2), st.column_text(3), st.column_text(4), st.column_text(5)});
  st.reset();
  return out;
}

void sort_by_start(std::vector<RangeRow>& rows) {
  auto before = [](const RangeRow& a, const RangeRow& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.depth < b.depth;
  };
  if (!std::is_sorted(rows.begin(), rows.end(), before)) std::stable_sort(rows.begin(), rows.end(), before);
}

}  // namespace wb::store
