// merge_run: per-rank files become one run file with tracks, strings and correlation ids remapped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <tuple>

#include "store/db.hpp"
#include "store/merge.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"
#include "support/peers.hpp"

using namespace wb::store;
using wb::test::TempDir;
using Catch::Contains;

namespace {

// What one rank recorded, by name, to compare against the merged file independently of ids.
struct Recorded {
  std::vector<std::tuple<std::string, std::string, std::int64_t, std::int64_t>> ranges;  // track, name, start, end
  std::vector<std::tuple<std::string, std::string, std::int64_t>> kernels;               // track, name, start
};

// The options of rank `rank`'s writer into the run folder `dir`.
WriterOptions rank_options(const std::filesystem::path& dir, int rank) {
  WriterOptions o;
  o.path = dir / ("rank-" + std::to_string(rank) + ".sqlite");
  o.rank = rank;
  o.handle_signals = false;
  return o;
}

// Rank r interns names in a different order than other ranks and shares some, so ids collide across files.
Recorded write_rank(const std::filesystem::path& dir, int rank, int world_size, bool finish) {
  Recorded rec;
  Writer w(rank_options(dir, rank));
  w.set_meta("world_size", std::to_string(world_size));
  w.set_meta("device", "cpu");
  w.set_meta("config_json", R"({"ranks": )" + std::to_string(world_size) + "}");
  std::string main_name = "main-r" + std::to_string(rank);
  std::string stream_name = "stream-r" + std::to_string(rank);
  auto main = w.add_track(TrackKind::thread, main_name);
  auto stream = w.add_track(TrackKind::stream, stream_name);
  auto queue = w.add_track(TrackKind::queue, "queue");
  std::vector<std::string> names;
  for (int i = 0; i < 20; ++i) names.push_back(rank == 0 ? "op." + std::to_string(i) : "op." + std::to_string(19 - i));
  names.push_back("only-rank-" + std::to_string(rank));
  for (int i = 0; i < 200; ++i) {
    const std::string& n = names[static_cast<std::size_t>(i) % names.size()];
    std::int64_t t = rank * 1'000'000LL + i * 100;
    w.add(RangeRow{main, w.intern(n), t, t + 50, 0, 0, i / 50, static_cast<std::uint64_t>(i + 1)});
    w.add(KernelRow{stream, w.intern("k:" + n), t + 10, t + 40, static_cast<std::uint64_t>(i + 1), 0, {1, 1, 1}, {32, 1, 1}, 0});
    rec.ranges.emplace_back(main_name, n, t, t + 50);
    rec.kernels.emplace_back(stream_name, "k:" + n, t + 10);
  }
  w.add(CounterRow{queue, 5, 3.0});
  w.add(StepRow{rank, 0, 0, 100, 1, 2, 2.5, 0.1, 16});
  w.add(AllreduceRow{rank, 0, 0, 0, 160, 4096, 1, 2, 3});
  w.add(TensorRow{"run", 0, rank, "loss", "", 0, "F32", {}, std::vector<std::byte>(4, std::byte{1})});
  if (rank == 0) w.add(ParamRow{0, "conv1.weight", {64, 3, 7, 7}, 9408, 0, true});
  RankRow rr{rank, "host" + std::to_string(rank), "cpu", 100 + rank, rank * 10, rank * 11, 0};
  w.set_rank(rr);
  if (finish) w.finish();
  return rec;
}

}  // namespace

