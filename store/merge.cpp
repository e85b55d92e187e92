// merge_run: per-rank files -> one run file. Each rank file is ATTACHed and copied with INSERT ... SELECT;
// string ids are remapped through a temporary (old id -> new id) table joined on the text, track ids are
// shifted past the tracks already merged, and nonzero correlation ids get the rank in their high bits
// (CUPTI's ids are 32-bit and per process, so ranks would collide otherwise).
#include "store/merge.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "store/db.hpp"
#include "store/migrate.hpp"
#include "store/summary.hpp"

namespace wb::store {
namespace {

constexpr int kCorrRankShift = 40;

struct RankFile {
  int rank = 0;
  std::filesystem::path path;
  std::map<std::string, std::string> meta;
};

std::map<std::string, std::string> read_meta(Db& db) {
  std::map<std::string, std::string> out;
  auto& st = db.prepare("SELECT key, value FROM meta");
  while (st.step()) out.emplace(st.column_text(0), st.column_text(1));
  st.reset();
  return out;
}

std::int64_t meta_int(const RankFile& f, const std::string& key, std::int64_t fallback) {
  auto it = f.meta.find(key);
  if (it == f.meta.end()) return fallback;
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw StoreError(f.path.string() + ": meta." + key + " is '" + it->second + "', expected an integer");
  }
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("''") : std::string(1, c);
  return out + "'";
}

// The rank file as ATTACH names it: read-only (a URI with mode=ro) where SQLite takes URIs, so the
// merge can never write to a rank file, not even a WAL checkpoint.
std::string attach_name(const std::filesystem::path& p) {
  if (!sqlite3_compileoption_used("SQLITE_USE_URI")) return quoted(p.string());
  std::string uri = "file:";
  static const char* kHex = "0123456789ABCDEF";
  for (unsigned char c : std::filesystem::absolute(p).string()) {
    if (std::isalnum(c) || c == '/' || c == '.' || c == '-' || c == '_' || c == '~') {
      uri += static_cast<char>(c);
    } else {
      uri += '%';
      uri += kHex[c >> 4];
      uri += kHex[c & 15];
    }
  }
  return quoted(uri + "?mode=ro");
}

// Linear clock-drift correction of one rank's stored times. A rank stores local time + the offset to
// rank 0 measured at start (o0, at local time t0); the offset measured at the end (o1, at t1) says how
// far the clocks drifted meanwhile. A stored time s (local time s - o0) maps to
//   s + (o1 - o0) * (s - o0 - t0) / (t1 - t0),
// interpolating the offset linearly in local time (and extrapolating outside [t0, t1]).
struct DriftCorrection {
  double slope = 0.0;     // (o1 - o0) / (t1 - t0)
  std::int64_t base = 0;  // o0 + t0: the stored time at which the correction is zero
  bool active = false;

  std::string apply(const std::string& column) const {
    if (!active) return column;
    char slope_text[40];
    std::snprintf(slope_text, sizeof slope_text, "%.17g", slope);
    return "(" + column + " + CAST(round(" + slope_text + " * (" + column + " - " + std::to_string(base) +
           ")) AS INTEGER))";
  }
};

DriftCorrection drift_correction(Db& db, const RankFile& f) {
  DriftCorrection d;
  const std::int64_t t0 = meta_int(f, "clock_sync_start_ns", 0);
  const std::int64_t t1 = meta_int(f, "clock_sync_end_ns", 0);
  if (t0 == 0 || t1 <= t0) return d;  // not measured at both ends (older files, single-process runs)
  const std::string where = " FROM src.rank WHERE rank = " + std::to_string(f.rank);
  if (db.query_int64("SELECT count(*)" + where) != 1) return d;
  const std::int64_t o0 = db.query_int64("SELECT clock_offset_ns" + where);
  const std::int64_t o1 = db.query_int64("SELECT clock_offset_end_ns" + where);
  if (o1 != o0) {
    d.slope = static_cast<double>(o1 - o0) / static_cast<double>(t1 - t0);
    d.base = o0 + t0;
    d.active = true;
  }
  return d;
}

// The rank-<r>.sqlite files of a run directory, by rank.
std::vector<RankFile> find_rank_files(const std::filesystem::path& run_dir) {
  static const std::regex kRankName(R"(rank-(\d+)\.sqlite)");
  std::vector<RankFile> found;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir)) {
    std::smatch m;
    std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, kRankName) && m[1].length() <= 6)
      found.push_back(RankFile{std::stoi(m[1].str()), entry.path(), {}});
  }
  if (found.empty()) throw StoreError(run_dir.string() + ": no rank-<r>.sqlite files to merge");
  std::sort(found.begin(), found.end(), [](const RankFile& a, const RankFile& b) { return a.rank < b.rank; });
  return found;
}

