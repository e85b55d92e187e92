// Opening files that are not valid run files gives one clear StoreError, never a crash.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"
#include "support/peers.hpp"

using namespace wb::store;
using wb::test::TempDir;
using Catch::Contains;

namespace {

void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A complete run file with enough rows to span many pages.
void make_run(const std::filesystem::path& p, int rows) {
  WriterOptions o;
  o.path = p;
  o.handle_signals = false;
  Writer w(o);
  auto track = w.add_track(TrackKind::thread, "main");
  auto name = w.intern("op");
  for (int i = 0; i < rows; ++i) w.add(RangeRow{track, name, i * 10LL, i * 10LL + 5, 0, 0, 0, 0});
  w.finish();
}

std::string open_error(const std::filesystem::path& p) {
  return wb::test::error_message<StoreError>([&] { Reader r(p); });
}

}  // namespace

TEST_CASE("invalid files give a StoreError naming the file and the reason", "[store]") {
  TempDir dir;

  SECTION("random bytes") {
    std::mt19937 rng(1);
    std::string bytes(10000, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    write_bytes(dir / "random.sqlite", bytes);
    REQUIRE_THROWS_AS(Reader(dir / "random.sqlite"), StoreError);
    auto msg = open_error(dir / "random.sqlite");
    CHECK_THAT(msg, Contains("random.sqlite: not a wb run file (not an SQLite database)"));
  }
  SECTION("empty file") {
    write_bytes(dir / "empty.sqlite", "");
    REQUIRE_THROWS_AS(Reader(dir / "empty.sqlite"), StoreError);
    CHECK_THAT(open_error(dir / "empty.sqlite"), Contains("empty.sqlite: not a wb run file (empty file)"));
  }
  SECTION("truncated run file") {
    make_run(dir / "full.sqlite", 200'000);
    auto size = std::filesystem::file_size(dir / "full.sqlite");
    REQUIRE(size > 1'000'000);
    for (auto keep : {size / 2, std::uintmax_t{60}}) {
      CAPTURE(keep);
      std::filesystem::copy_file(dir / "full.sqlite", dir / "cut.sqlite", std::filesystem::copy_options::overwrite_existing);
      std::filesystem::resize_file(dir / "cut.sqlite", keep);
      REQUIRE_THROWS_AS(Reader(dir / "cut.sqlite"), StoreError);
      auto msg = open_error(dir / "cut.sqlite");
      CHECK_THAT(msg, Contains("cut.sqlite: not a wb run file (truncated"));
    }
  }
  SECTION("corrupted pages inside a run file") {
    make_run(dir / "bad.sqlite", 50'000);
    {
      std::fstream f(dir / "bad.sqlite", std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(16384);  // page 2 onwards: the schema's b-tree pages
      std::string junk(16384 * 3, '\x5a');
      f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    }
    // Opening or the first full read fails with a StoreError, never a crash.
    auto read_all = [&] {
      Reader r(dir / "bad.sqlite");
      for (const auto& t : r.tracks()) r.ranges(t.id);
      r.row_counts();
    };
    REQUIRE_THROWS_AS(read_all(), StoreError);
    CHECK_THAT(wb::test::error_message<StoreError>(read_all), Contains("bad.sqlite"));
  }
  SECTION("SQLite file of another application") {
    {
      Db db(dir / "other.sqlite", OpenMode::create);
      db.exec("CREATE TABLE songs(id INTEGER PRIMARY KEY, title TEXT); INSERT INTO songs(title) VALUES ('x')");
    }
    REQUIRE_THROWS_AS(Reader(dir / "other.sqlite"), StoreError);
    CHECK_THAT(open_error(dir / "other.sqlite"),
               Contains("other.sqlite: not a wb run file (an SQLite database without a wb meta table)"));
    {
      Db db(dir / "other2.sqlite", OpenMode::create);
      db.exec("CREATE TABLE meta(key TEXT, value TEXT); INSERT INTO meta VALUES ('owner', 'someone else')");
    }
    CHECK_THAT(open_error(dir / "other2.sqlite"), Contains("other2.sqlite: not a wb run file (its meta table has no schema_version)"));
  }
  SECTION("missing file and directory") {
    REQUIRE_THROWS_AS(Reader(dir / "absent.sqlite"), StoreError);
    CHECK_THAT(open_error(dir / "absent.sqlite"), Contains("absent.sqlite: no such file"));
    CHECK_THAT(open_error(dir.path()), Contains("is a directory"));
  }
}

TEST_CASE("a time beyond +-2^62 ns is a StoreError naming the file and the column", "[store]") {
  // Differences of such values overflow in every analysis; only a damaged or foreign file holds them.
  TempDir dir;
  const auto path = dir / "times.sqlite";
  {
    WriterOptions o;
    o.path = path;
    o.handle_signals = false;
    Writer w(o);
    auto track = w.add_track(TrackKind::thread, "main");
    w.add(RangeRow{track, w.intern("op"), 10, 20, 0, 0, 0, 0});
    w.add(StepRow{0, 0, 1000, 2000, 0, 0, 2.0, 0.1, 32});
    w.finish();
  }
  {
    Reader r(path);
    REQUIRE(r.steps().size() == 1);
    REQUIRE(r.ranges(r.tracks().at(0).id).size() == 1);
  }
  const std::int64_t limit = std::int64_t{1} << 62;
  struct Case {
    const char* sql;
    const char* column;
  };
  for (const Case& c : {Case{"UPDATE step SET start_ns = -6.08e154", "start_ns -6.08e+154"},  // a REAL, as the fuzzer found
                        Case{"UPDATE step SET end_ns = 9223372036854775807", "end_ns 9223372036854775807"},
                        Case{"UPDATE step SET data_wait_ns = -9223372036854775808", "data_wait_ns -9223372036854775808"},
                        Case{"UPDATE range_data SET dur_ns = 4611686018427387905 - start_ns - "
                             "(SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'time_origin_ns')",
                             "end_ns 4611686018427387905"}}) {
    CAPTURE(c.sql);
    std::filesystem::copy_file(path, dir / "bad.sqlite", std::filesystem::copy_options::overwrite_existing);
    {
      Db db(dir / "bad.sqlite", OpenMode::read_write);
      db.exec(c.sql);
    }
    auto read_all = [&] {
      Reader r(dir / "bad.sqlite");
      r.steps();
      for (const auto& t : r.tracks()) r.ranges(t.id);
    };
    const std::string msg = wb::test::error_message<StoreError>(read_all);
    CHECK_THAT(msg, Contains("bad.sqlite: ") && Contains(c.column) && Contains("is out of range"));
    CHECK(msg.find('\n') == std::string::npos);
  }
  // The limit itself is accepted.
  {
    Db db(path, OpenMode::read_write);
    db.exec("UPDATE step SET end_ns = " + std::to_string(limit));
  }
  Reader r(path);
  CHECK(r.steps().at(0).end_ns == limit);
}

TEST_CASE("schema versions: a newer one is refused naming both, an unknown older one is refused", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  make_run(path, 10);
  auto set_version = [&](int v) {
    Db db(path, OpenMode::read_write);
    db.prepare("UPDATE meta SET value = ? WHERE key = 'schema_version'").bind(1, std::to_string(v)).run();
    db.exec("PRAGMA user_version = " + std::to_string(v));
  };

  SECTION("newer") {
    set_version(kSchemaVersion + 1);
    REQUIRE_THROWS_AS(Reader(path), StoreError);
    auto msg = open_error(path);
    CHECK_THAT(msg, Contains("run.sqlite: schema version " + std::to_string(kSchemaVersion + 1) +
                             " is newer than this build supports (" + std::to_string(kSchemaVersion) + ")"));
    REQUIRE_THROWS_AS(open_run(path, OpenMode::read_write), StoreError);
  }
  SECTION("older than any wb wrote") {
    set_version(0);
    REQUIRE_THROWS_AS(Reader(path), StoreError);
    CHECK_THAT(open_error(path), Contains("run.sqlite: schema version 0 is not one any wb wrote"));
    REQUIRE_THROWS_AS(open_run(path, OpenMode::read_write), StoreError);
  }
  SECTION("not an integer") {
    {
      Db db(path, OpenMode::read_write);
      db.exec("UPDATE meta SET value = 'one' WHERE key = 'schema_version'");
    }
    CHECK_THAT(open_error(path), Contains("meta.schema_version is 'one', expected an integer"));
  }
  SECTION("current version opens") {
    Reader r(path);
    CHECK(r.row_counts().at("range") == 10);
  }
}

TEST_CASE("Writer refuses to overwrite an existing file unless asked", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  make_run(path, 5);
  WriterOptions o;
  o.path = path;
  o.handle_signals = false;
  REQUIRE_THROWS_AS(Writer(o), StoreError);
  CHECK_THAT(wb::test::error_message<StoreError>([&] { Writer w(o); }), Contains("run.sqlite: already exists"));
  o.overwrite = true;
  {
    Writer w(o);
    w.finish();
  }
  Reader r(path);
  CHECK(r.row_counts().at("range") == 0);
  CHECK(r.complete());
}

namespace {

// The frozen version-1 fixture (a version-1 build's file, as SQL text) rebuilt as a run file.
void make_v1_run(const std::filesystem::path& path, const std::string& extra_sql = "") {
  std::ifstream in(std::filesystem::path(WB_SOURCE_DIR) / "tests" / "fixtures" / "store" / "run_v1.sql");
  REQUIRE(in.good());
  std::string sql((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Db db(path, OpenMode::create);
  db.exec(sql + extra_sql);
}

// Every track's ranges, track after track, as the Reader gives them.
std::vector<RangeRow> all_ranges(const std::filesystem::path& path) {
  Reader r(path);
  std::vector<RangeRow> out;
  for (const auto& t : r.tracks()) {
    auto rows = r.ranges(t.id);
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

std::int64_t user_version(const std::filesystem::path& path) {
  Db db(path, OpenMode::read_only);
  return db.query_int64("PRAGMA user_version");
}

}  // namespace

TEST_CASE("a version-1 file opened read-only is read through the migration and left untouched", "[store]") {
  TempDir dir;
  auto path = dir / "v1.sqlite";
  make_v1_run(path);
  REQUIRE(user_version(path) == 1);
  {
    Reader r(path);
    CHECK(r.meta().at("schema_version") == "1");  // the file says which version it is
    // Version 2's tables read as empty, not as errors.
    CHECK(r.memory().empty());
    CHECK(r.evaluations().empty());
    CHECK(r.capture_windows().empty());
    CHECK(r.pipeline_spans().empty());
    CHECK(r.pipeline_steps().empty());
    CHECK(r.comm_calibrations().empty());  // version 4's
    CHECK(r.split_trials().empty());
    const auto counts = r.row_counts();
    CHECK(counts.at("memory") == 0);
    CHECK(counts.at("range") == 3);
  }
  CHECK(user_version(path) == 1);
  Db db(path, OpenMode::read_only);
  CHECK(db.query_int64("SELECT count(*) FROM sqlite_master WHERE name = 'memory'") == 0);
}

TEST_CASE("a version-1 file opened for writing is migrated in place, in one transaction, its rows unchanged",
          "[store]") {
  TempDir dir;
  auto path = dir / "v1.sqlite";
  make_v1_run(path);
  auto rows = [&] {
    Reader r(path);
    auto c = r.row_counts();
    for (const char* t : {"evaluation", "pipeline_span", "pipeline_step", "capture_window", "memory", "comm_calibration",
                          "split_trial"})
      c.erase(t);
    c.at("meta") -= static_cast<std::int64_t>(r.meta().count("time_origin_ns"));  // version 5's one new key
    return c;
  };
  auto ranges = [&] { return all_ranges(path); };
  const auto before = rows();
  const auto ranges_before = ranges();
  REQUIRE(ranges_before.size() == 3);
  {
    Db db = open_run(path, OpenMode::read_write);
    CHECK(db.query_int64("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                         "('evaluation', 'pipeline_span', 'pipeline_step', 'capture_window', 'memory', "
                         "'comm_calibration', 'split_trial')") == 7);
  }
  CHECK(user_version(path) == kSchemaVersion);
  Reader r(path);
  CHECK(r.meta().at("schema_version") == std::to_string(kSchemaVersion));
  CHECK(rows() == before);
  CHECK(ranges() == ranges_before);  // packed into range_data, every field as it was
  CHECK(r.meta().at("time_origin_ns") == std::to_string(ranges_before.front().start_ns));
  CHECK(r.row_counts().at("memory") == 0);

  SECTION("a failed migration leaves the file at version 1") {
    auto again = dir / "v1-again.sqlite";
    make_v1_run(again);
    {
      // A table of version 2 already there with other columns (no wb build wrote it): the step fails
      // midway, after creating evaluation, and the transaction takes that back.
      Db db(again, OpenMode::read_write);
      db.exec("CREATE TABLE memory (x INTEGER)");
    }
    CHECK_THAT(wb::test::error_message<StoreError>([&] { open_run(again, OpenMode::read_write); }),
               Contains("v1-again.sqlite: schema version 1 file's table memory has the columns (x), expected (rank, "
                        "t_ns, step, bytes, live_bytes, role, name_id)"));
    CHECK(user_version(again) == 1);
    Db db(again, OpenMode::read_only);
    CHECK(db.query_int64("SELECT count(*) FROM sqlite_master WHERE name = 'evaluation'") == 0);
  }
}

TEST_CASE("a version-1 file of a later build, which already has some version-2 tables, keeps their rows",
          "[store]") {
  // The version-1 fixture plus a memory table with a row, as builds before the version number moved
  // wrote it.
  TempDir dir;
  auto path = dir / "v1-late.sqlite";
  make_v1_run(path);
  {
    Db db(path, OpenMode::read_write);
    db.exec("CREATE TABLE memory (rank INTEGER NOT NULL, t_ns INTEGER NOT NULL, step INTEGER NOT NULL, "
            "bytes INTEGER NOT NULL, live_bytes INTEGER NOT NULL, role INTEGER NOT NULL, name_id INTEGER NOT NULL);"
            "INSERT INTO memory VALUES (0, 100, 0, 4096, 4096, 0, 1);");
  }
  {
    Reader r(path);  // read-only: the file's own memory table, not an empty stand-in
    REQUIRE(r.memory().size() == 1);
    CHECK(r.memory()[0].bytes == 4096);
    CHECK(r.evaluations().empty());
  }
  CHECK(user_version(path) == 1);
  open_run(path, OpenMode::read_write);
  CHECK(user_version(path) == kSchemaVersion);
  Reader r(path);
  CHECK(r.memory().size() == 1);
}

TEST_CASE("the frozen schema version 1 fixture opens and reads back", "[store]") {
  TempDir dir;
  auto path = dir / "v1.sqlite";
  make_v1_run(path);
  Reader r(path);
  CHECK(r.meta().at("schema_version") == "1");
  CHECK(r.meta().at("created_utc") == "2026-01-01T00:00:00Z");
  CHECK(r.complete());
  CHECK(r.config()["batch_size"] == 8);
  auto tracks = r.tracks();
  REQUIRE(tracks.size() == 2);
  CHECK(r.string_at(tracks[0].name) == "main");
  CHECK(tracks[1].kind == TrackKind::queue);
  auto ranges = r.ranges(tracks[0].id);
  REQUIRE(ranges.size() == 3);
  CHECK(r.string_at(ranges[0].name) == "step");  // the enclosing range first
  CHECK(ranges[0].category == static_cast<std::uint8_t>(Category::step));
  CHECK(r.string_at(ranges[1].name) == "conv1");
  CHECK(ranges[1].corr_id == 11);
  CHECK(r.counters(tracks[1].id).size() == 2);
  auto steps = r.steps();
  REQUIRE(steps.size() == 1);
  CHECK_THAT(steps[0].loss, Catch::WithinAbs(2.302585, 1e-12));
  CHECK(r.allreduces().at(0).bytes == 102228128);
  CHECK(r.params().at(0).shape == std::vector<std::int64_t>{64, 3, 7, 7});
  auto loss = r.tensor("run", "loss", "", 0, 0);
  REQUIRE(loss.data.size() == 4);
  float value = 0;
  std::memcpy(&value, loss.data.data(), 4);
  CHECK_THAT(value, Catch::WithinRel(2.302585f, 1e-6f));
  CHECK(r.ranks().at(0).host == "fixture-host");
}

TEST_CASE("a version-1 file with a damaged range time fails its migration with one line and stays as it was",
          "[store]") {
  TempDir dir;
  auto path = dir / "v1.sqlite";
  make_v1_run(path, "UPDATE range SET end_ns = 1e300 WHERE start_ns = 1100;");
  const std::string msg = wb::test::error_message<StoreError>([&] { Db db = open_run(path, OpenMode::read_write); });
  CHECK_THAT(msg, Contains("v1.sqlite: end_ns 1e+300 is out of range"));
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(user_version(path) == 1);  // rolled back: still version 1
  Db db(path, OpenMode::read_only);
  CHECK(db.query_int64("SELECT count(*) FROM range") == 3);
}

TEST_CASE("a version-1 file with ranges of equal key migrates them all, with their times", "[store]") {
  // Versions 1-4 kept ranges in a plain table; version 5 keys them by (track, start, depth, category).
  TempDir dir;
  auto path = dir / "v1.sqlite";
  make_v1_run(path, "INSERT INTO range SELECT track_id, start_ns, end_ns + 7, name_id, category, depth, step, corr_id "
                    "FROM range; INSERT INTO range SELECT * FROM range;");
  auto all = all_ranges;
  const auto before = all(path);  // read-only, through the temp view
  REQUIRE(before.size() == 12);
  { Db db = open_run(path, OpenMode::read_write); }
  const auto after = all(path);
  REQUIRE(after.size() == 12);
  // Each of the 3 ranges was there 4 times (two of each end); after the migration all 4 copies are there
  // with their starts, ends - starts and names.
  std::multiset<std::tuple<std::uint32_t, std::int64_t, int, int>> want, have;
  std::map<std::int64_t, int> starts_before, starts_after;
  for (const auto& x : before) {
    want.insert({x.name, x.end_ns - x.start_ns, x.category, x.depth});
    ++starts_before[x.start_ns];
  }
  for (const auto& x : after) {
    have.insert({x.name, x.end_ns - x.start_ns, x.category, x.depth});
    ++starts_after[x.start_ns];
  }
  CHECK(have == want);
  for (const auto& [start, n] : starts_before) CHECK(n == 4);
  CHECK(starts_after == starts_before);
}

TEST_CASE("a version-1 file's kernels read with version 3's launch columns unknown, read-only and migrated", "[store]") {
  TempDir dir;
  auto path = dir / "v1k.sqlite";
  make_v1_run(path,
              "INSERT INTO track(id, rank, kind, name_id) VALUES (90, 0, 'stream', 1);"
              "INSERT INTO kernel VALUES (90, 100, 200, 1, 7, 0, 1, 1, 1, 32, 1, 1, 0);");
  auto check = [&](Reader& r) {
    const auto k = r.kernels(90);
    REQUIRE(k.size() == 1);
    CHECK(k[0].start_ns == 100);
    CHECK(k[0].corr_id == 7);
    CHECK(k[0].blocks_per_sm == -1.0f);
    CHECK(k[0].occupancy == -1.0f);
    CHECK(k[0].launch_ns == -1);
    CHECK(k[0].launch_end_ns == -1);
  };
  {
    Reader r(path);  // through a temp view: the file keeps its columns
    check(r);
  }
  CHECK(user_version(path) == 1);
  {
    Db db = open_run(path, OpenMode::read_write);  // migrated in place: ALTER TABLE
  }
  CHECK(user_version(path) == kSchemaVersion);
  Reader r(path);
  check(r);
}

TEST_CASE("calibration rows round-trip, and a split trial is appended to a version-1 file, migrating it", "[store]") {
  TempDir dir;
  const auto path = dir / "cal.sqlite";
  const std::vector<CommCalibrationRow> rows = {{0, "allreduce", 4096, 7, 3100, 2900},
                                                {1, "compute_during_allreduce", 65536, 9, 9900000, 9000000}};
  {
    WriterOptions o;
    o.path = path;
    o.handle_signals = false;
    Writer w(o);
    w.add(std::span<const CommCalibrationRow>(rows));
    w.finish();
  }
  {
    Reader r(path);
    CHECK(r.comm_calibrations() == rows);
  }
  const SplitTrialRow trial{1, "DDP 25 MB", "81,132,144,156", 10, 687'000'000, 801'000'000, 800'000'000, 0, "",
                            "2026-11-28T00:00:00Z"};
  save_split_trial(path, trial);
  CHECK(Reader(path).split_trials() == std::vector<SplitTrialRow>{trial});

  const auto v1 = dir / "v1.sqlite";
  make_v1_run(v1);
  save_split_trial(v1, trial);
  CHECK(user_version(v1) == kSchemaVersion);
  Reader r(v1);
  CHECK(r.split_trials() == std::vector<SplitTrialRow>{trial});
  CHECK(r.row_counts().at("range") == 3);
}
