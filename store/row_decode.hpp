// Internals shared by the Reader and the schema migration (reader.cpp, migrate.cpp): decoding a row's
// columns with the raw SQLite API, times checked. Not part of the store's public API.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "store/db.hpp"
#include "store/rows.hpp"

namespace wb::store::detail {

// Times and durations (ns) beyond +-2^62 (146 years) come only from a damaged or foreign file, and
// differences of such values overflow: reading one is an error naming the column.
constexpr std::int64_t kTimeLimitNs = std::int64_t{1} << 62;

struct TimeOutOfRange {
  int column;
  std::string value;
};

// A time or duration column of the current row; throws TimeOutOfRange (collect names the file).
inline std::int64_t time_ns(sqlite3_stmt* h, int col) {
  if (sqlite3_column_type(h, col) == SQLITE_FLOAT) {  // SQLite would saturate a huge REAL to INT64_MIN/MAX
    const double d = sqlite3_column_double(h, col);
    if (!(d >= -static_cast<double>(kTimeLimitNs) && d <= static_cast<double>(kTimeLimitNs))) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", d);
      throw TimeOutOfRange{col, text};
    }
    return static_cast<std::int64_t>(d);
  }
  const std::int64_t v = sqlite3_column_int64(h, col);
  if (v < -kTimeLimitNs || v > kTimeLimitNs) throw TimeOutOfRange{col, std::to_string(v)};
  return v;
}

// decode(h) of the statement's current row; a time out of range becomes a StoreError naming the file
// and the column (the statement is reset first).
template <typename Decode>
auto decoded(Statement& st, Decode&& decode) {
  try {
    return decode(st.handle());
  } catch (const TimeOutOfRange& e) {
    sqlite3_stmt* h = st.handle();
    const char* file = sqlite3_db_filename(sqlite3_db_handle(h), "main");
    const char* column = sqlite3_column_name(h, e.column);
    StoreError error(std::string(file ? file : "run file") + ": " + (column ? column : "a time column") + " " +
                     e.value + " is out of range (expected nanoseconds within +-2^62; the file is damaged or not a run file)");
    st.reset();
    throw error;
  }
}

// Reads the current row of a SELECT of `range`'s columns (track_id, start_ns, end_ns, name_id, category,
// depth, step, corr_id) with the raw API: loading millions of ranges is the hot path of the app.
inline RangeRow range_from(sqlite3_stmt* h) {
  RangeRow r;
  r.track = static_cast<std::uint32_t>(sqlite3_column_int64(h, 0));
  r.start_ns = time_ns(h, 1);
  r.end_ns = time_ns(h, 2);
  r.name = static_cast<std::uint32_t>(sqlite3_column_int64(h, 3));
  r.category = static_cast<std::uint8_t>(sqlite3_column_int(h, 4));
  r.depth = static_cast<std::uint8_t>(sqlite3_column_int(h, 5));
  r.step = sqlite3_column_int(h, 6);
  r.corr_id = static_cast<std::uint64_t>(sqlite3_column_int64(h, 7));
  return r;
}

}  // namespace wb::store::detail
