// The `wb` executable's store commands (info, merge) and its usage contract: exit 0 / 2, one-line errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"
#include "support/process.hpp"
#include "support/peers.hpp"

using namespace wb::store;
using wb::test::TempDir;
using Catch::Contains;

namespace {

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

Result run_wb(const std::string& args) {
  std::filesystem::path wb = std::filesystem::path(WB_BINARY_DIR) / "bin" / "wb";
  REQUIRE(std::filesystem::exists(wb));  // built by scripts/setup with everything else
  const wb::test::ProcessResult r = wb::test::run_command(wb.string() + " " + args);
  return {r.exit_code, r.output};
}

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

void write_rank(const std::filesystem::path& dir, int rank) {
  WriterOptions o;
  o.path = dir / ("rank-" + std::to_string(rank) + ".sqlite");
  o.rank = rank;
  o.handle_signals = false;
  Writer w(o);
  w.set_meta("world_size", "2");
  auto track = w.add_track(TrackKind::thread, "main");
  for (int i = 0; i < 30; ++i) w.add(RangeRow{track, w.intern("op"), i, i + 1, 0, 0, 0, 0});
  w.count_dropped(static_cast<std::uint64_t>(rank) * 5);
  w.finish();
}

}  // namespace

TEST_CASE("wb merge and wb info on a 2-rank run", "[store]") {
  TempDir dir;
  auto run = dir / "run";
  std::filesystem::create_directories(run);
  write_rank(run, 0);
  write_rank(run, 1);

  auto merged = run_wb("merge " + run.string() + "/");
  CAPTURE(merged.out);
  CHECK(merged.status == 0);
  CHECK_THAT(merged.out, Contains("merged 2 rank files into " + (dir / "run.sqlite").string() + " (complete)"));

  auto info = run_wb("info " + (dir / "run.sqlite").string());
  CAPTURE(info.out);
  CHECK(info.status == 0);
  CHECK_THAT(info.out, Contains("complete       yes"));
  CHECK_THAT(info.out, Contains("dropped events 5"));
  CHECK_THAT(info.out, Contains("world size     2"));

  auto json = run_wb("info --json " + (dir / "run.sqlite").string());
  CHECK(json.status == 0);
  auto j = nlohmann::json::parse(json.out);
  CHECK(j["complete"] == true);
  CHECK(j["rows"]["range"] == 60);
  CHECK(j["ranks"].size() == 2);
  CHECK(j["ranks"][1]["dropped_events"] == 5);

  auto again = run_wb("merge " + run.string());
  CHECK(again.status == 2);
  CHECK(lines(again.out) == 1);
  CHECK_THAT(again.out, Contains("already exists"));
  CHECK(run_wb("merge " + run.string() + " --overwrite --out " + (dir / "o.sqlite").string()).status == 0);
  CHECK(Reader(dir / "o.sqlite").row_counts().at("range") == 60);
}

TEST_CASE("wb usage errors: one clear line and exit 2; help exits 0", "[store]") {
  TempDir dir;
  auto junk = dir / "junk.sqlite";
  {
    std::FILE* f = std::fopen(junk.c_str(), "wb");
    std::fputs("this is not a database, just some text that is long enough to look like a header........", f);
    std::fclose(f);
  }
  struct Case {
    std::string args;
    std::string says;
  };
  for (const auto& c : std::vector<Case>{
           {"frobnicate", "wb: unknown command 'frobnicate'"},
           {"info", "wb info: expected 1 argument(s), got 0"},
           {"info a b", "expected 1 argument(s), got 2"},
           {"info --bogus x.sqlite", "wb info: unknown flag --bogus"},
           {"merge --out", "wb merge: --out needs a value"},
           {"info " + junk.string(), "junk.sqlite: not a wb run file (not an SQLite database)"},
           {"info " + (dir / "missing.sqlite").string(), "missing.sqlite: no such file"},
           {"merge " + (dir / "nodir").string(), "nodir: not a directory"},
       }) {
    CAPTURE(c.args);
    auto r = run_wb(c.args);
    CAPTURE(r.out);
    CHECK(r.status == 2);
    CHECK(lines(r.out) == 1);
    CHECK_THAT(r.out, Contains(c.says));
  }
  auto help = run_wb("--help");
  CHECK(help.status == 0);
  CHECK_THAT(help.out, Contains("info"));
  CHECK_THAT(help.out, Contains("merge"));
  auto cmd_help = run_wb("merge --help");
  CHECK(cmd_help.status == 0);
  CHECK_THAT(cmd_help.out, Contains("usage: wb merge RUNDIR"));
  CHECK(run_wb("").status == 2);
}

TEST_CASE("wb report on a version-1 run file prints what the last version-1 build printed", "[store]") {
  // The frozen version-1 fixture, and that build's report of it (tests/fixtures/store/run_v1.report.txt).
  TempDir dir;
  const auto run = dir / "v1.sqlite";
  const std::filesystem::path fixtures = std::filesystem::path(WB_SOURCE_DIR) / "tests" / "fixtures" / "store";
  {
    std::ifstream in(fixtures / "run_v1.sql");
    REQUIRE(in.good());
    const std::string sql((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Db db(run, OpenMode::create);
    db.exec(sql);
  }
  std::ifstream golden_in(fixtures / "run_v1.report.txt");
  REQUIRE(golden_in.good());
  std::string want;
  for (std::string line; std::getline(golden_in, line);) {
    if (!line.starts_with("#")) want += line + "\n";
  }
  const Result r = run_wb("report " + wb::test::shell_quote(run.string()));
  REQUIRE(r.status == 0);
  // The Run line names the file, wherever it is.
  std::string got = r.out;
  REQUIRE(got.starts_with("Run " + run.string() + "\n"));
  got = "Run RUN\n" + got.substr(got.find('\n') + 1);
  // Every figure is compared; the closing "Apply with" lines of the split suggestions are not figures,
  // and later builds spell each strategy's split out there.
  auto figures = [](const std::string& text) { return text.substr(0, text.find("  Apply with")); };
  REQUIRE(want.find("  Apply with") != std::string::npos);
  CHECK(figures(got) == figures(want));
  // Reading it left the file at version 1.
  Db db(run, OpenMode::read_only);
  CHECK(db.query_int64("PRAGMA user_version") == 1);
}