TEST_CASE("merge of 2 rank files remaps tracks and strings into one id space", "[store]") {
  TempDir dir;
  auto run = dir / "run";
  std::filesystem::create_directories(run);
  std::vector<Recorded> recorded{write_rank(run, 0, 2, true), write_rank(run, 1, 2, true)};

  auto result = merge_run(run);
  CHECK(result.out == dir / "run.sqlite");
  CHECK(result.world_size == 2);
  CHECK(result.complete);

  Reader r(result.out);
  auto meta = r.meta();
  CHECK(meta.at("world_size") == "2");
  CHECK(meta.at("complete") == "1");
  CHECK(meta.count("rank") == 0);
  CHECK(meta.at("config_json") == R"({"ranks": 2})");
  CHECK(r.ranks().size() == 2);
  CHECK(r.ranks()[1].host == "host1");

  auto tracks = r.tracks();
  REQUIRE(tracks.size() == 6);
  std::set<std::uint32_t> ids;
  for (const auto& t : tracks) ids.insert(t.id);
  CHECK(ids.size() == 6);  // unique after merge though both files used ids 1..3

  // Every range and kernel is found on the right track with the right name, by text.
  std::vector<Recorded> merged(2);
  for (const auto& t : tracks) {
    const std::string& track_name = r.string_at(t.name);
    for (const auto& row : r.ranges(t.id))
      merged[static_cast<std::size_t>(t.rank)].ranges.emplace_back(track_name, r.string_at(row.name), row.start_ns, row.end_ns);
    for (const auto& k : r.kernels(t.id))
      merged[static_cast<std::size_t>(t.rank)].kernels.emplace_back(track_name, r.string_at(k.name), k.start_ns);
  }
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(merged[static_cast<std::size_t>(rank)].ranges == recorded[static_cast<std::size_t>(rank)].ranges);
    CHECK(merged[static_cast<std::size_t>(rank)].kernels == recorded[static_cast<std::size_t>(rank)].kernels);
  }
  // Shared names are stored once.
  CHECK(r.db().query_int64("SELECT count(*) FROM string WHERE text = 'op.3'") == 1);
  CHECK(r.db().query_int64("SELECT count(*) FROM string") == 2 * 2 + 1 + 20 * 2 + 2 * 2);

  // Correlation ids stay unique per rank: a host range finds only its own rank's kernel.
  auto rank1_main = std::find_if(tracks.begin(), tracks.end(),
                                 [&](const TrackRow& t) { return r.string_at(t.name) == "main-r1"; });
  REQUIRE(rank1_main != tracks.end());
  auto first = r.ranges(rank1_main->id).front();
  auto launched = r.kernels_by_corr(first.corr_id);
  REQUIRE(launched.size() == 1);
  CHECK(r.string_at(launched[0].name) == "k:" + r.string_at(first.name));

  auto counts = r.row_counts();
  CHECK(counts.at("range") == 400);
  CHECK(counts.at("kernel") == 400);
  CHECK(counts.at("counter") == 2);
  CHECK(counts.at("step") == 2);
  CHECK(counts.at("allreduce") == 2);
  CHECK(counts.at("tensor") == 2);
  CHECK(counts.at("param") == 1);
  // The indexes were rebuilt.
  CHECK(r.db().query_int64("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'kernel_track_start'") == 1);
  // Ranges are keyed by track and start, so a window of one track is read through the key.
  auto& plan = r.db().prepare("EXPLAIN QUERY PLAN SELECT * FROM range_data WHERE track_id = 1 AND start_ns > 5");
  std::string detail;
  while (plan.step()) detail += plan.column_text(3);
  plan.reset();
  CHECK_THAT(detail, Catch::Matchers::Contains("USING PRIMARY KEY (track_id=? AND start_ns>?)"));

  SECTION("an existing output is not overwritten unless asked") {
    REQUIRE_THROWS_AS(merge_run(run), StoreError);
    CHECK(merge_run(run, dir / "again.sqlite").complete);
    CHECK(merge_run(run, {}, true).complete);
  }
}

TEST_CASE("merge: incomplete ranks, missing ranks and bad directories", "[store]") {
  TempDir dir;
  auto run = dir / "run";
  std::filesystem::create_directories(run);

  SECTION("a rank that did not finish makes the merged run incomplete") {
    write_rank(run, 0, 2, true);
    write_rank(run, 1, 2, false);
    auto result = merge_run(run, dir / "out.sqlite");
    CHECK_FALSE(result.complete);
    CHECK_FALSE(Reader(dir / "out.sqlite").complete());
  }
  SECTION("missing rank files are listed") {
    write_rank(run, 0, 4, true);
    write_rank(run, 2, 4, true);
    REQUIRE_THROWS_AS(merge_run(run), StoreError);
    auto msg = wb::test::error_message<StoreError>([&] { merge_run(run); });
    CHECK_THAT(msg, Contains("missing rank files for world_size 4: rank-1.sqlite, rank-3.sqlite"));
    CHECK_FALSE(std::filesystem::exists(dir / "run.sqlite"));
    CHECK_FALSE(std::filesystem::exists(dir / "run.sqlite.partial"));
  }
  SECTION("no rank files") {
    REQUIRE_THROWS_AS(merge_run(run), StoreError);
    CHECK_THAT(wb::test::error_message<StoreError>([&] { merge_run(run); }), Contains("no rank-<r>.sqlite files"));
  }
  SECTION("not a directory") {
    REQUIRE_THROWS_AS(merge_run(dir / "nope"), StoreError);
  }
  SECTION("a damaged rank file is named") {
    write_rank(run, 0, 2, true);
    std::filesystem::resize_file(run / "rank-0.sqlite", 0);
    write_rank(run, 1, 2, true);
    CHECK_THAT(wb::test::error_message<StoreError>([&] { merge_run(run); }), Contains("rank-0.sqlite: not a wb run file"));
  }
  SECTION("default output path drops a trailing slash") {
    CHECK(default_merge_output("runs/x/") == std::filesystem::path("runs/x.sqlite"));
    CHECK(default_merge_output("runs/x") == std::filesystem::path("runs/x.sqlite"));
  }
}

