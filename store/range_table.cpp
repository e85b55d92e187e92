#include "store/range_table.hpp"

#include <sqlite3.h>

#include <algorithm>
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

int bind_range(sqlite3_stmt* h, int base, const RangeRow& r, std::int64_t origin_ns, std::int64_t shift_ns) {
  return sqlite3_bind_int64(h, base + 1, r.track) | sqlite3_bind_int64(h, base + 2, r.start_ns + shift_ns - origin_ns) |
         sqlite3_bind_int64(h, base + 3, range_kind(r)) | sqlite3_bind_int64(h, base + 4, r.end_ns - r.start_ns) |
         sqlite3_bind_int64(h, base + 5, r.name) | sqlite3_bind_int64(h, base + 6, r.step) |
         sqlite3_bind_int64(h, base + 7, static_cast<std::int64_t>(r.corr_id));
}

bool is_key_collision(int rc) { return (rc & 0xff) == SQLITE_CONSTRAINT; }

// One row, moved 1 ns later while its key is taken.
void insert_one(Db& db, const RangeRow& r, std::int64_t origin_ns) {
  sqlite3_stmt* h = db.prepare(insert_sql(1)).handle();
  constexpr std::int64_t kMaxShiftNs = 1 << 20;
  for (std::int64_t shift = 0; shift < kMaxShiftNs; ++shift) {
    WB_SQLITE_CHECK(db.handle(), bind_range(h, 0, r, origin_ns, shift));
    const int rc = sqlite3_step(h);
    sqlite3_reset(h);
    if (rc == SQLITE_DONE) return;
    if (!is_key_collision(rc)) WB_SQLITE_CHECK(db.handle(), rc);
  }
  throw StoreError(db.path().string() + ": track " + std::to_string(r.track) + " has over " +
                   std::to_string(kMaxShiftNs) + " ranges of one depth and category starting at " +
                   std::to_string(r.start_ns) + " ns");
}

}  // namespace

void sort_by_key(std::vector<RangeRow>& rows) {
  auto key_less = [](const RangeRow& a, const RangeRow& b) {
    if (a.track != b.track) return a.track < b.track;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return range_kind(a) < range_kind(b);
  };
  if (!std::is_sorted(rows.begin(), rows.end(), key_less)) std::sort(rows.begin(), rows.end(), key_less);
}

void insert_ranges(Db& db, std::span<const RangeRow> rows, std::int64_t origin_ns) {
  for (const RangeRow& r : rows) {
    if (r.category > 15)
      throw StoreError(db.path().string() + ": range category " + std::to_string(r.category) + " is over 15");
  }
  std::size_t i = 0;
  const std::size_t n = rows.size();
  if (n >= kRowsPerInsert) {
    sqlite3_stmt* h = db.prepare(insert_sql(kRowsPerInsert)).handle();
    for (; i + kRowsPerInsert <= n; i += kRowsPerInsert) {
      int rc = 0;
      for (std::size_t k = 0; k < kRowsPerInsert; ++k)
        rc |= bind_range(h, static_cast<int>(kColumns * k), rows[i + k], origin_ns, 0);
      WB_SQLITE_CHECK(db.handle(), rc);
      rc = sqlite3_step(h);
      sqlite3_reset(h);
      if (rc == SQLITE_DONE) continue;
      if (!is_key_collision(rc)) WB_SQLITE_CHECK(db.handle(), rc);
      // The statement was rolled back as a whole: its rows go one by one.
      for (std::size_t k = 0; k < kRowsPerInsert; ++k) insert_one(db, rows[i + k], origin_ns);
    }
  }
  for (; i < n; ++i) insert_one(db, rows[i], origin_ns);
}

}  // namespace wb::store