// The rank files that open and hold the rank their name says, with their meta read; each other one is
// named in `skipped` with why.
std::vector<RankFile> readable_rank_files(std::vector<RankFile>& found, std::vector<std::string>& skipped) {
  std::vector<RankFile> files;
  for (auto& f : found) {
    try {
      Db db = open_run(f.path, OpenMode::read_only);
      f.meta = read_meta(db);
      auto recorded = meta_int(f, "rank", f.rank);
      if (recorded != f.rank)
        throw StoreError(f.path.string() + ": holds rank " + std::to_string(recorded) + ", but its name says rank " +
                         std::to_string(f.rank));
      files.push_back(std::move(f));
    } catch (const StoreError& e) {
      skipped.push_back(e.what());
    }
  }
  return files;
}

// Checks that no rank of the world is missing and no rank file was skipped, unless `partial`, where
// each missing rank is named in `skipped` instead.
void check_rank_set(const std::filesystem::path& run_dir, const std::vector<RankFile>& found, int world_size, bool partial,
                    std::vector<std::string>& skipped) {
  std::string missing;
  for (int r = 0, i = 0; r < world_size; ++r) {
    if (i < static_cast<int>(found.size()) && found[static_cast<std::size_t>(i)].rank == r) {
      ++i;
      continue;
    }
    missing += (missing.empty() ? "" : ", ") + ("rank-" + std::to_string(r) + ".sqlite");
    if (partial) skipped.push_back((run_dir / ("rank-" + std::to_string(r) + ".sqlite")).string() + ": missing");
  }
  if (!missing.empty() && !partial)
    throw StoreError(run_dir.string() + ": missing rank files for world_size " + std::to_string(world_size) + ": " +
                     missing + " (wb merge --partial merges the others)");
  if (!skipped.empty() && !partial) {
    std::string list;
    for (const auto& s : skipped) list += (list.empty() ? "" : "; ") + s;
    throw StoreError(list + (skipped.size() > 1 ? " (" + std::to_string(skipped.size()) + " rank files cannot be merged;" : " (")
                     + " wb merge --partial merges the others)");
  }
}

