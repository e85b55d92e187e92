// A thin RAII layer over SQLite: Db (a connection with a statement cache), Statement, Transaction,
// one error-checking function, and opening/validating/migrating run files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "store/one_line.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace wb::store {

// Every store failure. The message always starts with the file it concerns.
class StoreError : public std::runtime_error {
 public:
  explicit StoreError(const std::string& what) : std::runtime_error(one_line(what)) {}
};

// The schema version this build writes; PRAGMA user_version and meta.schema_version both hold it.
inline constexpr int kSchemaVersion = 5;  // store/migrate.hpp: what each version holds

// Turns a non-OK SQLite result into a StoreError naming the file, the statement, SQLite's message and
// the caller's file:line. SQLITE_ROW and SQLITE_DONE count as success.
void sqlite_check(int rc, sqlite3* db, std::string_view what, const char* file, int line);
#define WB_SQLITE_CHECK(db, call) ::wb::store::sqlite_check((call), (db), #call, __FILE__, __LINE__)

class Db;

// A prepared statement. Parameters are 1-based, result columns 0-based, as in SQLite.
class Statement {
 public:
  Statement(Db& db, std::string_view sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  template <typename T>
    requires std::is_integral_v<T>
  Statement& bind(int i, T v) {
    return bind_int64(i, static_cast<std::int64_t>(v));
  }
  Statement& bind(int i, double v);
  Statement& bind(int i, std::string_view text);
  Statement& bind(int i, const char* text) { return bind(i, std::string_view(text)); }
  Statement& bind(int i, const std::string& text) { return bind(i, std::string_view(text)); }
  Statement& bind(int i, std::span<const std::byte> blob);
  Statement& bind_null(int i);
  Statement& bind_int64(int i, std::int64_t v);

  // Runs one step: true when a row is available, false when done.
  bool step();
  // Runs a statement that returns no rows to completion, then resets it.
  void run();
  // Resets for re-execution and clears bindings.
  void reset();

  int column_count() const;
  bool column_is_null(int i) const;
  std::int64_t column_int64(int i) const;
  double column_double(int i) const;
  std::string column_text(int i) const;
  std::string_view column_text_view(int i) const;  // valid until the next step/reset
  std::span<const std::byte> column_blob(int i) const;  // valid until the next step/reset

  const std::string& sql() const { return sql_; }
  sqlite3_stmt* handle() const { return stmt_; }

 private:
  void check(int rc, std::string_view what) const;
  sqlite3* db_;  // not Db&: a Db may be moved while its cached statements live on
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
};

enum class OpenMode { create, read_write, read_only };

// One SQLite connection. Statements from prepare() are cached by SQL text for the Db's lifetime.
class Db {
 public:
  Db(const std::filesystem::path& path, OpenMode mode);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  Db(Db&& other) noexcept;
  Db& operator=(Db&&) = delete;

  // Runs one or more statements that return no rows.
  void exec(std::string_view sql);
  // The cached statement for this SQL text, reset and with bindings cleared.
  Statement& prepare(std::string_view sql);
  // Drops every cached statement (needed before DETACH of a database they refer to).
  void clear_statement_cache();

  std::int64_t last_insert_rowid() const;
  std::int64_t changes() const;
  // A single integer from a query returning one row (e.g. "SELECT count(*) FROM range").
  std::int64_t query_int64(std::string_view sql);

  const std::filesystem::path& path() const { return path_; }
  OpenMode mode() const { return mode_; }
  sqlite3* handle() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
  OpenMode mode_;
  std::unordered_map<std::string, std::unique_ptr<Statement>> cache_;
};

// BEGIN IMMEDIATE in the constructor; rolls back in the destructor unless commit() was called.
class Transaction {
 public:
  explicit Transaction(Db& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Db& db_;
  bool done_ = false;
};

// Creates the current schema in an empty database (tables, indexes, meta.schema_version, user_version).
// With indexes = false the indexes are left out, for bulk loading; create_indexes adds them afterwards.
void apply_schema(Db& db, bool indexes = true);

// The schema's CREATE INDEX statements, as "CREATE INDEX IF NOT EXISTS ...".
const std::vector<std::string>& schema_index_sql();
// Creates the schema's indexes that are missing (after a bulk load, or in a file whose writer was killed
// before it built them).
void create_indexes(Db& db);

// Writes a copy of the file `db` is open on to `to` (replaced if it exists) with the pages of every table
// and index packed full, SQLite's VACUUM INTO, when that pays, and returns whether it did. Appending rows in
// key order fills a WITHOUT ROWID table's pages (range_data's) only about seven eighths full; a table copied
// whole is packed. The copy costs the whole file, so a file that is mostly dumped tensors (a step dump) is
// not copied. `db` must have no transaction open. Throws StoreError, leaving no file at `to`.
bool write_packed_copy(Db& db, const std::filesystem::path& to);

// meta.time_origin_ns: range_data stores starts relative to it, so that they take 6 bytes, not 8. Unset
// (files of versions 1-4, read through the migration), it is 0. It can be set only while range_data is
// empty (StoreError otherwise).
std::int64_t time_origin(Db& db);
void set_time_origin(Db& db, std::int64_t origin_ns);

// Opens an existing run file and validates it. Errors (StoreError, message starting with the path):
// missing file; empty, truncated or non-SQLite bytes ("not a wb run file (...)"); an SQLite file of
// another application (no meta table or no schema_version); a version newer than kSchemaVersion (names
// both). An older version is migrated (store/migrate.hpp): in place in read_write mode, through temp
// tables in read_only mode (the file is not touched).
// In read_write mode, missing indexes are created (a killed writer leaves none, see Writer).
Db open_run(const std::filesystem::path& path, OpenMode mode = OpenMode::read_only);

// The schema version recorded in an open run file (meta.schema_version).
int schema_version(Db& db);

}  // namespace wb::store
