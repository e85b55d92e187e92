// The SQLite layer: checked calls, statements, transactions, schema creation, and the validation and
// migration of run files on open.
#include "store/db.hpp"

#include <sqlite3.h>

#include <array>
#include <cstring>
#include <fstream>
#include <utility>

#include "store/migrate.hpp"
#include "store/schema_sql.hpp"

namespace wb::store {
namespace {

// Keeps "store/db.cpp" of an absolute __FILE__ so messages stay short.
std::string_view short_source(const char* file) {
  std::string_view f(file);
  std::size_t cut = f.rfind('/');
  if (cut != std::string_view::npos && cut > 0) {
    std::size_t before = f.rfind('/', cut - 1);
    if (before != std::string_view::npos) return f.substr(before + 1);
  }
  return f;
}

std::string db_file_name(sqlite3* db) {
  if (db == nullptr) return "(no database)";
  const char* name = sqlite3_db_filename(db, "main");
  if (name == nullptr || *name == '\0') return ":memory:";
  return name;
}

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw StoreError(path.string() + ": " + what);
}

// Cheap checks on the raw bytes, so that files SQLite might half-accept give a clear reason.
void check_file_bytes(const std::filesystem::path& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) fail(path, "no such file");
  if (std::filesystem::is_directory(status)) fail(path, "is a directory, expected a wb run file");
  auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot read size (" + ec.message() + ")");
  if (size == 0) fail(path, "not a wb run file (empty file)");

  std::array<unsigned char, 100> header{};
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open for reading");
  in.read(reinterpret_cast<char*>(header.data()), header.size());
  auto got = static_cast<std::size_t>(in.gcount());
  static constexpr char kMagic[] = "SQLite format 3";  // 16 bytes with its NUL
  if (got < 16 || std::memcmp(header.data(), kMagic, 16) != 0)
    fail(path, "not a wb run file (not an SQLite database)");
  if (got < header.size())
    fail(path, "not a wb run file (truncated: " + std::to_string(size) + " bytes, shorter than an SQLite header)");

  // Header: page size at 16 (big-endian, 1 means 65536), page count at 28, valid when the change
  // counters at 24 and 92 agree. With a non-empty WAL the main file may legitimately lag behind.
  auto be32 = [&](int at) {
    return (std::uint32_t{header[at]} << 24) | (std::uint32_t{header[at + 1]} << 16) |
           (std::uint32_t{header[at + 2]} << 8) | std::uint32_t{header[at + 3]};
  };
  std::uint64_t page_size = (std::uint32_t{header[16]} << 8) | header[17];
  if (page_size == 1) page_size = 65536;
  std::uint64_t pages = be32(28);
  auto wal = path;
  wal += "-wal";
  bool wal_has_frames = std::filesystem::exists(wal, ec) && std::filesystem::file_size(wal, ec) > 32;
  if (!wal_has_frames && pages > 0 && be32(24) == be32(92) && size < pages * page_size)
    fail(path, "not a wb run file (truncated: " + std::to_string(size) + " bytes, its header says " +
                   std::to_string(pages * page_size) + ")");
}

}  // namespace

void sqlite_check(int rc, sqlite3* db, std::string_view what, const char* file, int line) {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
  std::string msg = db_file_name(db) + ": " + std::string(what) + " failed: ";
  msg += (db != nullptr) ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  msg += " (SQLite code " + std::to_string(rc) + ", " + std::string(short_source(file)) + ":" + std::to_string(line) + ")";
  throw StoreError(msg);
}

// ---- Statement ----

Statement::Statement(Db& db, std::string_view sql) : db_(db.handle()), sql_(sql) {
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql_.data(), static_cast<int>(sql_.size()), SQLITE_PREPARE_PERSISTENT, &stmt_, &tail);
  check(rc, "prepare");
}

Statement::~Statement() { sqlite3_finalize(stmt_); }

void Statement::check(int rc, std::string_view what) const {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
  sqlite_check(rc, db_, std::string(what) + " [" + sql_ + "]", __FILE__, __LINE__);
}

Statement& Statement::bind_int64(int i, std::int64_t v) {
  check(sqlite3_bind_int64(stmt_, i, v), "bind");
  return *this;
}
Statement& Statement::bind(int i, double v) {
  check(sqlite3_bind_double(stmt_, i, v), "bind");
  return *this;
}
Statement& Statement::bind(int i, std::string_view text) {
  check(sqlite3_bind_text64(stmt_, i, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8), "bind");
  return *this;
}
Statement& Statement::bind(int i, std::span<const std::byte> blob) {
  // A zero-length blob still binds as a blob (not NULL), so NOT NULL columns accept empty tensors.
  static const std::byte kEmpty{};
  const void* p = blob.empty() ? &kEmpty : static_cast<const void*>(blob.data());
  check(sqlite3_bind_blob64(stmt_, i, p, blob.size(), SQLITE_TRANSIENT), "bind");
  return *this;
}
Statement& Statement::bind_null(int i) {
  check(sqlite3_bind_null(stmt_, i), "bind");
  return *this;
}