// Copies the attached rank file (src) into the merged file in one transaction: strings remapped, track
// ids shifted, correlation ids tagged with the rank and times drift-corrected; rank 0 also brings the
// job-wide rows.
void copy_rank(Db& db, const RankFile& f) {
  Transaction tx(db);
  std::string track_offset = std::to_string(db.query_int64("SELECT coalesce(max(id), 0) FROM main.track"));
  std::string r = std::to_string(f.rank);
  std::string corr = "(CASE WHEN x.corr_id = 0 THEN 0 ELSE x.corr_id + (" + r + " << " +
                     std::to_string(kCorrRankShift) + ") END)";
  const DriftCorrection drift = drift_correction(db, f);
  auto t = [&](const char* column) { return drift.apply(std::string("x.") + column); };
  db.exec(
      "INSERT OR IGNORE INTO main.string(text) SELECT text FROM src.string ORDER BY id;"
      "CREATE TEMP TABLE smap(old INTEGER PRIMARY KEY, new INTEGER NOT NULL);"
      "INSERT INTO smap SELECT s.id, m.id FROM src.string s JOIN main.string m ON m.text = s.text;");
  db.exec("INSERT INTO main.track(id, rank, kind, name_id) SELECT x.id + " + track_offset + ", " + r +
          ", x.kind, smap.new FROM src.track x CROSS JOIN smap ON smap.old = x.name_id ORDER BY x.id");
  // A rank file of an older schema version lacks the tables and columns later versions added (migrate.hpp).
  const int version = static_cast<int>(meta_int(f, "schema_version", 1));
  // Ranges go straight into range_data, packed against the merged file's time origin: the first rank
  // file's, or its earliest start when it is older than version 5. src.range reads either version.
  const std::int64_t src_origin_ns = meta_int(f, "time_origin_ns", 0);
  const std::string src_origin = std::to_string(src_origin_ns);
  if (db.query_int64("SELECT EXISTS (SELECT 1 FROM main.range_data)") == 0) {
    set_time_origin(db, version >= 5 ? src_origin_ns
                                     : db.query_int64("SELECT coalesce(min(start_ns), 0) FROM src.range"));
  }
  const std::string origin = std::to_string(time_origin(db));
  // The source's ranges with absolute times and their key's kind: a version-5 file's as stored (ranges
  // of equal track, start, depth and category told apart in kind's high bits); an older file's numbered
  // the same way here, since its plain table allowed such ranges.
  const std::string source =
      version >= 5 ? "(SELECT track_id, start_ns + " + src_origin + " AS start_ns, start_ns + dur_ns + " + src_origin +
                         " AS end_ns, kind, name_id, step, corr_id FROM src.range_data)"
                   : "(SELECT track_id, start_ns, end_ns, depth * 16 + category + 4096 * (row_number() OVER "
                     "(PARTITION BY track_id, start_ns, depth, category) - 1) AS kind, name_id, step, corr_id FROM src.range)";
  db.exec("INSERT INTO main.range_data(track_id, start_ns, kind, dur_ns, name_id, step, corr_id) "
          "SELECT x.track_id + " + track_offset + ", " + t("start_ns") + " - " + origin + ", x.kind, " +
          t("end_ns") + " - " + t("start_ns") + ", smap.new, x.step, " +
          corr + " FROM " + source + " x CROSS JOIN smap ON smap.old = x.name_id");
  auto known = [&](const char* column) {  // -1 (unknown) stays -1
    return std::string("CASE WHEN x.") + column + " < 0 THEN -1 ELSE " + t(column) + " END";
  };
  const std::string launch = version >= 3 ? ", x.blocks_per_sm, x.occupancy, " + known("launch_ns") + ", " + known("launch_end_ns") + " "
                                          : std::string(", -1, -1, -1, -1 ");
  db.exec("INSERT INTO main.kernel(track_id, start_ns, end_ns, name_id, corr_id, kind, grid_x, grid_y, grid_z, "
          "block_x, block_y, block_z, bytes, blocks_per_sm, occupancy, launch_ns, launch_end_ns) SELECT x.track_id + " + track_offset +
          ", " + t("start_ns") + ", " + t("end_ns") + ", smap.new, " + corr +
          ", x.kind, x.grid_x, x.grid_y, x.grid_z, x.block_x, x.block_y, x.block_z, x.bytes" + launch +
          "FROM src.kernel x CROSS JOIN smap ON smap.old = x.name_id ORDER BY x.rowid");
  db.exec("INSERT INTO main.counter(track_id, t_ns, value) SELECT x.track_id + " + track_offset + ", " +
          t("t_ns") + ", x.value FROM src.counter x ORDER BY x.rowid");
  db.exec("INSERT INTO main.allreduce(rank, step, bucket, first_param, last_param, bytes, ready_ns, start_ns, "
          "end_ns) SELECT x.rank, x.step, x.bucket, x.first_param, x.last_param, x.bytes, " +
          t("ready_ns") + ", " + t("start_ns") + ", " + t("end_ns") + " FROM src.allreduce x ORDER BY x.rowid");
  db.exec("INSERT INTO main.step(rank, step, start_ns, end_ns, data_wait_ns, comm_exposed_ns, loss, lr, images) "
          "SELECT x.rank, x.step, " + t("start_ns") + ", " + t("end_ns") +
          ", x.data_wait_ns, x.comm_exposed_ns, x.loss, x.lr, x.images FROM src.step x ORDER BY x.rowid");
  auto has = [&](const char* table) { return version >= table_since(table); };
  if (has("pipeline_span")) {
    db.exec("INSERT INTO main.pipeline_span(rank, step, stage, micro, kind, peer, bytes, post_ns, start_ns, end_ns) "
            "SELECT x.rank, x.step, x.stage, x.micro, x.kind, x.peer, x.bytes, " + t("post_ns") + ", " +
            t("start_ns") + ", " + t("end_ns") + " FROM src.pipeline_span x ORDER BY x.rowid");
    db.exec("INSERT INTO main.pipeline_step(rank, step, stage, replica, start_ns, end_ns, busy_ns, wait_act_ns, "
            "wait_grad_ns, wait_allreduce_ns) SELECT x.rank, x.step, x.stage, x.replica, " + t("start_ns") + ", " +
            t("end_ns") + ", x.busy_ns, x.wait_act_ns, x.wait_grad_ns, x.wait_allreduce_ns FROM src.pipeline_step x "
            "ORDER BY x.rowid");
  }
  // Every rank's captured windows (each rank file holds its own rows).
  if (has("capture_window"))
    db.exec("INSERT INTO main.capture_window SELECT * FROM src.capture_window ORDER BY rowid;");
  if (has("comm_calibration"))
    db.exec("INSERT INTO main.comm_calibration SELECT * FROM src.comm_calibration ORDER BY rowid;");
  if (has("memory"))
    db.exec("INSERT INTO main.memory(rank, t_ns, step, bytes, live_bytes, role, name_id) SELECT x.rank, " +
            t("t_ns") + ", x.step, x.bytes, x.live_bytes, x.role, smap.new FROM src.memory x CROSS JOIN smap "
            "ON smap.old = x.name_id ORDER BY x.rowid");
  db.exec("INSERT INTO main.tensor SELECT * FROM src.tensor ORDER BY rowid;"
          "INSERT OR REPLACE INTO main.rank SELECT * FROM src.rank;"
          "DROP TABLE temp.smap;");
  if (f.rank == 0) {
    // Parameters and saved comparisons are the same job-wide; rank 0's copy is the one kept.
    db.exec("INSERT INTO main.param SELECT * FROM src.param;"
            "INSERT INTO main.comparison SELECT * FROM src.comparison;"
            "INSERT INTO main.comparison_row SELECT * FROM src.comparison_row;"
            "INSERT OR REPLACE INTO main.meta SELECT key, value FROM src.meta "
            "WHERE key NOT IN ('rank', 'schema_version', 'time_origin_ns');");
    if (has("evaluation")) db.exec("INSERT INTO main.evaluation SELECT * FROM src.evaluation;");
    if (has("split_trial")) db.exec("INSERT INTO main.split_trial SELECT * FROM src.split_trial;");
  } else {
    // Facts of one rank are keyed '<name>.rank<R>' (an image folder's dumped batch, its bad images).
    db.exec("INSERT OR REPLACE INTO main.meta SELECT key, value FROM src.meta WHERE key GLOB '*.rank[0-9]*';");
  }
  tx.commit();
}

