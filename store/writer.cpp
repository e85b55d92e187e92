// Writer: producers append rows to one pending batch under a short lock; a background thread swaps the
// batch out and commits it in one transaction with cached prepared statements.
//
// Signal handling is process-wide: the handler only records the signal (async-signal-safe), and each
// live Writer's background thread notices it within one polling interval, commits what is pending, and
// after kSignalGrace re-raises the signal with the default action if the process is still alive.
#include "store/writer.hpp"

#include <sqlite3.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>

#include <algorithm>
#include <csignal>
#include <limits>
#include <cstdio>
#include <ctime>
#include <optional>
#include <utility>

#include "store/db.hpp"
#include "store/range_table.hpp"
#include "store/summary.hpp"

namespace wb::store {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);
constexpr std::int64_t kSignalGraceNs = 3'000'000'000;

std::atomic<int> g_signal{0};
std::atomic<std::int64_t> g_signal_time_ns{0};
std::atomic<bool> g_stop{false};
std::mutex g_handlers_mutex;
int g_handler_users = 0;
struct sigaction g_old_int {};
struct sigaction g_old_xfsz {};
struct sigaction g_old_term {};

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe, unlike std::chrono in a handler
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

extern "C" void on_stop_signal(int sig) {
  if (g_signal.load() != 0) {
    // A second signal: the user insists, so stop now with the default action.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_signal_time_ns.store(monotonic_ns());
  g_signal.store(sig);
  g_stop.store(true);
}

void install_handlers() {
  std::lock_guard lk(g_handlers_mutex);
  if (g_handler_users++ > 0) return;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  // A file size limit (ulimit -f) is met like a full disk: the write fails (EFBIG) and the failed batch
  // is counted, instead of the signal's default action ending the whole training job.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGXFSZ, &ignore, &g_old_xfsz);
}

void remove_handlers() {
  std::lock_guard lk(g_handlers_mutex);
  if (--g_handler_users > 0) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGXFSZ, &g_old_xfsz, nullptr);
}

std::string utc_now_iso() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// Why the run file at `path` cannot be replaced, or "" when nobody else is using it. A live Writer holds
// an flock on its file for its whole life (another wb-train recording into it); any other program with
// the file open for writing or in a transaction (the sqlite3 shell, a script) holds an SQLite lock that
// an exclusive transaction cannot get.
std::string in_use_by_another(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const bool busy = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(fd);
    if (busy) return "another process is recording into it";
  }
  sqlite3* db = nullptr;
  std::string why;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    sqlite3_busy_timeout(db, 250);
    const int rc = sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) {
      sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    } else if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
      why = "another process holds a lock on it (" + std::string(sqlite3_errmsg(db)) + ")";
    }
  }
  sqlite3_close(db);
  return why;
}

void remove_run_file(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  for (const char* suffix : {"-wal", "-shm", "-journal", ".packed"}) {
    auto p = path;
    p += suffix;
    std::filesystem::remove(p, ec);
  }
}

// Binds with the raw API: the hot insert loops run millions of times per second, and every call is still
// checked, through one branch on the combined result.
inline int bind_i64(sqlite3_stmt* st, int i, std::int64_t v) { return sqlite3_bind_int64(st, i, v); }

}  // namespace

struct Writer::Pending {
  std::vector<std::pair<std::uint32_t, std::string>> strings;
  std::vector<TrackRow> tracks;
  std::vector<std::pair<std::string, std::string>> meta;
  std::optional<RankRow> rank;
  std::vector<RangeRow> ranges;
  std::vector<KernelRow> kernels;
  std::vector<CounterRow> counters;
  std::vector<AllreduceRow> allreduces;
  std::vector<StepRow> steps;
  std::vector<ParamRow> params;
  std::vector<TensorRow> tensors;
  std::vector<EvaluationRow> evaluations;
  std::vector<CaptureWindowRow> capture_windows;
  std::vector<PipelineSpanRow> pipeline_spans;
  std::vector<PipelineStepRow> pipeline_steps;
  std::vector<MemoryRow> memory;
  std::vector<CommCalibrationRow> calibrations;
  std::optional<std::filesystem::path> kernel_file;  // adopt_kernels

  std::size_t event_rows() const {
    return ranges.size() + kernels.size() + counters.size() + allreduces.size() + steps.size() + params.size() +
           tensors.size() + evaluations.size() + capture_windows.size() + pipeline_spans.size() + pipeline_steps.size() +
           memory.size() + calibrations.size();
  }
  bool empty() const {
    return event_rows() == 0 && strings.empty() && tracks.empty() && meta.empty() && !rank.has_value() &&
           !kernel_file;
  }
  // Keeps what later rows depend on (strings, tracks, meta, rank) for a retry after a failed commit.
  void keep_only_metadata() {
    ranges.clear();
    kernels.clear();
    counters.clear();
    allreduces.clear();
    steps.clear();
    params.clear();
    tensors.clear();
    evaluations.clear();
    capture_windows.clear();
    pipeline_spans.clear();
    pipeline_steps.clear();
    memory.clear();
    calibrations.clear();
    kernel_file.reset();
  }
};

