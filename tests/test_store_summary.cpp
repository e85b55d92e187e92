// The timeline's level-of-detail summaries (store/summary.hpp), checked against a brute-force count over
// the rows themselves: every stored bucket's count and busy time, every level, the majority name, the
// window query, a rebuild, a cancelled build, and the merged run's summary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "store/db.hpp"
#include "store/merge.hpp"
#include "store/reader.hpp"
#include "store/summary.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"

using namespace wb::store;
using wb::test::TempDir;

namespace {

struct Row {
  std::int64_t start, end;
  std::uint32_t name;
};

// A thread track with back-to-back "step" ranges at depth 0, random ops at depth 1 inside them and a
// few long ones at depth 2, plus a stream of kernels; returns the rows per (track, depth) as written.
std::map<std::pair<std::uint32_t, int>, std::vector<Row>> write_run(const std::filesystem::path& path, int rank,
                                                                    std::uint32_t seed, bool indexes = true) {
  WriterOptions o;
  o.path = path;
  o.rank = rank;
  o.handle_signals = false;
  o.build_indexes = indexes;
  std::map<std::pair<std::uint32_t, int>, std::vector<Row>> rows;
  Writer w(o);
  const auto thread = w.add_track(TrackKind::thread, "main");
  const auto stream = w.add_track(TrackKind::stream, "stream 7");
  const std::uint32_t step_name = w.intern("step"), heavy = w.intern("layer1.0.conv1"), light = w.intern("relu");
  std::mt19937 rng(seed);
  std::int64_t t = 1'000'000'000 + rank * 333;
  for (int s = 0; s < 40; ++s) {
    const std::int64_t len = 2'000'000 + static_cast<std::int64_t>(rng() % 3'000'000);
    w.add(RangeRow{thread, step_name, t, t + len, 7, 0, s, 0});
    rows[{thread, 0}].push_back({t, t + len, step_name});
    // depth 1: ops tiling part of the step, the heavy one three times as long as the light one
    std::int64_t u = t + 1000;
    while (true) {
      const bool h = rng() % 4 != 0;
      const std::int64_t d = h ? 30'000 + static_cast<std::int64_t>(rng() % 5000) : 9'000;
      if (u + d > t + len - 1000) break;
      w.add(RangeRow{thread, h ? heavy : light, u, u + d, 0, 1, s, 0});
      rows[{thread, 1}].push_back({u, u + d, h ? heavy : light});
      u += d + static_cast<std::int64_t>(rng() % 2000);
    }
    if (s % 10 == 0) {
      w.add(RangeRow{thread, heavy, t + 500, t + len - 500, 1, 2, s, 0});  // a long range at depth 2 too
      rows[{thread, 2}].push_back({t + 500, t + len - 500, heavy});
    }
    for (int k = 0; k < 50; ++k) {
      const std::int64_t ks = t + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(len));
      const std::int64_t kd = 500 + static_cast<std::int64_t>(rng() % 80'000);
      KernelRow kr{};
      kr.track = stream;
      kr.name = k % 3 == 0 ? light : heavy;
      kr.start_ns = ks;
      kr.end_ns = ks + kd;
      w.add(kr);
      rows[{stream, 0}].push_back({ks, ks + kd, kr.name});
    }
    t += len + 10'000;
  }
  REQUIRE(w.finish());
  for (auto& [key, v] : rows) std::sort(v.begin(), v.end(), [](const Row& a, const Row& b) { return a.start < b.start; });
  return rows;
}

// The brute-force figures of one bucket [b0, b1).
struct Truth {
  std::int64_t count = 0, busy = 0;
  std::map<std::uint32_t, std::int64_t> by_name;
};
Truth truth(const std::vector<Row>& rows, std::int64_t b0, std::int64_t b1) {
  Truth t;
  for (const auto& r : rows) {
    if (r.start >= b0 && r.start < b1) ++t.count;
    const std::int64_t inside = std::min(r.end, b1) - std::max(r.start, b0);
    if (inside > 0) {
      t.busy += inside;
      t.by_name[r.name] += inside;
    }
  }
  return t;
}

// Every level of every summarised (track, depth) against the rows; returns the buckets checked.
int check_against_rows(Db& db, const std::map<std::pair<std::uint32_t, int>, std::vector<Row>>& rows) {
  auto tracks = summary_tracks(db);
  REQUIRE(tracks.size() == rows.size());
  int checked = 0;
  for (const auto& s : tracks) {
    INFO("track " << s.track << " depth " << s.depth);
    const auto& mine = rows.at({s.track, s.depth});
    CHECK(s.rows == static_cast<std::int64_t>(mine.size()));
    std::int64_t longest = 0;
    for (const auto& r : mine) longest = std::max(longest, r.end - r.start);
    CHECK(s.longest_ns == longest);
    CHECK(s.first_ns == mine.front().start);
    std::int64_t last = 0;
    for (const auto& r : mine) last = std::max(last, r.end);
    CHECK(s.last_ns == last);
    CHECK(s.bucket_ns >= 1024);
    CHECK((s.bucket_ns & (s.bucket_ns - 1)) == 0);
    for (int level = 0; level < s.levels; ++level) {
      auto buckets = summary_buckets(db, s, level, INT64_MIN / 4, INT64_MAX / 4);
      if (level == s.levels - 1) CHECK(buckets.size() == 1);
      if (level == 0 && buckets.size() > 1)  // level 0 is coarse enough to hold 32 rows a stored bucket
        CHECK(static_cast<std::int64_t>(buckets.size()) * 32 <= s.rows * 2);
      std::int64_t total = 0;
      for (const auto& b : buckets) {
        CHECK(b.end_ns - b.start_ns == s.width(level));
        const Truth t = truth(mine, b.start_ns, b.end_ns);
        CHECK(b.count == t.count);
        CHECK(b.busy_ns == t.busy);
        total += b.count;
        // A name holding more than half the busy time is the one named.
        for (const auto& [name, ns] : t.by_name)
          if (2 * ns > t.busy) CHECK(b.name == name);
        ++checked;
      }
      CHECK(total == s.rows);  // no row lost from any level, none counted twice
    }
  }
  // summary_long: exactly the thread track's ranges of at least long_ns, at most 4,096 of them past 1 us.
  for (const auto& s : tracks) {
    if (s.depth != 0 || s.track != 1) continue;
    std::set<std::pair<std::int64_t, std::int64_t>> want, got;
    for (const auto& [key, v] : rows)
      if (key.first == s.track)
        for (const auto& r : v)
          if (r.end - r.start >= s.long_ns) want.insert({r.start, r.end});
    CHECK((s.long_ns == 1024 || want.size() <= 4096));
    auto& st = db.prepare("SELECT start_ns, end_ns FROM summary_long WHERE track_id = ?1");
    st.bind(1, s.track);
    while (st.step()) got.insert({st.column_int64(0), st.column_int64(1)});
    st.reset();
    CHECK(got == want);
    CHECK(summary_long_starts(db, s.track, INT64_MIN / 4, INT64_MAX / 4, INT64_MIN / 4).size() <= got.size());
  }
  return checked;
}

}  // namespace