// Attaches a rank file and copies it; false (the file named in `skipped`) when it fails while being
// read and `partial` allows leaving it out.
bool merge_rank(Db& db, const RankFile& f, bool partial, std::vector<std::string>& skipped) {
  db.exec("ATTACH DATABASE " + attach_name(f.path) + " AS src");
  try {
    copy_rank(db, f);
  } catch (const StoreError& e) {
    // A rank file that opened but fails while being read (damaged pages past the header): the
    // transaction rolled back, so nothing of it is in the merged file.
    db.exec("DROP TABLE IF EXISTS temp.smap");
    db.exec("DETACH DATABASE src");
    const std::string why = f.path.string() + ": cannot be merged (" + e.what() + ")";
    if (!partial) throw StoreError(why + "; wb merge --partial merges the others");
    skipped.push_back(why);
    return false;
  }
  db.exec("DETACH DATABASE src");
  return true;
}

// The merged file's own meta: the world size, whether the run is complete, the events dropped over the
// ranks and the rank files left out.
void write_merge_meta(Db& db, int world_size, bool complete, std::int64_t dropped, const std::vector<std::string>& skipped) {
  Transaction tx(db);
  auto& set = db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)");
  set.bind(1, "world_size").bind(2, std::to_string(world_size)).run();
  set.bind(1, "complete").bind(2, complete ? "1" : "0").run();
  set.bind(1, "dropped_events").bind(2, std::to_string(dropped)).run();
  if (!skipped.empty()) {
    std::string list;
    for (const auto& s : skipped) list += (list.empty() ? "" : "\n") + s;
    set.bind(1, "skipped_ranks").bind(2, list).run();
  }
  tx.commit();
}

}  // namespace