bool Statement::step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  // Reset here so the statement is reusable after the caller handles the error.
  sqlite3_reset(stmt_);
  check(rc, "step");
  return false;
}

void Statement::run() {
  while (step()) {
  }
  reset();
}

void Statement::reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int Statement::column_count() const { return sqlite3_column_count(stmt_); }
bool Statement::column_is_null(int i) const { return sqlite3_column_type(stmt_, i) == SQLITE_NULL; }
std::int64_t Statement::column_int64(int i) const { return sqlite3_column_int64(stmt_, i); }
double Statement::column_double(int i) const { return sqlite3_column_double(stmt_, i); }
std::string Statement::column_text(int i) const { return std::string(column_text_view(i)); }
std::string_view Statement::column_text_view(int i) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, i));
  if (p == nullptr) return {};
  return {p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, i))};
}
std::span<const std::byte> Statement::column_blob(int i) const {
  const auto* p = static_cast<const std::byte*>(sqlite3_column_blob(stmt_, i));
  if (p == nullptr) return {};
  return {p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, i))};
}

// ---- Db ----

namespace {
// SQLite keeps allocation statistics under a global mutex unless told otherwise; nothing here reads them,
// and the writer allocates per batch of rows. Must run before SQLite initialises; later it is a no-op.
void configure_sqlite_once() {
  static const int rc = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
  (void)rc;
}
}  // namespace

Db::Db(const std::filesystem::path& path, OpenMode mode) : path_(path), mode_(mode) {
  configure_sqlite_once();
  int flags = SQLITE_OPEN_NOMUTEX;  // a connection is used by one thread at a time
  switch (mode) {
    case OpenMode::create: flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE; break;
    case OpenMode::read_write: flags |= SQLITE_OPEN_READWRITE; break;
    case OpenMode::read_only: flags |= SQLITE_OPEN_READONLY; break;
  }
  int rc = sqlite3_open_v2(path.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string why = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close_v2(db_);
    db_ = nullptr;
    fail(path, "cannot open (" + why + ")");
  }
  sqlite3_extended_result_codes(db_, 1);
  // Readers and merge may meet a writer's lock briefly; wait rather than fail at once.
  sqlite3_busy_timeout(db_, 2000);
}

Db::Db(Db&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)), mode_(other.mode_),
      cache_(std::move(other.cache_)) {}

Db::~Db() {
  cache_.clear();  // finalize statements before closing
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

void Db::exec(std::string_view sql) {
  std::string text(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err != nullptr ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    std::string shown = text.size() > 120 ? text.substr(0, 117) + "..." : text;
    fail(path_, "exec failed: " + msg + " [" + shown + "]");
  }
}

Statement& Db::prepare(std::string_view sql) {
  auto it = cache_.find(std::string(sql));
  if (it != cache_.end()) {
    it->second->reset();
    return *it->second;
  }
  auto stmt = std::make_unique<Statement>(*this, sql);
  auto& ref = *stmt;
  cache_.emplace(std::string(sql), std::move(stmt));
  return ref;
}

void Db::clear_statement_cache() { cache_.clear(); }

std::int64_t Db::last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }
std::int64_t Db::changes() const { return sqlite3_changes64(db_); }

std::int64_t Db::query_int64(std::string_view sql) {
  Statement& st = prepare(sql);
  if (!st.step()) fail(path_, "query returned no row [" + std::string(sql) + "]");
  std::int64_t v = st.column_int64(0);
  st.reset();
  return v;
}

// ---- Transaction ----

Transaction::Transaction(Db& db) : db_(db) { db_.prepare("BEGIN IMMEDIATE").run(); }

