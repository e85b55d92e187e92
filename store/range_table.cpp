#include "store/range_table.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>

namespace wb::store {
namespace {

// 128 rows x 7 columns per statement: the per-statement cost (step, reset, VDBE setup) dominates rows
// this small.
constexpr std::size_t kRowsPerInsert = 128;
constexpr int kColumns = 7;

const std::string& insert_sql(std::size_t rows) {
  static const std::string one =
      "INSERT INTO range_data(track_id, start_ns, kind, dur_ns, name_id, step, corr_id) VALUES (?, ?, ?, ?, ?, ?, ?)";
  static const std::string many = [] {
    std::string sql = one;
    for (std::size_t k = 1; k < kRowsPerInsert; ++k) sql += ", (?, ?, ?, ?, ?, ?, ?)";
    return sql;
  }();
  return rows == 1 ? one : many;
}

int bind_range(sqlite3_stmt* h, int base, const RangeRow& r, std::int64_t origin_ns, std::int64_t seq) {
  return sqlite3_bind_int64(h, base + 1, r.track) | sqlite3_bind_int64(h, base + 2, r.start_ns - origin_ns) |
         sqlite3_bind_int64(h, base + 3, range_kind(r) + kEqualKeyStep * seq) |
         sqlite3_bind_int64(h, base + 4, r.end_ns - r.start_ns) |
         sqlite3_bind_int64(h, base + 5, r.name) | sqlite3_bind_int64(h, base + 6, r.step) |
         sqlite3_bind_int64(h, base + 7, static_cast<std::int64_t>(r.corr_id));
}

// Each row's number among the ranges of its key (track, start, depth and category): 0 for the first,
// counting those already in range_data. Rows are in key order, so equal keys in the batch are adjacent;
// only a row that starts no later than its track's last stored start can meet a stored one (an enclosing
// range recorded after what it encloses was committed), and only those are looked up.
std::vector<std::int64_t> equal_key_numbers(Db& db, std::span<const RangeRow> rows, std::int64_t origin_ns) {
  std::vector<std::int64_t> seq(rows.size(), 0);
  std::map<std::uint32_t, std::optional<std::int64_t>> last_start;  // per track, relative
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const RangeRow& r = rows[i];
    if (i > 0 && rows[i - 1].track == r.track && rows[i - 1].start_ns == r.start_ns &&
        range_kind(rows[i - 1]) == range_kind(r)) {
      seq[i] = seq[i - 1] + 1;
      continue;
    }
    auto it = last_start.find(r.track);
    if (it == last_start.end()) {
      auto& st = db.prepare("SELECT max(start_ns) FROM range_data WHERE track_id = ?");
      st.bind(1, r.track);
      std::optional<std::int64_t> last;
      if (st.step() && !st.column_is_null(0)) last = st.column_int64(0);
      st.reset();
      it = last_start.emplace(r.track, last).first;
    }
    if (!it->second || r.start_ns - origin_ns > *it->second) continue;
    auto& st = db.prepare("SELECT max(kind) FROM range_data WHERE track_id = ? AND start_ns = ? AND kind & 4095 = ?");
    st.bind(1, r.track).bind(2, r.start_ns - origin_ns).bind(3, range_kind(r));
    if (st.step() && !st.column_is_null(0)) seq[i] = st.column_int64(0) / kEqualKeyStep + 1;
    st.reset();
  }
  return seq;
}

}  // namespace

void sort_by_key(std::vector<RangeRow>& rows) {
  auto key_less = [](const RangeRow& a, const RangeRow& b) {
    if (a.track != b.track) return a.track < b.track;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return range_kind(a) < range_kind(b);
  };
  // Stable: ranges of equal key keep the order they were recorded in, which their kinds then number.
  if (!std::is_sorted(rows.begin(), rows.end(), key_less)) std::stable_sort(rows.begin(), rows.end(), key_less);
}

void insert_ranges(Db& db, std::span<const RangeRow> rows, std::int64_t origin_ns) {
  for (const RangeRow& r : rows) {
    if (r.category > 15)
      throw StoreError(db.path().string() + ": range category " + std::to_string(r.category) + " is over 15");
  }
  const std::vector<std::int64_t> seq = equal_key_numbers(db, rows, origin_ns);
  // No insert may fail on the key: a run file written in bulk has no journal (journal_mode OFF), so a
  // failed statement could not be rolled back to retry it.
  std::size_t i = 0;
  const std::size_t n = rows.size();
  if (n >= kRowsPerInsert) {
    sqlite3_stmt* h = db.prepare(insert_sql(kRowsPerInsert)).handle();
    for (; i + kRowsPerInsert <= n; i += kRowsPerInsert) {
      int rc = 0;
      for (std::size_t k = 0; k < kRowsPerInsert; ++k)
        rc |= bind_range(h, static_cast<int>(kColumns * k), rows[i + k], origin_ns, seq[i + k]);
      WB_SQLITE_CHECK(db.handle(), rc);
      rc = sqlite3_step(h);
      sqlite3_reset(h);
      WB_SQLITE_CHECK(db.handle(), rc);
    }
  }
  if (i < n) {
    sqlite3_stmt* h = db.prepare(insert_sql(1)).handle();
    for (; i < n; ++i) {
      WB_SQLITE_CHECK(db.handle(), bind_range(h, 0, rows[i], origin_ns, seq[i]));
      const int rc = sqlite3_step(h);
      sqlite3_reset(h);
      WB_SQLITE_CHECK(db.handle(), rc);
    }
  }
}

}  // namespace wb::store
