#pragma once
// The run file's schema versions and the steps between them. A file opens at the version this build
// writes (kSchemaVersion) or through the migration steps from its own:
//   version 1  meta, string, rank, track, range, kernel, counter, allreduce, step, param, tensor,
//              comparison, comparison_row
//   version 2  adds evaluation, pipeline_span, pipeline_step, capture_window and memory (empty in a
//              migrated file: a version-1 build recorded none of them)
//   version 3  adds kernel.blocks_per_sm, occupancy, launch_ns and launch_end_ns (-1 in a migrated file:
//              unknown)
//   version 4  adds comm_calibration and split_trial (empty in a migrated file)
//   version 5  stores host ranges packed in range_data (WITHOUT ROWID, keyed by track, start and depth *
//              16 + category; start relative to meta.time_origin_ns; a duration for the end), read and
//              inserted through a view named `range` with the old columns. Migrated: the rows are copied
//              in key order and the old table and its index dropped; read-only: range_data is a temp view
//              over the old table.
// Each step's SQL is frozen here as it was at its version; schema.sql is always the newest schema. Builds
// of one version did not all write the same tables (version-1 files of later builds already have some
// of version 2's): a table a file has is kept, rows and all, when its columns are the step's, and is an
// error naming both column lists when they are not.
// A file opened for writing is migrated in place, in one transaction (user_version and
// meta.schema_version updated). A file opened read-only is left untouched: the tables it lacks are
// created empty in the connection's temp schema, where unqualified names find them, and a table that
// lacks columns is seen through a temp view of the same name that adds them at their defaults.

#include <string_view>

#include "store/db.hpp"

namespace wb::store {

// The schema version that introduced `table` (1 for the first schema's tables and for unknown names).
int table_since(std::string_view table);

// Brings `db`, a run file of schema version `from` (1 <= from < kSchemaVersion), to kSchemaVersion:
// in place (persist = true) or through temp tables (persist = false). Throws StoreError.
void migrate(Db& db, int from, bool persist);

}  // namespace wb::store