namespace {

// Folds the WAL back into the file and leaves WAL mode: true when the file is then complete alone, with
// no WAL beside it (SQLite deletes it on leaving WAL mode). A reader holding the file open keeps the WAL
// and WAL mode; SQLite replays it on the next open.
bool fold_wal(Db& db) {
  try {
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
    auto& st = db.prepare("PRAGMA journal_mode = DELETE");
    const bool rollback = st.step() && st.column_text(0) == "delete";
    st.reset();
    return rollback;
  } catch (const StoreError&) {
    return false;
  }
}

}  // namespace

Writer::Writer(WriterOptions opts) : opts_(std::move(opts)), pending_(std::make_unique<Pending>()) {
  if (std::filesystem::exists(opts_.path)) {
    if (!opts_.overwrite)
      throw StoreError(opts_.path.string() + ": already exists (refusing to overwrite a run file)");
    if (std::string why = in_use_by_another(opts_.path); !why.empty())
      throw StoreError(opts_.path.string() + ": in use, " + why + "; stop it or record into another file");
    remove_run_file(opts_.path);
  }
  if (opts_.path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(opts_.path.parent_path(), ec);
  }
  db_ = std::make_unique<Db>(opts_.path, OpenMode::create);
  // Held until the writer closes: another Writer on the same path refuses to start (in_use_by_another).
  lock_fd_ = ::open(opts_.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (lock_fd_ >= 0 && ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    db_.reset();
    throw StoreError(opts_.path.string() + ": in use, another process is recording into it; stop it or record into another file");
  }
  // Larger pages and cache make the batched inserts cheaper. WAL keeps every committed batch safe against
  // a process kill: the kernel has the pages once write() returns. synchronous = OFF skips the fsyncs at
  // checkpoints, which guard only against power loss (a profile need not survive one) and used to stall
  // the writer thread for about a tenth of its time.
  db_->exec("PRAGMA page_size = 16384");
  db_->exec(opts_.bulk_load ? "PRAGMA journal_mode = OFF" : "PRAGMA journal_mode = WAL");
  db_->exec("PRAGMA synchronous = OFF");
  db_->exec("PRAGMA cache_size = -65536");
  db_->exec("PRAGMA wal_autocheckpoint = 4000");
  // This writer is its file's only writer: a lock means another process holds the file, so a commit
  // gives up after a second (the batch is counted as dropped) rather than stalling the queue.
  sqlite3_busy_timeout(db_->handle(), 1000);
  apply_schema(*db_, /*indexes=*/opts_.bulk_load && opts_.build_indexes);

  {
    Transaction tx(*db_);
    auto& st = db_->prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)");
    for (auto [k, v] : {std::pair<const char*, std::string>{"created_utc", utc_now_iso()},
                        {"rank", std::to_string(opts_.rank)},
                        {"world_size", "1"},
                        {"complete", "0"},
                        {"dropped_events", "0"}}) {
      st.bind(1, k).bind(2, v).run();
    }
    RankRow r;
    r.rank = opts_.rank;
    r.host = host_name();
    r.pid = static_cast<std::int64_t>(getpid());
    db_->prepare("INSERT OR REPLACE INTO rank VALUES (?, ?, ?, ?, ?, ?, ?)")
        .bind(1, r.rank).bind(2, r.host).bind(3, r.device).bind(4, r.pid)
        .bind(5, r.clock_offset_ns).bind(6, r.clock_offset_end_ns).bind(7, r.dropped_events).run();
    tx.commit();
  }

  if (opts_.handle_signals) install_handlers();
  thread_ = std::thread([this] { run_background(); });
}

