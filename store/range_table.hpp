#pragma once
// range_data, the packed form of the run file's host ranges (schema.sql): a start relative to
// meta.time_origin_ns, depth and category in one `kind`, a duration for the end, keyed by (track, start,
// kind) in a WITHOUT ROWID table. The Writer, the schema migration and wb merge insert through here.

#include <cstdint>
#include <span>
#include <vector>

#include "store/db.hpp"
#include "store/rows.hpp"

namespace wb::store {

// range_data.kind of a range: depth * 16 + category (categories are < 16, depths < 256). A range whose
// key another range already has gets 4096 more per such range: times are never moved.
constexpr std::int64_t range_kind(const RangeRow& r) { return std::int64_t{r.depth} * 16 + (r.category & 15); }
inline constexpr std::int64_t kEqualKeyStep = 4096;

// Orders rows by range_data's key: track, start, then depth and category. Inserting in that order touches
// each track's last page only.
void sort_by_key(std::vector<RangeRow>& rows);

// Inserts `rows`, in key order (sort_by_key), into range_data (the caller holds the transaction). A
// range whose key other ranges already have (same track, start, depth and category: only a clock coarser
// than 1 ns gives that) is kept with 4096 added to its kind per such range. Throws StoreError on a
// failure, and for a category over 15.
void insert_ranges(Db& db, std::span<const RangeRow> rows, std::int64_t origin_ns);

}  // namespace wb::store