Transaction::~Transaction() {
  if (!done_) sqlite3_exec(db_.handle(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  db_.prepare("COMMIT").run();
  done_ = true;
}

// ---- schema ----

const std::vector<std::string>& schema_index_sql() {
  // Statements are split at ';' after dropping "--" comments; schema.sql has neither inside literals.
  static const std::vector<std::string> statements = [] {
    std::string sql;
    std::string_view text(kSchemaSql);
    while (!text.empty()) {
      auto eol = text.find('\n');
      std::string_view line = text.substr(0, eol);
      auto comment = line.find("--");
      sql += line.substr(0, comment);
      sql += '\n';
      text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    }
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start < sql.size()) {
      auto end = sql.find(';', start);
      std::string stmt = sql.substr(start, end == std::string::npos ? std::string::npos : end - start);
      start = end == std::string::npos ? sql.size() : end + 1;
      auto first = stmt.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) continue;
      stmt = stmt.substr(first);
      static constexpr std::string_view kCreateIndex = "CREATE INDEX ";
      if (stmt.compare(0, kCreateIndex.size(), kCreateIndex) == 0)
        out.push_back("CREATE INDEX IF NOT EXISTS " + stmt.substr(kCreateIndex.size()));
    }
    return out;
  }();
  return statements;
}

void create_indexes(Db& db) {
  Transaction tx(db);
  for (const auto& sql : schema_index_sql()) db.exec(sql);
  tx.commit();
}

bool write_packed_copy(Db& db, const std::filesystem::path& to) {
  const std::int64_t file = db.query_int64("PRAGMA page_count") * db.query_int64("PRAGMA page_size");
  // length() of a blob reads its size from the row, not its pages.
  const std::int64_t tensors = db.query_int64("SELECT coalesce(sum(length(data)), 0) FROM tensor");
  if (tensors * 2 >= file) return false;
  std::error_code ec;
  std::filesystem::remove(to, ec);
  try {
    auto& st = db.prepare("VACUUM INTO ?");
    st.bind(1, to.string());
    st.run();
  } catch (const StoreError& e) {
    std::filesystem::remove(to, ec);
    throw StoreError(db.path().string() + ": could not write its packed copy " + to.string() + ": " + e.what());
  }
  return true;
}

void apply_schema(Db& db, bool indexes) {
  Transaction tx(db);
  db.exec(kSchemaSql);
  if (!indexes) {
    std::vector<std::string> names;
    auto& st = db.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL");
    while (st.step()) names.push_back(st.column_text(0));
    st.reset();
    for (const auto& n : names) db.exec("DROP INDEX \"" + n + "\"");
  }
  db.exec("PRAGMA user_version = " + std::to_string(kSchemaVersion));
  db.prepare("INSERT INTO meta(key, value) VALUES ('schema_version', ?)").bind(1, std::to_string(kSchemaVersion)).run();
  db.exec("INSERT INTO meta(key, value) VALUES ('time_origin_ns', '0')");  // set_time_origin moves it
  tx.commit();
}

std::int64_t time_origin(Db& db) {
  auto& st = db.prepare("SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'time_origin_ns'");
  std::int64_t v = st.step() ? st.column_int64(0) : 0;
  st.reset();
  return v;
}

void set_time_origin(Db& db, std::int64_t origin_ns) {
  if (db.query_int64("SELECT EXISTS (SELECT 1 FROM range_data)") != 0)
    fail(db.path(), "the time origin cannot move once ranges are stored");
  db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES ('time_origin_ns', ?)").bind(1, std::to_string(origin_ns)).run();
}

int schema_version(Db& db) {
  Statement& st = db.prepare("SELECT value FROM meta WHERE key = 'schema_version'");
  if (!st.step()) fail(db.path(), "not a wb run file (its meta table has no schema_version)");
  std::string text = st.column_text(0);
  st.reset();
  try {
    std::size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  fail(db.path(), "not a wb run file (meta.schema_version is '" + text + "', expected an integer)");
}

Db open_run(const std::filesystem::path& path, OpenMode mode) {
  if (mode == OpenMode::create) fail(path, "open_run opens existing run files; use Writer to create one");
  check_file_bytes(path);
  Db db(path, mode);
  bool has_meta = false;
  try {
    has_meta = db.query_int64("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'") > 0;
  } catch (const StoreError&) {
    // SQLite's own verdict on damaged files ("file is not a database", "database disk image is malformed").
    std::string why = sqlite3_errmsg(db.handle());
    fail(path, "not a wb run file (" + why + ")");
  }
  if (!has_meta) fail(path, "not a wb run file (an SQLite database without a wb meta table)");
  int version = schema_version(db);
  if (version > kSchemaVersion)
    fail(path, "schema version " + std::to_string(version) + " is newer than this build supports (" +
                   std::to_string(kSchemaVersion) + "); use a newer wb");
  if (version < 1) fail(path, "schema version " + std::to_string(version) + " is not one any wb wrote");
  // An older file: migrated in place when opened for writing, through temp tables when read-only.
  if (version < kSchemaVersion) migrate(db, version, mode == OpenMode::read_write);
  if (mode == OpenMode::read_write) create_indexes(db);
  return db;
}

}  // namespace wb::store