std::filesystem::path default_merge_output(const std::filesystem::path& run_dir) {
  auto dir = run_dir;
  while (!dir.empty() && !dir.has_filename() && dir.has_parent_path() && dir != dir.root_path()) dir = dir.parent_path();
  auto out = dir;
  out += ".sqlite";
  return out;
}

MergeResult merge_run(const std::filesystem::path& run_dir, std::filesystem::path out, bool overwrite, bool partial) {
  if (!std::filesystem::is_directory(run_dir))
    throw StoreError(run_dir.string() + ": not a directory (expected a run directory holding rank-<r>.sqlite files)");

  // Find and validate the rank files. Every bad one is named; with `partial` they are left out.
  std::vector<RankFile> found = find_rank_files(run_dir);
  std::vector<std::string> skipped;  // "rank-<r>.sqlite: why"
  std::vector<RankFile> files = readable_rank_files(found, skipped);
  int world_size = found.back().rank + 1;
  if (!files.empty() && files.front().rank == 0)
    world_size = std::max(world_size, static_cast<int>(std::clamp<std::int64_t>(meta_int(files.front(), "world_size", 1), 1, 1 << 20)));
  check_rank_set(run_dir, found, world_size, partial, skipped);
  if (files.empty()) throw StoreError(run_dir.string() + ": no rank file can be merged");

  if (out.empty()) out = default_merge_output(run_dir);
  if (std::filesystem::exists(out) && !overwrite)
    throw StoreError(out.string() + ": already exists (refusing to overwrite; pass overwrite to replace it)");

  // Build into a temporary file, then write its packed copy (write_packed_copy: the appended ranges fill
  // their pages only about seven eighths) where that pays, and rename it, so a failed merge never leaves a
  // half-written run file.
  auto tmp = out;
  tmp += ".partial";
  auto packed = out;
  packed += ".packed";
  std::filesystem::remove(tmp);
  bool complete = true;
  std::int64_t dropped = 0;
  try {
    Db db(tmp, OpenMode::create);
    db.exec("PRAGMA page_size = 16384; PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -131072");
    apply_schema(db, /*indexes=*/false);  // bulk inserts first, indexes once at the end

    std::vector<std::string> merged_ranks;
    for (const RankFile& f : files) {
      if (!merge_rank(db, f, partial, skipped)) continue;
      merged_ranks.push_back(std::to_string(f.rank));
      complete = complete && f.meta.count("complete") > 0 && f.meta.at("complete") == "1";
      dropped += meta_int(f, "dropped_events", 0);
    }
    if (merged_ranks.empty()) throw StoreError(run_dir.string() + ": no rank file can be merged");
    complete = complete && skipped.empty();

    create_indexes(db);
    build_summary(db);  // the timeline's level-of-detail pyramid (summary.hpp)
    write_merge_meta(db, world_size, complete, dropped, skipped);
    try {
      if (!write_packed_copy(db, packed)) packed.clear();
    } catch (const StoreError&) {
      packed.clear();  // the merged file as built, unpacked (a full disk, a file size limit)
    }
  } catch (...) {
    std::filesystem::remove(tmp);
    throw;
  }
  if (packed.empty()) {
    std::filesystem::rename(tmp, out);
  } else {
    std::filesystem::remove(tmp);
    std::filesystem::rename(packed, out);
  }
  return MergeResult{out, world_size, complete, skipped};
}

}  // namespace wb::store
