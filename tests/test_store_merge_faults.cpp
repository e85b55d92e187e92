// The faults a merge meets: a truncated or foreign rank file (named; the others merged only with
// --partial), and `wb merge` killed with SIGKILL part way (the rank files untouched, no merged file,
// and a second merge that succeeds). Through the `wb` program, as a user meets them.
#include <catch2/catch.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <sqlite3.h>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"
#include "support/files.hpp"
#include "support/process.hpp"
#include "support/peers.hpp"

extern char** environ;

using namespace wb::store;
using wb::test::TempDir;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const fs::path kWb = fs::path(WB_BINARY_DIR) / "bin" / "wb";

// A finished rank file of `world` ranks with `rows` ranges of rank-specific names.
void write_rank(const fs::path& dir, int rank, int world, int rows) {
  WriterOptions o;
  o.path = dir / ("rank-" + std::to_string(rank) + ".sqlite");
  o.rank = rank;
  o.handle_signals = false;
  Writer w(o);
  w.set_meta("world_size", std::to_string(world));
  auto track = w.add_track(TrackKind::thread, "main");
  for (int i = 0; i < rows; ++i) {
    w.add(RangeRow{track, w.intern("op." + std::to_string(i % 50)), rank * 10'000'000LL + i, rank * 10'000'000LL + i + 1,
                   0, 0, i / 1000, 0});
  }
  w.add(StepRow{rank, 0, 0, 100, 1, 2, 2.5, 0.1, 16});
  REQUIRE(w.finish());
}

std::int64_t ranges_of_rank(const fs::path& merged, int rank) {
  Reader r(merged);
  return r.db().query_int64("SELECT count(*) FROM range JOIN track ON track.id = range.track_id WHERE track.rank = " +
                            std::to_string(rank));
}

// The byte range of a leaf page of range_data's in the middle of its leaves (SQLite's dbstat): where a
// merge must read.
std::pair<std::size_t, std::size_t> middle_range_page(const fs::path& file) {
  Db db(file, OpenMode::read_only);
  auto& st = db.prepare(
      "SELECT pageno, pgsize FROM dbstat WHERE name = 'range_data' AND pagetype = 'leaf' ORDER BY pageno");
  std::vector<std::pair<std::int64_t, std::int64_t>> pages;
  while (st.step()) pages.emplace_back(st.column_int64(0), st.column_int64(1));
  st.reset();
  REQUIRE(pages.size() >= 4);
  const auto [pageno, size] = pages[pages.size() / 2];
  return {static_cast<std::size_t>((pageno - 1) * size), static_cast<std::size_t>(size)};
}

wb::test::ProcessResult run_wb(const std::string& args) { return wb::test::run_command(kWb.string() + " " + args); }

}  // namespace