TEST_CASE("merge corrects a rank's clock drift linearly between its two offset measurements", "[store]") {
  TempDir dir;
  auto run = dir / "run";
  std::filesystem::create_directories(run);
  // Rank 1's offset to rank 0 was 1000 ns at local time 1e9 and 3000 ns at local time 2e9 (2 us of drift
  // per second). Its rows were stored with the start offset: stored = local + 1000.
  const std::int64_t t0 = 1'000'000'000, t1 = 2'000'000'000, o0 = 1000, o1 = 3000;
  auto expected = [&](std::int64_t stored) {
    const std::int64_t local = stored - o0;
    // An independent statement of the same line: the offset at `local`, interpolated in long double.
    const long double offset = o0 + static_cast<long double>(o1 - o0) * (local - t0) / (t1 - t0);
    return static_cast<std::int64_t>(std::llround(static_cast<long double>(local) + offset));
  };
  std::vector<std::int64_t> stored_times;
  for (int rank = 0; rank < 2; ++rank) {
    Writer w(rank_options(run, rank));
    w.set_meta("world_size", "2");
    w.set_meta("clock_sync_start_ns", std::to_string(t0));
    w.set_meta("clock_sync_end_ns", std::to_string(t1));
    auto main = w.add_track(TrackKind::thread, "main");
    auto queue = w.add_track(TrackKind::queue, "batch queue");
    const std::int64_t off0 = rank == 0 ? 0 : o0;
    // Before the first measurement, between them, and after the last (extrapolated).
    for (std::int64_t local : {t0 - 200'000'000, t0, t0 + 250'000'000, t0 + 500'000'000, t1, t1 + 300'000'000}) {
      const std::int64_t s = local + off0;
      if (rank == 1) stored_times.push_back(s);
      w.add(RangeRow{main, w.intern("op"), s, s + 1'000'000, 0, 0, 0, 0});
      w.add(CounterRow{queue, s, 1.0});
      w.add(StepRow{rank, static_cast<int>(stored_times.size()), s, s + 1'000'000, 0, 0, 1.0, 0.1, 8});
      w.add(AllreduceRow{rank, 0, 0, 0, 160, 4096, s, s + 10, s + 20});
    }
    w.set_rank(RankRow{rank, "h", "cpu", 1, rank == 0 ? 0 : o0, rank == 0 ? 0 : o1, 0});
    w.finish();
  }
  auto result = merge_run(run);
  Db db = open_run(result.out, OpenMode::read_only);
  auto column = [&](const std::string& sql) {
    std::vector<std::int64_t> v;
    auto& st = db.prepare(sql);
    while (st.step()) v.push_back(st.column_int64(0));
    st.reset();
    return v;
  };
  std::vector<std::int64_t> want, want_end, want_ready, want_ar_end;
  for (std::int64_t s : stored_times) {
    want.push_back(expected(s));
    want_end.push_back(expected(s + 1'000'000));
    want_ar_end.push_back(expected(s + 20));
  }

  CHECK(column("SELECT r.start_ns FROM range r JOIN track t ON t.id = r.track_id WHERE t.rank = 1 ORDER BY r.rowid") == want);
  CHECK(column("SELECT r.end_ns FROM range r JOIN track t ON t.id = r.track_id WHERE t.rank = 1 ORDER BY r.rowid") == want_end);
  CHECK(column("SELECT c.t_ns FROM counter c JOIN track t ON t.id = c.track_id WHERE t.rank = 1 ORDER BY c.rowid") == want);
  CHECK(column("SELECT start_ns FROM step WHERE rank = 1 ORDER BY rowid") == want);
  CHECK(column("SELECT ready_ns FROM allreduce WHERE rank = 1 ORDER BY rowid") == want);
  CHECK(column("SELECT end_ns FROM allreduce WHERE rank = 1 ORDER BY rowid") == want_ar_end);
  // At the start measurement nothing moves; at the end one the full 2 us of drift is applied.
  CHECK(want[1] == stored_times[1]);
  CHECK(want[4] == stored_times[4] + (o1 - o0));
  // Rank 0 is the reference clock: its times are untouched.
  CHECK(column("SELECT start_ns FROM step WHERE rank = 0 ORDER BY rowid") ==
        std::vector<std::int64_t>{t0 - 200'000'000, t0, t0 + 250'000'000, t0 + 500'000'000, t1, t1 + 300'000'000});
}