TEST_CASE("a closed run's summary counts every row in every bucket of every level, as a brute-force count does", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  auto rows = write_run(path, 0, 7);
  Db db(path, OpenMode::read_only);
  REQUIRE(has_summary(db));
  CHECK(check_against_rows(db, rows) > 100);

  SECTION("a window returns exactly the buckets that overlap it") {
    const auto s = summary_tracks(db).at(1);  // the thread track's depth-1 ops
    const int level = std::max(0, s.levels - 5);
    auto all = summary_buckets(db, s, level, INT64_MIN / 4, INT64_MAX / 4);
    REQUIRE(all.size() > 4);
    const std::int64_t t0 = all[1].start_ns + 1, t1 = all[3].start_ns;  // inside bucket 1 .. bucket 3's start
    auto some = summary_buckets(db, s, level, t0, t1);
    std::vector<SummaryBucket> expected;
    for (const auto& b : all)
      if (b.end_ns > t0 && b.start_ns <= t1) expected.push_back(b);
    REQUIRE(some.size() == expected.size());
    for (std::size_t i = 0; i < some.size(); ++i) CHECK(some[i].start_ns == expected[i].start_ns);
  }
}

TEST_CASE("the summary is rebuilt the same, and a cancelled build leaves none", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  auto rows = write_run(path, 0, 11, /*indexes=*/false);  // a per-rank file: no summary at close
  Db db(path, OpenMode::read_write);
  CHECK_FALSE(has_summary(db));
  std::atomic<bool> cancel{true};
  CHECK_FALSE(build_summary(db, {}, &cancel));
  CHECK_FALSE(has_summary(db));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> progress;
  REQUIRE(build_summary(db, [&](std::uint64_t done, std::uint64_t total) { progress.emplace_back(done, total); }));
  REQUIRE(has_summary(db));
  CHECK(progress.back() == std::make_pair(std::uint64_t{2}, std::uint64_t{2}));  // two tracks
  check_against_rows(db, rows);
}

TEST_CASE("a merged run has the summary of every rank's rows", "[store]") {
  TempDir dir;
  auto run = dir / "run";
  std::filesystem::create_directories(run);
  auto r0 = write_run(run / "rank-0.sqlite", 0, 1, false);
  auto r1 = write_run(run / "rank-1.sqlite", 1, 2, false);
  auto merged = merge_run(run, dir / "merged.sqlite", false, false);
  Db db(merged.out, OpenMode::read_only);
  REQUIRE(has_summary(db));
  // Rank 1's tracks were renumbered by the merge: map them through the track table.
  std::map<std::pair<std::uint32_t, int>, std::vector<Row>> rows;
  auto& st = db.prepare("SELECT id, rank, kind FROM track ORDER BY id");
  while (st.step()) {
    const auto id = static_cast<std::uint32_t>(st.column_int64(0));
    const auto& src = st.column_int64(1) == 0 ? r0 : r1;
    const std::uint32_t local = st.column_text(2) == "thread" ? 1 : 2;
    for (const auto& [key, v] : src)
      if (key.first == local) rows[{id, key.second}] = v;
  }
  st.reset();
  check_against_rows(db, rows);
}

