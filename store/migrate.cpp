#include "store/migrate.hpp"

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "store/range_table.hpp"
#include "store/row_decode.hpp"

namespace wb::store {

namespace {

// A table a step adds, as that version created it (frozen: a later version changes it in its own step).
struct Table {
  const char* name;
  const char* columns;  // the CREATE TABLE's column list
};

// A column a step adds to an existing table, with the value rows written before it take.
struct Column {
  const char* table;
  const char* name;
  const char* type;          // "REAL", "INTEGER"
  const char* default_value; // SQL literal
};

// A step that restructures a table rather than adding one: persist = false builds read-only stand-ins in
// the connection's temp schema.
using Restructure = void (*)(Db& db, bool persist);

void pack_ranges(Db& db, bool persist);

struct Step {
  int to;               // the version this step produces
  Table tables[8];      // the tables it adds (the rest null)
  Column columns[4];    // the columns it adds (the rest null)
  Restructure restructure = nullptr;
};

const Step kSteps[] = {
    {2,
     {{"evaluation", "step INTEGER NOT NULL, top1 REAL NOT NULL, top5 REAL NOT NULL, images INTEGER NOT NULL, "
                     "seconds REAL NOT NULL"},
      {"pipeline_span", "rank INTEGER NOT NULL, step INTEGER NOT NULL, stage INTEGER NOT NULL, micro INTEGER NOT NULL, "
                        "kind TEXT NOT NULL, peer INTEGER NOT NULL, bytes INTEGER NOT NULL, post_ns INTEGER NOT NULL, "
                        "start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL"},
      {"pipeline_step", "rank INTEGER NOT NULL, step INTEGER NOT NULL, stage INTEGER NOT NULL, replica INTEGER NOT NULL, "
                        "start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, busy_ns INTEGER NOT NULL, "
                        "wait_act_ns INTEGER NOT NULL, wait_grad_ns INTEGER NOT NULL, wait_allreduce_ns INTEGER NOT NULL"},
      {"capture_window", "rank INTEGER NOT NULL, first_step INTEGER NOT NULL, last_step INTEGER NOT NULL, "
                         "trigger TEXT NOT NULL, trigger_step INTEGER NOT NULL, detail TEXT NOT NULL"},
      {"memory", "rank INTEGER NOT NULL, t_ns INTEGER NOT NULL, step INTEGER NOT NULL, bytes INTEGER NOT NULL, "
                 "live_bytes INTEGER NOT NULL, role INTEGER NOT NULL, name_id INTEGER NOT NULL"}},
     {}},
    {3,
     {},
     {{"kernel", "blocks_per_sm", "REAL", "-1"}, {"kernel", "occupancy", "REAL", "-1"},
      {"kernel", "launch_ns", "INTEGER", "-1"}, {"kernel", "launch_end_ns", "INTEGER", "-1"}}},
    {4,
     {{"comm_calibration", "rank INTEGER NOT NULL, kind TEXT NOT NULL, bytes INTEGER NOT NULL, reps INTEGER NOT NULL, "
                           "median_ns INTEGER NOT NULL, min_ns INTEGER NOT NULL"},
      {"split_trial", "round INTEGER NOT NULL, candidate TEXT NOT NULL, split TEXT NOT NULL, steps INTEGER NOT NULL, "
                      "median_step_ns INTEGER NOT NULL, predicted_step_ns INTEGER NOT NULL, alpha_beta_ns INTEGER NOT NULL, "
                      "exit_code INTEGER NOT NULL, "
                      "run TEXT NOT NULL, utc TEXT NOT NULL"}},
     {}},
    {5, {}, {}, pack_ranges},
};

// Version 5's range storage, frozen as that version created it.
constexpr const char* kRangeDataV5 =
    "CREATE TABLE range_data (track_id INTEGER NOT NULL, start_ns INTEGER NOT NULL, kind INTEGER NOT NULL, "
    "dur_ns INTEGER NOT NULL, name_id INTEGER NOT NULL, step INTEGER NOT NULL, corr_id INTEGER NOT NULL, "
    "PRIMARY KEY (track_id, start_ns, kind)) WITHOUT ROWID";
constexpr const char* kOriginV5 = "(SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'time_origin_ns')";

// Version 5: `range` (a table with an index on track and start) becomes range_data, packed and keyed by
// track and start, read through a view named `range` with the old columns. The rows are copied in key
// order, in batches; read-only, range_data is a temp view over the old table, with the origin 0.
void pack_ranges(Db& db, bool persist) {
  if (!persist) {
    db.exec("CREATE TEMP VIEW range_data AS SELECT track_id, start_ns, depth * 16 + category AS kind, "
            "end_ns - start_ns AS dur_ns, name_id, step, corr_id FROM main.range");
    return;
  }
  const std::int64_t origin = db.query_int64("SELECT coalesce(min(start_ns), 0) FROM range");
  db.exec("ALTER TABLE range RENAME TO range_v4");
  db.exec(kRangeDataV5);
  db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES ('time_origin_ns', ?)").bind(1, std::to_string(origin)).run();
  auto& st = db.prepare(
      "SELECT track_id, start_ns, end_ns, name_id, category, depth, step, corr_id FROM range_v4 "
      "ORDER BY track_id, start_ns, depth, category");
  std::vector<RangeRow> batch;
  constexpr std::size_t kBatch = 1 << 16;
  auto flush = [&] {
    insert_ranges(db, batch, origin);
    batch.clear();
  };
  while (st.step()) {
    batch.push_back(detail::decoded(st, detail::range_from));  // a damaged time is a StoreError
    if (batch.size() == kBatch) flush();
  }
  st.reset();
  flush();
  db.exec("DROP TABLE range_v4");
  db.exec(std::string("CREATE VIEW range AS SELECT track_id, start_ns + ") + kOriginV5 + " AS start_ns, start_ns + dur_ns + " +
          kOriginV5 + " AS end_ns, name_id, kind & 15 AS category, (kind >> 4) & 255 AS depth, step, corr_id FROM range_data");
  db.exec(std::string("CREATE TRIGGER range_insert INSTEAD OF INSERT ON range BEGIN INSERT INTO range_data(track_id, "
                      "start_ns, kind, dur_ns, name_id, step, corr_id) VALUES (NEW.track_id, NEW.start_ns - ") +
          kOriginV5 + ", NEW.depth * 16 + NEW.category + 4096 * (SELECT count(*) FROM range_data WHERE track_id = "
          "NEW.track_id AND start_ns = NEW.start_ns - " + kOriginV5 + " AND kind & 4095 = NEW.depth * 16 + NEW.category), "
          "NEW.end_ns - NEW.start_ns, NEW.name_id, NEW.step, NEW.corr_id); END");
}

// The column names of a column list ("a INTEGER NOT NULL, b REAL" -> "a, b").
std::string column_names(std::string_view columns) {
  std::string out;
  for (std::size_t start = 0; start < columns.size();) {
    std::size_t comma = columns.find(',', start);
    if (comma == std::string_view::npos) comma = columns.size();
    std::string_view col = columns.substr(start, comma - start);
    while (!col.empty() && col.front() == ' ') col.remove_prefix(1);
    out += (out.empty() ? "" : ", ") + std::string(col.substr(0, col.find(' ')));
    start = comma + 1;
  }
  return out;
}

// The column names of `table` in the file ("" when it has no such table).
std::string file_columns(Db& db, const char* table) {
  std::string out;
  auto& st = db.prepare(std::string("SELECT name FROM pragma_table_info('") + table + "')");
  while (st.step()) out += (out.empty() ? "" : ", ") + st.column_text(0);
  st.reset();
  return out;
}

// The columns the steps after `from` add: in place (ALTER TABLE), or, read-only, as a temp view of the
// same name over the file's table with the new columns at their defaults (unqualified names find it).
void add_columns(Db& db, int from, bool persist) {
  std::map<std::string, std::string> view_columns;  // table -> ", default AS name, ..."
  for (const Step& s : kSteps) {
    if (s.to <= from) continue;
    for (const Column& c : s.columns) {
      if (c.table == nullptr) continue;
      const std::string have = ", " + file_columns(db, c.table) + ",";
      if (have.find(std::string(", ") + c.name + ",") != std::string::npos) continue;
      if (persist) {
        db.exec(std::string("ALTER TABLE ") + c.table + " ADD COLUMN " + c.name + " " + c.type + " NOT NULL DEFAULT " +
                c.default_value);
      } else {
        view_columns[c.table] += std::string(", ") + c.default_value + " AS " + c.name;
      }
    }
  }
  for (const auto& [table, extra] : view_columns)
    db.exec("CREATE TEMP VIEW " + table + " AS SELECT *" + extra + " FROM main." + table);
}

}  // namespace

int table_since(std::string_view table) {
  for (const Step& s : kSteps) {
    for (const Table& t : s.tables) {
      if (t.name != nullptr && table == t.name) return s.to;
    }
  }
  return 1;
}

void migrate(Db& db, int from, bool persist) {
  if (from < 1 || from >= kSchemaVersion) {
    throw StoreError(db.path().string() + ": no migration from schema version " + std::to_string(from) + " to " +
                     std::to_string(kSchemaVersion));
  }
  Transaction tx(db);
  for (const Step& s : kSteps) {
    if (s.to <= from) continue;
    for (const Table& t : s.tables) {
      if (t.name == nullptr) continue;
      // Builds of one version did not all write the same tables: a table the file already has is kept
      // (its rows are the run's), provided it has the columns the step would give it.
      const std::string have = file_columns(db, t.name), want = column_names(t.columns);
      if (have.empty()) {
        db.exec(std::string("CREATE ") + (persist ? "" : "TEMP ") + "TABLE " + t.name + " (" + t.columns + ")");
      } else if (have != want) {
        throw StoreError(db.path().string() + ": schema version " + std::to_string(from) + " file's table " + t.name +
                         " has the columns (" + have + "), expected (" + want + ")");
      }
    }
  }
  add_columns(db, from, persist);
  for (const Step& s : kSteps) {
    if (s.to > from && s.restructure != nullptr) s.restructure(db, persist);
  }
  if (persist) {
    db.exec("PRAGMA user_version = " + std::to_string(kSchemaVersion));
    db.prepare("UPDATE meta SET value = ? WHERE key = 'schema_version'").bind(1, std::to_string(kSchemaVersion)).run();
  }
  tx.commit();
}

}  // namespace wb::store