Writer::~Writer() {
  {
    std::lock_guard lk(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    if (opts_.build_indexes && !opts_.bulk_load) create_indexes(*db_);
  } catch (const StoreError& e) {
    std::fprintf(stderr, "wb: %s: could not build indexes (queries will scan): %s\n", opts_.path.c_str(), e.what());
  }
  // The timeline's level-of-detail pyramid; a per-rank file gets it when merged, and a file without it
  // when the viewer first opens it.
  try {
    if (opts_.build_indexes && !failed_.load()) {
      if (summary_ && summary_->in_order() && dropped_.load() == 0) summary_->write(*db_);
      else build_summary(*db_);
    }
  } catch (const StoreError& e) {
    std::fprintf(stderr, "wb: %s: could not build the timeline summary (wb-view builds it on open): %s\n",
                 opts_.path.c_str(), e.what());
  }
  // Fold the WAL back so the closed run is one self-contained file a user can copy.
  const bool folded = fold_wal(*db_);
  // Then a copy with its pages packed replaces it: rows appended in key order leave about an eighth of
  // range_data's pages empty (write_packed_copy). Only a file without a WAL is replaced: a WAL left
  // behind would be replayed into the copy.
  std::filesystem::path packed;
  if (folded && opts_.pack && !failed_.load()) {
    packed = opts_.path;
    packed += ".packed";
    try {
      if (!write_packed_copy(*db_, packed)) packed.clear();
    } catch (const StoreError& e) {
      std::fprintf(stderr, "wb: %s: left unpacked: %s\n", opts_.path.c_str(), e.what());
      packed.clear();
    }
  }
  db_.reset();
  if (!packed.empty()) {
    std::error_code ec;
    std::filesystem::rename(packed, opts_.path, ec);
    if (ec) {
      std::fprintf(stderr, "wb: %s: left unpacked: %s\n", opts_.path.c_str(), ec.message().c_str());
      std::filesystem::remove(packed, ec);
    }
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
  // Last: building the indexes and folding the WAL back write too, and must meet a file size limit as
  // a failed write (SIGXFSZ ignored), not as the end of the process.
  if (opts_.handle_signals) remove_handlers();
}

void Writer::use_summary(std::unique_ptr<SummaryBuilder> summary) { summary_ = std::move(summary); }

std::uint32_t Writer::intern(std::string_view text) {
  std::lock_guard ilk(intern_mutex_);
  auto it = strings_.find(std::string(text));
  if (it != strings_.end()) return it->second;
  auto id = static_cast<std::uint32_t>(strings_.size() + 1);
  strings_.emplace(std::string(text), id);
  std::lock_guard lk(mutex_);
  pending_->strings.emplace_back(id, std::string(text));
  return id;
}

std::uint32_t Writer::add_track(TrackKind kind, std::string_view name) {
  std::uint32_t name_id = intern(name);
  std::lock_guard lk(mutex_);
  std::uint32_t id = next_track_++;
  pending_->tracks.push_back(TrackRow{id, opts_.rank, kind, name_id});
  return id;
}

void Writer::set_meta(std::string_view key, std::string_view value) {
  std::lock_guard lk(mutex_);
  pending_->meta.emplace_back(std::string(key), std::string(value));
}

void Writer::set_rank(const RankRow& row) {
  std::lock_guard lk(mutex_);
  pending_->rank = row;
}

bool Writer::admit(std::unique_lock<std::mutex>& lk, std::size_t n) {
  while (opts_.wait_for_room && pending_rows_ > 0 && pending_rows_ + n > opts_.max_pending_rows) {
    commit_soon_ = true;  // the rows waiting may be fewer than an eager commit's
    wake_.notify_one();
    room_.wait(lk);
  }
  // A span larger than the limit goes in whole once nothing else is pending.
  if (pending_rows_ + n > opts_.max_pending_rows && !(opts_.wait_for_room && pending_rows_ == 0)) {
    dropped_.fetch_add(n, std::memory_order_relaxed);
    return false;
  }
  pending_rows_ += n;
  // Wake the committer as soon as a batch is big enough to amortise a transaction: it then commits back
  // to back while rows keep coming instead of idling until the next interval, and bursts do not run into
  // the limit.
  if (pending_rows_ >= eager_rows() && pending_rows_ - n < eager_rows()) wake_.notify_one();
  return true;
}

// Rows are admitted whole or not at all per call, so a span is never half-recorded.
#define WB_WRITER_ADD(Row, member)                                  \
  void Writer::add(const Row& row) {                                \
    std::unique_lock lk(mutex_);                                    \
    if (admit(lk, 1)) pending_->member.push_back(row);              \
  }                                                                 \
  void Writer::add(std::span<const Row> rows) {                     \
    std::unique_lock lk(mutex_);                                    \
    if (admit(lk, rows.size()))                                     \
      pending_->member.insert(pending_->member.end(), rows.begin(), rows.end()); \
  }
WB_WRITER_ADD(RangeRow, ranges)
WB_WRITER_ADD(KernelRow, kernels)
WB_WRITER_ADD(CounterRow, counters)
WB_WRITER_ADD(AllreduceRow, allreduces)
WB_WRITER_ADD(StepRow, steps)
WB_WRITER_ADD(PipelineSpanRow, pipeline_spans)
WB_WRITER_ADD(PipelineStepRow, pipeline_steps)
WB_WRITER_ADD(MemoryRow, memory)
#undef WB_WRITER_ADD

void Writer::adopt_kernels(const std::filesystem::path& file) {
  std::lock_guard lk(mutex_);
  pending_->kernel_file = file;
  commit_soon_ = true;
  wake_.notify_one();
}

void Writer::add(const EvaluationRow& row) {
  std::unique_lock lk(mutex_);
  if (admit(lk, 1)) pending_->evaluations.push_back(row);
}

void Writer::add(std::span<const CommCalibrationRow> rows) {
  std::unique_lock lk(mutex_);
  if (admit(lk, rows.size())) pending_->calibrations.insert(pending_->calibrations.end(), rows.begin(), rows.end());
}

void Writer::add(const CaptureWindowRow& row) {
  std::unique_lock lk(mutex_);
  if (admit(lk, 1)) pending_->capture_windows.push_back(row);
}

void Writer::add(ParamRow row) {
  std::unique_lock lk(mutex_);
  if (admit(lk, 1)) pending_->params.push_back(std::move(row));
}

void Writer::add(TensorRow row) {
  std::unique_lock lk(mutex_);
  if (admit(lk, 1)) pending_->tensors.push_back(std::move(row));
}

std::size_t Writer::eager_rows() const {
  if (opts_.eager_commit_rows == 0) return std::numeric_limits<std::size_t>::max();
  return std::min(opts_.eager_commit_rows, std::max<std::size_t>(opts_.max_pending_rows / 2, 1));
}

void Writer::count_dropped(std::uint64_t n) { dropped_.fetch_add(n, std::memory_order_relaxed); }
std::uint64_t Writer::dropped() const { return dropped_.load(std::memory_order_relaxed); }
bool Writer::failed() const { return failed_.load(); }
std::string Writer::failure() const {
  std::lock_guard lk(mutex_);
  return failure_;
}
bool Writer::stop_requested() { return g_stop.load(); }

WriterStats Writer::stats() const {
  std::lock_guard lk(mutex_);
  return stats_;
}

void Writer::flush() {
  std::unique_lock lk(mutex_);
  std::uint64_t target = ++flush_requested_;
  wake_.notify_all();
  committed_.wait(lk, [&] { return flush_done_ >= target; });
}

void Writer::commit_soon() {
  {
    std::lock_guard lk(mutex_);
    if (pending_rows_ == 0) return;
    commit_soon_ = true;
  }
  wake_.notify_all();
}

bool Writer::finish() {
  flush();
  if (failed_.load()) return false;
  set_meta("complete", "1");
  flush();
  if (failed_.load()) return false;
  return true;
}

void Writer::run_background() {
  auto next_commit = std::chrono::steady_clock::now() + opts_.flush_interval;
  bool signal_seen = false;
  while (true) {
    Pending batch;
    std::uint64_t generation = 0;
    bool stop = false;
    {
      std::unique_lock lk(mutex_);
      auto grace_over = [&] { return signal_seen && monotonic_ns() - g_signal_time_ns.load() >= kSignalGraceNs; };
      while (!stopping_ && flush_requested_ == flush_done_ && !commit_soon_ &&
             std::chrono::steady_clock::now() < next_commit && pending_rows_ < eager_rows() &&
             (signal_seen || g_signal.load() == 0) && !grace_over()) {
        auto left = next_commit - std::chrono::steady_clock::now();
        wake_.wait_for(lk, std::min<std::chrono::steady_clock::duration>(left, kPollInterval));
      }
      std::swap(batch, *pending_);
      pending_rows_ = 0;
      room_.notify_all();
      commit_soon_ = false;
      generation = flush_requested_;
      stop = stopping_;
    }
    if (opts_.handle_signals && g_signal.load() != 0) signal_seen = true;

    std::size_t rows = batch.event_rows();
    double cpu0 = thread_cpu_s();
    auto wall0 = std::chrono::steady_clock::now();
    bool committed = commit(batch);
    next_commit = std::chrono::steady_clock::now() + opts_.flush_interval;
    {
      std::lock_guard lk(mutex_);
      flush_done_ = std::max(flush_done_, generation);
      if (committed) {
        stats_.rows_committed += rows;
        stats_.commits += 1;
      }
      stats_.commit_cpu_s += thread_cpu_s() - cpu0;
      stats_.commit_wall_s += std::chrono::duration<double>(next_commit - opts_.flush_interval - wall0).count();
    }
    committed_.notify_all();
    if (stop) break;

    if (signal_seen && monotonic_ns() - g_signal_time_ns.load() >= kSignalGraceNs) {
      // The program did not stop in time after SIGINT/SIGTERM: let the signal's default action end it.
      int sig = g_signal.load();
      std::signal(sig, SIG_DFL);
      kill(getpid(), sig);
    }
  }
}

namespace {

// One insert per kind of row, called in turn by Writer::commit inside its transaction; each does
// nothing (prepares no statement) when the batch holds none of its rows.

void insert_strings(Db& db, const std::vector<std::pair<std::uint32_t, std::string>>& strings) {
  if (strings.empty()) return;
  auto& st = db.prepare("INSERT INTO string(id, text) VALUES (?, ?)");
  for (const auto& [id, text] : strings) st.bind(1, id).bind(2, text).run();
}

void insert_tracks(Db& db, const std::vector<TrackRow>& tracks) {
  if (tracks.empty()) return;
  auto& st = db.prepare("INSERT INTO track(id, rank, kind, name_id) VALUES (?, ?, ?, ?)");
  for (const auto& t : tracks) st.bind(1, t.id).bind(2, t.rank).bind(3, track_kind_name(t.kind)).bind(4, t.name).run();
}

void insert_meta(Db& db, const std::vector<std::pair<std::string, std::string>>& meta) {
  if (meta.empty()) return;
  auto& st = db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)");
  for (const auto& [k, v] : meta) st.bind(1, k).bind(2, v).run();
}

// The rank's row, with the events dropped so far.
void insert_rank(Db& db, const std::optional<RankRow>& rank, std::uint64_t dropped_now) {
  if (!rank) return;
  const RankRow& r = *rank;
  db.prepare(
        "INSERT OR REPLACE INTO rank(rank, host, device, pid, clock_offset_ns, clock_offset_end_ns, dropped_events) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)")
      .bind(1, r.rank).bind(2, r.host).bind(3, r.device).bind(4, r.pid)
      .bind(5, r.clock_offset_ns).bind(6, r.clock_offset_end_ns).bind(7, static_cast<std::int64_t>(dropped_now))
      .run();
}

// Inserts `rows` into a rowid table with statements of kRowsPerInsert rows each (the per-statement cost,
// step, reset and VDBE setup, dominates rows this small), the rest with one-row statements. `head` is the
// statement up to VALUES; bind(h, base, row) binds one row's `columns` parameters after parameter `base`.
template <class Row, class Bind>
void insert_rows(Db& db, std::string_view head, int columns, std::span<const Row> rows, Bind&& bind) {
  constexpr std::size_t kRowsPerInsert = 64;
  auto sql = [&](std::size_t n) {
    std::string one = "(?";
    for (int c = 1; c < columns; ++c) one += ", ?";
    one += ")";
    std::string s(head);
    s += " VALUES ";
    for (std::size_t k = 0; k < n; ++k) s += (k == 0 ? "" : ", ") + one;
    return s;
  };
  auto run = [&](sqlite3_stmt* h, int rc) {
    WB_SQLITE_CHECK(db.handle(), rc);
    rc = sqlite3_step(h);
    sqlite3_reset(h);
    WB_SQLITE_CHECK(db.handle(), rc);
  };
  std::size_t i = 0;
  if (rows.size() >= kRowsPerInsert) {
    sqlite3_stmt* h = db.prepare(sql(kRowsPerInsert)).handle();
    for (; i + kRowsPerInsert <= rows.size(); i += kRowsPerInsert) {
      int rc = 0;
      for (std::size_t k = 0; k < kRowsPerInsert; ++k) rc |= bind(h, static_cast<int>(k) * columns, rows[i + k]);
      run(h, rc);
    }
  }
  if (i == rows.size()) return;
  sqlite3_stmt* h = db.prepare(sql(1)).handle();
  for (; i < rows.size(); ++i) run(h, bind(h, 0, rows[i]));
}

void insert_kernels(Db& db, std::span<const KernelRow> kernels) {
  insert_rows<KernelRow>(db,
              "INSERT INTO kernel(track_id, start_ns, end_ns, name_id, corr_id, kind, grid_x, grid_y, grid_z, "
              "block_x, block_y, block_z, bytes, blocks_per_sm, occupancy, launch_ns, launch_end_ns)",
              17, kernels, [](sqlite3_stmt* h, int b, const KernelRow& k) {
                return bind_i64(h, b + 1, k.track) | bind_i64(h, b + 2, k.start_ns) | bind_i64(h, b + 3, k.end_ns) |
                       bind_i64(h, b + 4, k.name) | bind_i64(h, b + 5, static_cast<std::int64_t>(k.corr_id)) |
                       bind_i64(h, b + 6, k.kind) | bind_i64(h, b + 7, k.grid[0]) | bind_i64(h, b + 8, k.grid[1]) |
                       bind_i64(h, b + 9, k.grid[2]) | bind_i64(h, b + 10, k.block[0]) |
                       bind_i64(h, b + 11, k.block[1]) | bind_i64(h, b + 12, k.block[2]) |
                       bind_i64(h, b + 13, k.bytes) | sqlite3_bind_double(h, b + 14, k.blocks_per_sm) |
                       sqlite3_bind_double(h, b + 15, k.occupancy) | bind_i64(h, b + 16, k.launch_ns) |
                       bind_i64(h, b + 17, k.launch_end_ns);
              });
}

// The kernel table of a file write_kernel_file wrote, copied into db's (empty) one. With the same schema
// and indexes SQLite copies the records as they are. ATTACH cannot run inside a transaction, so this runs
// after the batch's.
void copy_kernel_table(Db& db, const std::filesystem::path& file) {
  db.prepare("ATTACH DATABASE ? AS kernel_file").bind(1, file.string()).run();
  auto detach = [&] {
    db.clear_statement_cache();  // none may refer to the file when it is detached
    db.exec("DETACH DATABASE kernel_file");
  };
  try {
    Transaction tx(db);
    db.exec("INSERT INTO main.kernel SELECT * FROM kernel_file.kernel");
    tx.commit();
  } catch (const StoreError&) {
    detach();
    throw;
  }
  detach();
}

void insert_counters(Db& db, const std::vector<CounterRow>& counters) {
  insert_rows<CounterRow>(db, "INSERT INTO counter(track_id, t_ns, value)", 3, counters,
              [](sqlite3_stmt* h, int b, const CounterRow& c) {
                return bind_i64(h, b + 1, c.track) | bind_i64(h, b + 2, c.t_ns) |
                       sqlite3_bind_double(h, b + 3, c.value);
              });
}

void insert_allreduces(Db& db, const std::vector<AllreduceRow>& allreduces) {
  if (allreduces.empty()) return;
  auto& st = db.prepare(
      "INSERT INTO allreduce(rank, step, bucket, first_param, last_param, bytes, ready_ns, start_ns, end_ns) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
  for (const AllreduceRow& a : allreduces)
    st.bind(1, a.rank).bind(2, a.step).bind(3, a.bucket).bind(4, a.first_param).bind(5, a.last_param)
        .bind(6, a.bytes).bind(7, a.ready_ns).bind(8, a.start_ns).bind(9, a.end_ns).run();
}

// SQLite stores a NaN REAL as NULL, which the NOT NULL columns refuse (and a diverged step's row
// would take its whole batch down with it): a NaN is stored as the text 'nan', which Reader reads
// back as NaN. Infinities are REALs like any other.
Statement& bind_real(Statement& stmt, int i, double v) {
  return std::isnan(v) ? stmt.bind(i, std::string_view("nan")) : stmt.bind(i, v);
}

void insert_steps(Db& db, const std::vector<StepRow>& steps) {
  if (steps.empty()) return;
  auto& st = db.prepare(
      "INSERT INTO step(rank, step, start_ns, end_ns, data_wait_ns, comm_exposed_ns, loss, lr, images) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
  for (const StepRow& s : steps) {
    st.bind(1, s.rank).bind(2, s.step).bind(3, s.start_ns).bind(4, s.end_ns).bind(5, s.data_wait_ns)
        .bind(6, s.comm_exposed_ns).bind(9, s.images);
    bind_real(st, 7, s.loss);
    bind_real(st, 8, s.lr);
    st.run();
  }
}

void insert_pipeline_spans(Db& db, const std::vector<PipelineSpanRow>& spans) {
  if (spans.empty()) return;
  auto& st = db.prepare(
      "INSERT INTO pipeline_span(rank, step, stage, micro, kind, peer, bytes, post_ns, start_ns, end_ns) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  for (const PipelineSpanRow& p : spans)
    st.bind(1, p.rank).bind(2, p.step).bind(3, p.stage).bind(4, p.micro).bind(5, p.kind).bind(6, p.peer)
        .bind(7, p.bytes).bind(8, p.post_ns).bind(9, p.start_ns).bind(10, p.end_ns).run();
}

void insert_pipeline_steps(Db& db, const std::vector<PipelineStepRow>& steps) {
  if (steps.empty()) return;
  auto& st = db.prepare(
      "INSERT INTO pipeline_step(rank, step, stage, replica, start_ns, end_ns, busy_ns, wait_act_ns, wait_grad_ns, "
      "wait_allreduce_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  for (const PipelineStepRow& p : steps)
    st.bind(1, p.rank).bind(2, p.step).bind(3, p.stage).bind(4, p.replica).bind(5, p.start_ns).bind(6, p.end_ns)
        .bind(7, p.busy_ns).bind(8, p.wait_act_ns).bind(9, p.wait_grad_ns).bind(10, p.wait_allreduce_ns).run();
}

void insert_memory(Db& db, const std::vector<MemoryRow>& memory) {
  if (memory.empty()) return;
  auto& st = db.prepare(
      "INSERT INTO memory(rank, t_ns, step, bytes, live_bytes, role, name_id) VALUES (?, ?, ?, ?, ?, ?, ?)");
  for (const MemoryRow& m : memory)
    st.bind(1, m.rank).bind(2, m.t_ns).bind(3, m.step).bind(4, m.bytes).bind(5, m.live_bytes)
        .bind(6, static_cast<std::int64_t>(m.role)).bind(7, static_cast<std::int64_t>(m.name)).run();
}

void insert_params(Db& db, const std::vector<ParamRow>& params) {
  if (params.empty()) return;
  auto& st = db.prepare(
      "INSERT OR REPLACE INTO param(idx, name, shape, numel, bucket, decay) VALUES (?, ?, ?, ?, ?, ?)");
  for (const ParamRow& p : params)
    st.bind(1, p.idx).bind(2, p.name).bind(3, shape_to_json(p.shape)).bind(4, p.numel).bind(5, p.bucket)
        .bind(6, p.decay ? 1 : 0).run();
}

void insert_tensors(Db& db, const std::vector<TensorRow>& tensors) {
  if (tensors.empty()) return;
  auto& st = db.prepare(
      "INSERT INTO tensor(source, step, rank, kind, name, exec_order, dtype, shape, data) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
  for (const TensorRow& t : tensors)
    st.bind(1, t.source).bind(2, t.step).bind(3, t.rank).bind(4, t.kind).bind(5, t.name).bind(6, t.exec_order)
        .bind(7, t.dtype).bind(8, shape_to_json(t.shape)).bind(9, std::span<const std::byte>(t.data)).run();
}

void insert_evaluations(Db& db, const std::vector<EvaluationRow>& evaluations) {
  if (evaluations.empty()) return;
  auto& st = db.prepare("INSERT INTO evaluation(step, top1, top5, images, seconds) VALUES (?, ?, ?, ?, ?)");
  for (const EvaluationRow& e : evaluations)
    st.bind(1, e.step).bind(2, e.top1).bind(3, e.top5).bind(4, e.images).bind(5, e.seconds).run();
}

void insert_capture_windows(Db& db, const std::vector<CaptureWindowRow>& windows) {
  if (windows.empty()) return;
  auto& st = db.prepare(
      "INSERT INTO capture_window(rank, first_step, last_step, trigger, trigger_step, detail) VALUES (?, ?, ?, ?, ?, ?)");
  for (const CaptureWindowRow& c : windows)
    st.bind(1, c.rank).bind(2, c.first_step).bind(3, c.last_step).bind(4, c.trigger).bind(5, c.trigger_step)
        .bind(6, c.detail).run();
}

void insert_calibrations(Db& db, const std::vector<CommCalibrationRow>& rows) {
  if (rows.empty()) return;
  auto& st = db.prepare("INSERT INTO comm_calibration(rank, kind, bytes, reps, median_ns, min_ns) VALUES (?, ?, ?, ?, ?, ?)");
  for (const CommCalibrationRow& c : rows)
    st.bind(1, c.rank).bind(2, c.kind).bind(3, c.bytes).bind(4, c.reps).bind(5, c.median_ns).bind(6, c.min_ns).run();
}

// The events dropped so far, in meta and in the rank's row.
void record_dropped_events(Db& db, std::uint64_t dropped_now, int rank) {
  auto dropped_text = std::to_string(dropped_now);
  db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES ('dropped_events', ?)").bind(1, dropped_text).run();
  db.prepare("UPDATE rank SET dropped_events = ? WHERE rank = ?")
      .bind(1, static_cast<std::int64_t>(dropped_now)).bind(2, rank).run();
}

}  // namespace

// After a failed write (a full disk, a file size limit): fold the WAL's committed pages back into the file
// and empty the WAL. The WAL keeps a copy of a page per commit that touched it, so this frees most of its
// space, and the steps after a failed batch (a step dump too large for the disk) can still be recorded.
void Writer::reclaim_wal() {
  if (opts_.bulk_load) return;
  try {
    db_->exec("PRAGMA wal_checkpoint(TRUNCATE)");
  } catch (const StoreError&) {
    // No room even for that: the next batches are counted as dropped, as the first was.
  }
}

// The first ranges fix the file's time origin (their earliest start), so that stored starts are small.
void Writer::insert_range_rows(Db& db, std::vector<RangeRow>& rows) {
  if (rows.empty()) return;
  sort_by_key(rows);
  if (!time_origin_ns_) {
    const auto first = std::min_element(rows.begin(), rows.end(), [](const RangeRow& a, const RangeRow& b) {
      return a.start_ns < b.start_ns;
    });
    set_time_origin(db, first->start_ns);
    time_origin_ns_ = first->start_ns;
    origin_uncommitted_ = true;  // rolled back with the batch if it fails
  }
  insert_ranges(db, rows, *time_origin_ns_);
}

bool Writer::commit(Pending& batch) {
  std::uint64_t dropped_now = dropped_.load();
  if (batch.empty() && dropped_now == dropped_written_) return false;
  try {
    Db& db = *db_;
    Transaction tx(db);
    insert_strings(db, batch.strings);
    insert_tracks(db, batch.tracks);
    insert_meta(db, batch.meta);
    insert_rank(db, batch.rank, dropped_now);
    insert_range_rows(db, batch.ranges);
    insert_kernels(db, batch.kernels);
    insert_counters(db, batch.counters);
    insert_allreduces(db, batch.allreduces);
    insert_steps(db, batch.steps);
    insert_pipeline_spans(db, batch.pipeline_spans);
    insert_pipeline_steps(db, batch.pipeline_steps);
    insert_memory(db, batch.memory);
    insert_params(db, batch.params);
    insert_tensors(db, batch.tensors);
    insert_evaluations(db, batch.evaluations);
    insert_capture_windows(db, batch.capture_windows);
    insert_calibrations(db, batch.calibrations);
    if (dropped_now != dropped_written_) record_dropped_events(db, dropped_now, opts_.rank);
    tx.commit();
    origin_uncommitted_ = false;
    dropped_written_ = dropped_now;
    if (batch.kernel_file) copy_kernel_table(db, *batch.kernel_file);
    return true;
  } catch (const std::exception& e) {
    if (origin_uncommitted_) time_origin_ns_.reset();
    origin_uncommitted_ = false;
    // Recording must never take training down: report once, count the lost rows, keep going.
    const bool first = !failed_.exchange(true);
    if (first && opts_.report_failure)
      std::fprintf(stderr, "wb: recording to %s failed, the run will be marked incomplete: %s\n",
                   opts_.path.c_str(), e.what());
    dropped_.fetch_add(batch.event_rows());
    reclaim_wal();
    batch.keep_only_metadata();
    std::lock_guard lk(mutex_);
    if (first) failure_ = e.what();
    // Re-queue what later rows refer to, ahead of anything added meanwhile.
    Pending& p = *pending_;
    p.strings.insert(p.strings.begin(), batch.strings.begin(), batch.strings.end());
    p.tracks.insert(p.tracks.begin(), batch.tracks.begin(), batch.tracks.end());
    p.meta.insert(p.meta.begin(), batch.meta.begin(), batch.meta.end());
    if (!p.rank) p.rank = batch.rank;
    return false;
  }
}

std::int64_t save_comparison(const std::filesystem::path& run, const ComparisonRow& c,
                             std::span<const ComparisonEntryRow> rows) {
  Db db = open_run(run, OpenMode::read_write);
  Transaction tx(db);
  db.prepare(
        "INSERT INTO comparison(created_utc, a_path, b_path, profile, passed, failed, first_divergence, json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
      .bind(1, c.created_utc.empty() ? utc_now_iso() : c.created_utc).bind(2, c.a_path).bind(3, c.b_path)
      .bind(4, c.profile).bind(5, c.passed).bind(6, c.failed).bind(7, c.first_divergence).bind(8, c.json).run();
  std::int64_t id = db.last_insert_rowid();
  auto& st = db.prepare(
      "INSERT INTO comparison_row(comparison_id, exec_order, name, kind, status, metrics_json) VALUES (?, ?, ?, ?, ?, ?)");
  for (const ComparisonEntryRow& r : rows)
    st.bind(1, id).bind(2, r.exec_order).bind(3, r.name).bind(4, r.kind).bind(5, r.status).bind(6, r.metrics_json).run();
  tx.commit();
  return id;
}

}  // namespace wb::store

namespace wb::store {

void save_split_trial(const std::filesystem::path& run, const SplitTrialRow& t) {
  Db db = open_run(run, OpenMode::read_write);
  db.prepare(
        "INSERT INTO split_trial(round, candidate, split, steps, median_step_ns, predicted_step_ns, alpha_beta_ns, "
        "exit_code, run, utc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
      .bind(1, t.round).bind(2, t.candidate).bind(3, t.split).bind(4, t.steps).bind(5, t.median_step_ns)
      .bind(6, t.predicted_step_ns).bind(7, t.alpha_beta_ns).bind(8, t.exit_code).bind(9, t.run)
      .bind(10, t.utc.empty() ? utc_now_iso() : t.utc)
      .run();
}

void write_kernel_file(const std::filesystem::path& file, const std::vector<std::span<const KernelRow>>& parts,
                       bool indexes) {
  std::error_code ec;
  std::filesystem::remove(file, ec);
  Db db(file, OpenMode::create);
  db.exec("PRAGMA page_size = 16384");  // the Writer's: the copy then moves whole records
  db.exec("PRAGMA journal_mode = OFF");
  db.exec("PRAGMA synchronous = OFF");
  apply_schema(db, indexes);
  Transaction tx(db);
  for (const auto& part : parts) insert_kernels(db, part);
  tx.commit();
}

}  // namespace wb::store