namespace {

// Every row of the three summary tables, in key order, as text.
std::vector<std::string> summary_dump(Db& db) {
  std::vector<std::string> out;
  for (const char* sql : {"SELECT * FROM summary_track ORDER BY track_id, depth",
                          "SELECT * FROM summary_bucket ORDER BY track_id, depth, level, bucket",
                          "SELECT * FROM summary_long ORDER BY track_id, start_ns, kind"}) {
    auto& st = db.prepare(sql);
    while (st.step()) {
      std::ostringstream row;
      row << sql;
      for (int c = 0; c < st.column_count(); ++c) row << ' ' << st.column_int64(c);
      out.push_back(row.str());
    }
    st.reset();
  }
  return out;
}

// A thread track (steps, ops inside them, two ranges of one key: a clock coarser than 1 ns) and a
// stream, handed to a Writer in the order build_summary reads them; `summary` sees them too, less the
// rows that `skip` names (by their position in that order), and goes to the writer when given.
void write_in_order(const std::filesystem::path& path, std::unique_ptr<SummaryBuilder> summary, int skip = -1,
                    bool shuffle_one = false) {
  WriterOptions o;
  o.path = path;
  o.handle_signals = false;
  Writer w(o);
  const auto thread = w.add_track(TrackKind::thread, "main");
  const auto stream = w.add_track(TrackKind::stream, "stream 7");
  const std::uint32_t step = w.intern("step"), op = w.intern("layer1.0.conv1"), other = w.intern("relu");
  std::vector<RangeRow> ranges;
  std::vector<KernelRow> kernels;
  std::mt19937 rng(5);
  std::int64_t t = 5'000'000;
  for (int s = 0; s < 30; ++s) {
    const std::int64_t len = 1'000'000 + static_cast<std::int64_t>(rng() % 2'000'000);
    ranges.push_back(RangeRow{thread, step, t, t + len, 7, 0, s, 0});
    for (std::int64_t u = t + 1000; u + 40'000 < t + len; u += 41'000 + static_cast<std::int64_t>(rng() % 3000)) {
      ranges.push_back(RangeRow{thread, rng() % 3 ? op : other, u, u + 40'000, 0, 1, s, 0});
      if (s == 3 && ranges.size() % 7 == 0)  // the same key again
        ranges.push_back(RangeRow{thread, other, u, u + 20'000, 0, 1, s, 0});
      KernelRow k{};
      k.track = stream;
      k.name = op;
      k.start_ns = u + 5000;
      k.end_ns = u + 5000 + static_cast<std::int64_t>(rng() % 90'000);
      kernels.push_back(k);
    }
    t += len + 7000;
  }
  if (shuffle_one) std::swap(ranges[0], ranges[1]);  // an op before the step that encloses it
  for (std::size_t i = 0; i < ranges.size(); ++i)
    if (summary && static_cast<int>(i) != skip) summary->add(ranges[i]);
  w.add(std::span<const RangeRow>(ranges));
  w.add(std::span<const KernelRow>(kernels));
  if (summary) {
    summary->end_track(thread);
    for (const auto& k : kernels) summary->add(k);
    w.use_summary(std::move(summary));
  }
  REQUIRE(w.finish());
}

}  // namespace

TEST_CASE("a summary built from the rows as they are handed over equals the one built from the file", "[store]") {
  TempDir dir;
  const auto path = dir / "run.sqlite";
  auto rebuilt = [&](bool rebuild) {
    Db db(path, OpenMode::read_write);
    REQUIRE(has_summary(db));
    if (rebuild) REQUIRE(build_summary(db));
    return summary_dump(db);
  };
  SECTION("in order: the writer writes the builder's tables, and they are the file's") {
    write_in_order(path, std::make_unique<SummaryBuilder>());
    const auto handed = rebuilt(false);
    CHECK(handed.size() > 100);
    const auto from_file = rebuilt(true);
    CHECK(handed == from_file);
  }
  SECTION("a row the builder did not see makes other tables: the comparison above can fail") {
    write_in_order(path, std::make_unique<SummaryBuilder>(), /*skip=*/40);
    const auto handed = rebuilt(false);
    const auto from_file = rebuilt(true);
    CHECK(handed != from_file);
  }
  SECTION("rows out of order: the builder says so, and the writer builds the tables from the file") {
    SummaryBuilder probe;
    probe.add(1, true, 100, 200, 16, 1);
    CHECK(probe.in_order());
    probe.add(1, true, 100, 200, 0, 1);  // same start, a lower kind
    CHECK_FALSE(probe.in_order());
    write_in_order(path, std::make_unique<SummaryBuilder>(), -1, /*shuffle_one=*/true);
    const auto written = rebuilt(false);
    const auto from_file = rebuilt(true);
    CHECK(written == from_file);
  }
}