TEST_CASE("wb merge: a truncated and a foreign rank file are named; --partial merges the others", "[store]") {
  REQUIRE(fs::exists(kWb));
  TempDir dir;
  const fs::path run = dir / "run";
  fs::create_directories(run);
  for (int r = 0; r < 4; ++r) write_rank(run, r, 4, 20'000);
  // rank 1: cut in half, as a copy that stopped part way leaves it.
  const auto size1 = fs::file_size(run / "rank-1.sqlite");
  fs::resize_file(run / "rank-1.sqlite", size1 / 2);
  // rank 3: an SQLite file of another program.
  fs::remove(run / "rank-3.sqlite");
  {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((run / "rank-3.sqlite").c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, "CREATE TABLE photos(id INTEGER, data BLOB); INSERT INTO photos VALUES (1, x'00');",
                         nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  }
  const std::string before1 = wb::test::read_text(run / "rank-1.sqlite");
  const std::string before3 = wb::test::read_text(run / "rank-3.sqlite");

  SECTION("without --partial: exit 2, one line naming both, no merged file") {
    auto r = run_wb("merge " + run.string());
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Contains("rank-1.sqlite"));
    CHECK_THAT(r.err, Contains("rank-3.sqlite: not a wb run file"));
    CHECK_THAT(r.err, Contains("--partial"));
    CHECK_THAT(r.err, !Contains("rank-0.sqlite") && !Contains("rank-2.sqlite"));
    CHECK_FALSE(fs::exists(dir / "run.sqlite"));
    CHECK_FALSE(fs::exists(dir / "run.sqlite.partial"));
  }
  SECTION("with --partial: ranks 0 and 2 merged whole, 1 and 3 left out and named, the run incomplete") {
    auto r = run_wb("merge --partial " + run.string());
    CAPTURE(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.err, Contains("left out " + (run / "rank-1.sqlite").string()));
    CHECK_THAT(r.err, Contains("left out " + (run / "rank-3.sqlite").string() + ": not a wb run file"));
    CHECK_THAT(r.out, Contains("merged 2 of 4 rank files into " + (dir / "run.sqlite").string() +
                               " (incomplete: rank files were left out)"));
    const fs::path merged = dir / "run.sqlite";
    CHECK(ranges_of_rank(merged, 0) == 20'000);
    CHECK(ranges_of_rank(merged, 2) == 20'000);
    CHECK(ranges_of_rank(merged, 1) == 0);
    CHECK(ranges_of_rank(merged, 3) == 0);
    Reader reader(merged);
    CHECK_FALSE(reader.complete());
    CHECK(reader.world_size() == 4);
    const std::string skipped = reader.meta().at("skipped_ranks");
    CHECK_THAT(skipped, Contains("rank-1.sqlite") && Contains("rank-3.sqlite"));
    CHECK(reader.steps().size() == 2);
  }
  SECTION("a missing rank is named too, and --partial merges around it") {
    fs::remove(run / "rank-3.sqlite");
    auto r = run_wb("merge " + run.string());
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains("missing rank files for world_size 4: rank-3.sqlite"));
    auto p = run_wb("merge --partial " + run.string());
    CAPTURE(p.output);
    CHECK(p.exit_code == 0);
    CHECK_THAT(p.err, Contains("rank-3.sqlite: missing"));
    CHECK_THAT(p.err, Contains("rank-1.sqlite"));
    CHECK(ranges_of_rank(dir / "run.sqlite", 2) == 20'000);
  }
  // The merge only ever read them.
  CHECK(wb::test::read_text(run / "rank-1.sqlite") == before1);
  if (fs::exists(run / "rank-3.sqlite")) CHECK(wb::test::read_text(run / "rank-3.sqlite") == before3);
}

TEST_CASE("wb merge: a rank file damaged inside is named, and --partial leaves all of it out", "[store]") {
  REQUIRE(fs::exists(kWb));
  TempDir dir;
  const fs::path run = dir / "run";
  fs::create_directories(run);
  for (int r = 0; r < 3; ++r) write_rank(run, r, 3, 20'000);
  // Rank 2's header and schema are intact (it opens), but a page in the middle of its rows is garbage.
  {
    const fs::path damaged = run / "rank-2.sqlite";
    const auto [offset, size] = middle_range_page(damaged);
    std::string bytes = wb::test::read_text(damaged);
    REQUIRE(bytes.size() >= offset + size);
    for (std::size_t i = offset; i < offset + size; ++i) bytes[i] = static_cast<char>(0xA5);
    wb::test::write_text(damaged, bytes);
  }
  auto r = run_wb("merge " + run.string());
  CAPTURE(r.output);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_THAT(r.err, Contains((run / "rank-2.sqlite").string() + ": cannot be merged"));
  CHECK_THAT(r.err, Contains("--partial"));
  CHECK_FALSE(fs::exists(dir / "run.sqlite"));
  CHECK_FALSE(fs::exists(dir / "run.sqlite.partial"));

  auto p = run_wb("merge --partial " + run.string());
  CAPTURE(p.output);
  REQUIRE(p.exit_code == 0);
  CHECK_THAT(p.err, Contains("left out " + (run / "rank-2.sqlite").string() + ": cannot be merged"));
  const fs::path merged = dir / "run.sqlite";
  CHECK(ranges_of_rank(merged, 0) == 20'000);
  CHECK(ranges_of_rank(merged, 1) == 20'000);
  CHECK(ranges_of_rank(merged, 2) == 0);  // its transaction rolled back: nothing half-merged
  Reader reader(merged);
  CHECK_FALSE(reader.complete());
  CHECK(reader.steps().size() == 2);
}

TEST_CASE("wb merge killed with SIGKILL leaves the rank files untouched, and a second merge succeeds", "[store]") {
  REQUIRE(fs::exists(kWb));
  TempDir dir;
  const fs::path run = dir / "run";
  fs::create_directories(run);
  constexpr int kRows = 400'000;
  for (int r = 0; r < 2; ++r) write_rank(run, r, 2, kRows);
  const std::string rank0 = wb::test::read_text(run / "rank-0.sqlite");
  const std::string rank1 = wb::test::read_text(run / "rank-1.sqlite");
  const fs::path merged = dir / "run.sqlite";
  const fs::path partial = dir / "run.sqlite.partial";

  // Kill it at several points: as soon as the merged file's temporary appears, and later.
  int killed_mid_merge = 0;
  for (int delay_ms : {0, 40, 120, 300}) {
    CAPTURE(delay_ms);
    std::string run_arg = run.string();
    char* argv[] = {const_cast<char*>(kWb.c_str()), const_cast<char*>("merge"), run_arg.data(), nullptr};
    pid_t pid = 0;
    REQUIRE(posix_spawn(&pid, kWb.c_str(), nullptr, nullptr, argv, environ) == 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!fs::exists(partial) && !fs::exists(merged) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status)) {
      ++killed_mid_merge;
      CHECK_FALSE(fs::exists(merged));  // never a half-written run file under the final name
    } else {
      fs::remove(merged);  // it finished before the kill: start the next round from scratch
    }
    CHECK(wb::test::read_text(run / "rank-0.sqlite") == rank0);
    CHECK(wb::test::read_text(run / "rank-1.sqlite") == rank1);
    CHECK_FALSE(fs::exists(run / "rank-0.sqlite-wal"));
  }
  CHECK(killed_mid_merge >= 2);

  auto second = run_wb("merge " + run.string());
  CAPTURE(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.out, Contains("(complete)"));
  CHECK_FALSE(fs::exists(partial));
  CHECK(ranges_of_rank(merged, 0) == kRows);
  CHECK(ranges_of_rank(merged, 1) == kRows);
  Db db = open_run(merged, OpenMode::read_write);
  Statement& check = db.prepare("PRAGMA integrity_check");
  REQUIRE(check.step());
  CHECK(check.column_text(0) == "ok");
  check.reset();
}