TEST_CASE("merge packs a version-1 rank file's ranges and a version-5 one's into one range_data", "[store]") {
  // Rank 0 from a version-1 build (the frozen fixture: ranges in a plain table), rank 1 from this build.
  TempDir dir;
  auto run = dir / "run";
  std::filesystem::create_directories(run);
  {
    std::ifstream in(std::filesystem::path(WB_SOURCE_DIR) / "tests" / "fixtures" / "store" / "run_v1.sql");
    REQUIRE(in.good());
    std::string sql((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Db db(run / "rank-0.sqlite", OpenMode::create);
    // Every range twice: a plain table allowed ranges of equal track, start, depth and category.
    db.exec(sql + "UPDATE meta SET value = '2' WHERE key = 'world_size'; INSERT INTO range SELECT * FROM range;");
  }
  {
    Writer w(rank_options(run, 1));
    w.set_meta("world_size", "2");
    w.set_meta("rank", "1");
    auto t = w.add_track(TrackKind::thread, "main");
    w.add(RangeRow{t, w.intern("conv1"), 1'000'000'000'000, 1'000'000'005'000, 0, 1, 0, 0});
    w.add(RangeRow{t, w.intern("bn1"), 1'000'000'000'000, 1'000'000'000'000, 0, 1, 0, 0});  // the same key
    w.add(RangeRow{t, w.intern("step"), 999'999'999'000, 1'000'000'009'000, 7, 0, 0, 0});
    w.set_meta("complete", "1");
    w.finish();
  }
  auto all = [](const std::filesystem::path& p) {
    Reader r(p);
    std::vector<std::tuple<std::string, std::int64_t, std::int64_t, int, int>> out;
    for (const auto& t : r.tracks()) {
      for (const auto& x : r.ranges(t.id)) out.emplace_back(r.string_at(x.name), x.start_ns, x.end_ns, x.category, x.depth);
    }
    return out;
  };
  auto want = all(run / "rank-0.sqlite");
  REQUIRE(want.size() == 6);
  for (const auto& x : all(run / "rank-1.sqlite")) want.push_back(x);
  auto merged = merge_run(run, dir / "merged.sqlite");
  auto got = all(merged.out);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  CHECK(got == want);
  Reader r(merged.out);
  // The merged file's origin is rank 0's earliest start; rank 1's starts are stored against it.
  CHECK(r.meta().at("time_origin_ns") == "1000");
  CHECK(r.db().query_int64("SELECT min(start_ns) FROM range_data") == 0);
}

TEST_CASE("the merged file's range pages are packed full", "[store]") {
  // The merge appends each rank's ranges in key order, which fills a WITHOUT ROWID table's pages only about
  // seven eighths; the merged file is written as a packed copy.
  TempDir dir;
  auto run = dir / "run";
  std::filesystem::create_directories(run);
  for (int rank = 0; rank < 2; ++rank) {
    Writer w(rank_options(run, rank));
    w.set_meta("world_size", "2");
    wb::test::write_two_tracks(w, 60'000);
    REQUIRE(w.finish());
  }
  const auto merged = merge_run(run, dir / "merged.sqlite");
  CHECK_FALSE(std::filesystem::exists(dir / "merged.sqlite.partial"));
  CHECK_FALSE(std::filesystem::exists(dir / "merged.sqlite.packed"));
  Reader r(merged.out);
  CHECK(r.db().query_int64("SELECT count(*) FROM range") == 240'000);
  CHECK(wb::test::range_pages_unused(merged.out) < 0.02);

  // When the copy cannot be written (here a folder is in its way), the merged file is kept as built.
  std::filesystem::create_directories(dir / "blocked.sqlite.packed" / "inside");
  const auto blocked = merge_run(run, dir / "blocked.sqlite");
  CHECK(blocked.complete);
  CHECK_FALSE(std::filesystem::exists(dir / "blocked.sqlite.partial"));
  CHECK(Reader(blocked.out).db().query_int64("SELECT count(*) FROM range") == 240'000);
  CHECK(wb::test::range_pages_unused(blocked.out) > 0.08);
}
