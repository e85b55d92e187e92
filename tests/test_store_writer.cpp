// Writer under load and under failure: concurrent producers, overflow accounting, a SIGKILLed writer,
// SIGTERM handling, and a locked file.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"

using namespace wb::store;
using wb::test::range_pages_unused;
using wb::test::TempDir;
using wb::test::write_two_tracks;

namespace {

WriterOptions options(const std::filesystem::path& p) {
  WriterOptions o;
  o.path = p;
  o.handle_signals = false;
  return o;
}

std::int64_t count(Db& db, const std::string& sql) { return db.query_int64(sql); }

// Reads every int the child wrote to the pipe until EOF; returns how many there were and the last.
std::pair<int, int> drain_acks(int fd) {
  int n = 0, last = -1, v = 0;
  while (read(fd, &v, sizeof v) == static_cast<ssize_t>(sizeof v)) {
    ++n;
    last = v;
  }
  return {n, last};
}

}  // namespace

TEST_CASE("4 producer threads writing 1M rows lose nothing", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  constexpr int kThreads = 4;
  constexpr int kPerThread = 250'000;
  {
    Writer w(options(path));
    std::vector<std::thread> producers;
    for (int t = 0; t < kThreads; ++t) {
      producers.emplace_back([&w, t] {
        auto track = w.add_track(TrackKind::thread, "producer-" + std::to_string(t));
        std::vector<RangeRow> chunk;
        for (int i = 0; i < kPerThread; ++i) {
          auto name = w.intern("op." + std::to_string(i % 100));  // concurrent interning of shared names
          RangeRow r{track, name, i * 100LL, i * 100LL + 50, static_cast<std::uint8_t>(i % 8), 0, i / 1000,
                     static_cast<std::uint64_t>(i)};
          if (i % 3 == 0) {
            w.add(r);  // single rows
          } else {
            chunk.push_back(r);  // and spans
            if (chunk.size() == 64) {
              w.add(std::span<const RangeRow>(chunk));
              chunk.clear();
            }
          }
        }
        w.add(std::span<const RangeRow>(chunk));
      });
    }
    for (auto& p : producers) p.join();
    REQUIRE(w.finish());
    CHECK(w.dropped() == 0);
  }
  Reader r(path);
  Db& db = r.db();
  CHECK(count(db, "SELECT count(*) FROM range") == kThreads * kPerThread);
  CHECK(count(db, "SELECT count(*) FROM string WHERE text LIKE 'op.%'") == 100);
  CHECK(r.meta().at("dropped_events") == "0");
  for (const auto& track : r.tracks()) {
    auto rows = r.ranges(track.id);
    REQUIRE(rows.size() == static_cast<std::size_t>(kPerThread));
    // Every producer's i appears once, with the name it interned.
    for (std::size_t i = 0; i < rows.size(); i += 9973) {
      CHECK(rows[i].corr_id == i);
      CHECK(r.string_at(rows[i].name) == "op." + std::to_string(i % 100));
    }
  }
}

TEST_CASE("rows beyond max_pending_rows are dropped and counted", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  {
    auto o = options(path);
    o.max_pending_rows = 1000;
    o.flush_interval = std::chrono::milliseconds(60'000);  // nothing commits until flush()
    o.eager_commit_rows = 0;
    Writer w(o);
    auto track = w.add_track(TrackKind::thread, "main");
    for (int i = 0; i < 5000; ++i) w.add(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
    CHECK(w.dropped() == 4000);
    w.count_dropped(7);  // a producer's own losses
    w.flush();
    for (int i = 0; i < 10; ++i) w.add(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
    CHECK(w.dropped() == 4007);
    REQUIRE(w.finish());
  }
  Reader r(path);
  CHECK(r.row_counts().at("range") == 1010);
  CHECK(r.meta().at("dropped_events") == "4007");
  CHECK(r.ranks().at(0).dropped_events == 4007);
}

TEST_CASE("with wait_for_room, rows beyond max_pending_rows wait for the writer instead of being dropped", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  const auto t0 = std::chrono::steady_clock::now();
  {
    auto o = options(path);
    o.max_pending_rows = 1000;
    o.wait_for_room = true;
    o.flush_interval = std::chrono::milliseconds(60'000);  // only a wait for room commits before flush()
    o.eager_commit_rows = 0;
    Writer w(o);
    auto track = w.add_track(TrackKind::thread, "main");
    for (int i = 0; i < 5000; ++i) w.add(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
    // A span over the limit waits until nothing is pending, then goes in whole.
    std::vector<RangeRow> big;
    for (int i = 5000; i < 8000; ++i) big.push_back(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
    w.add(std::span<const RangeRow>(big));
    CHECK(w.dropped() == 0);
    CHECK(w.stats().commits >= 4);  // each wait had the pending rows committed
    REQUIRE(w.finish());
  }
  // Each wait woke the writer at once rather than after the minute-long interval.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
  Reader r(path);
  CHECK(r.row_counts().at("range") == 8000);
  CHECK(r.meta().at("dropped_events") == "0");
}

TEST_CASE("kernel rows written to a file of their own are adopted whole, with the indexes the file has", "[store]") {
  TempDir dir;
  for (const bool bulk : {true, false}) {
    CAPTURE(bulk);
    const auto path = dir / (bulk ? "bulk.sqlite" : "plain.sqlite");
    const auto side = dir / (bulk ? "bulk.kernels" : "plain.kernels");
    std::vector<KernelRow> a, b;
    {
      auto o = options(path);
      o.bulk_load = bulk;  // the indexes exist from the start (an import), or are built at the close
      Writer w(o);
      const auto s1 = w.add_track(TrackKind::stream, "cuda:0 stream 7");
      const auto s2 = w.add_track(TrackKind::stream, "cuda:0 stream 13");
      const auto name = w.intern("sgemm");
      for (int i = 0; i < 5000; ++i) {
        KernelRow k;
        k.track = i % 3 == 0 ? s2 : s1;
        k.name = name;
        k.start_ns = 1000 * i;
        k.end_ns = 1000 * i + 700;
        k.corr_id = static_cast<std::uint64_t>(i + 1);
        k.grid[0] = i;
        k.grid[1] = 2;
        k.block[0] = 256;
        k.occupancy = 0.25;
        k.launch_ns = 1000 * i - 300;
        (k.track == s1 ? a : b).push_back(k);
      }
      write_kernel_file(side, {std::span<const KernelRow>(a), std::span<const KernelRow>(b)}, bulk);
      w.adopt_kernels(side);
      REQUIRE(w.finish());
    }
    Reader r(path);
    CHECK(r.kernels(a.front().track) == a);
    CHECK(r.kernels(b.front().track) == b);
    CHECK(r.kernels_by_corr(4) == std::vector<KernelRow>{b[1]});
    Db db(path, OpenMode::read_only);
    CHECK(count(db, "SELECT count(*) FROM kernel") == 5000);
    CHECK(count(db, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'kernel'") == 2);
  }
}

TEST_CASE("a batch past eager_commit_rows is committed before the interval is up", "[store]") {
  TempDir dir;
  auto o = options(dir / "run.sqlite");
  o.flush_interval = std::chrono::milliseconds(60'000);
  o.eager_commit_rows = 100;
  Writer w(o);
  auto track = w.add_track(TrackKind::thread, "main");
  for (int i = 0; i < 99; ++i) w.add(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(w.stats().rows_committed == 0);  // below the threshold: waits for the (minute-long) interval
  for (int i = 0; i < 400; ++i) w.add(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (w.stats().rows_committed == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(w.stats().rows_committed >= 100);
  CHECK(w.dropped() == 0);
}

TEST_CASE("a writer killed with SIGKILL leaves a valid, incomplete file with every flushed batch", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  constexpr int kBatch = 2000;
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(fds[0]);
    {
      auto o = options(path);
      o.flush_interval = std::chrono::milliseconds(20);
      Writer w(o);
      auto track = w.add_track(TrackKind::thread, "main");
      for (int batch = 0;; ++batch) {
        auto name = w.intern("batch." + std::to_string(batch));
        for (int i = 0; i < kBatch; ++i)
          w.add(RangeRow{track, name, batch * 1'000'000LL + i, batch * 1'000'000LL + i + 1, 0, 0, batch, 0});
        w.flush();
        // Reported only after flush() returned: this batch is committed.
        if (write(fds[1], &batch, sizeof batch) != static_cast<ssize_t>(sizeof batch)) _exit(3);
      }
    }
  }
  close(fds[1]);
  // Let it commit some batches, then kill it mid-stream.
  int v = 0, seen = 0;
  while (seen < 25 && read(fds[0], &v, sizeof v) == static_cast<ssize_t>(sizeof v)) ++seen;
  REQUIRE(seen == 25);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  auto [more, last] = drain_acks(fds[0]);
  close(fds[0]);
  int last_flushed = more > 0 ? last : v;
  CAPTURE(last_flushed);

  {
    // A read-only reader first: it must cope with the WAL and shared-memory files the kill left behind.
    Reader first(path);
    CHECK(first.row_counts().at("range") >= static_cast<std::int64_t>(last_flushed + 1) * kBatch);
  }
  {
    Db db = open_run(path, OpenMode::read_write);
    Statement& check = db.prepare("PRAGMA integrity_check");
    REQUIRE(check.step());
    CHECK(check.column_text(0) == "ok");
    check.reset();
  }
  Reader r(path);
  CHECK_FALSE(r.complete());
  CHECK(r.meta().at("complete") == "0");
  Db& db = r.db();
  for (int batch = 0; batch <= last_flushed; ++batch) {
    CAPTURE(batch);
    Statement& st = db.prepare("SELECT count(*) FROM range WHERE step = ?");
    st.bind(1, batch);
    REQUIRE(st.step());
    CHECK(st.column_int64(0) == kBatch);
    st.reset();
    CHECK(count(db, "SELECT count(*) FROM string WHERE text = 'batch." + std::to_string(batch) + "'") == 1);
  }
  // A batch is committed whole or not at all.
  CHECK(count(db, "SELECT count(*) FROM range") % kBatch == 0);
}

TEST_CASE("SIGTERM commits pending rows, sets stop_requested, and re-raises after the grace period", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  constexpr int kRows = 5000;
  // honour = the program stops on stop_requested(); otherwise it ignores it and must be ended by the re-raise.
  for (bool honour : {true, false}) {
    CAPTURE(honour);
    std::filesystem::remove(path);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(fds[0]);
      {
        WriterOptions o;
        o.path = path;
        o.flush_interval = std::chrono::milliseconds(600'000);  // only the signal (or the close) commits
        Writer w(o);
        auto track = w.add_track(TrackKind::thread, "main");
        for (int i = 0; i < kRows; ++i) w.add(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
        int ready = 1;
        if (write(fds[1], &ready, sizeof ready) != static_cast<ssize_t>(sizeof ready)) _exit(3);
        // Ignoring the request, the process only ends by the re-raise, and no destructor ever runs:
        // the rows can only be in the file if the signal path committed them.
        while (!honour || !Writer::stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }  // honouring it: the training loop stops and closes its Writer
      _exit(0);
    }
    close(fds[1]);
    int ready = 0;
    REQUIRE(read(fds[0], &ready, sizeof ready) == static_cast<ssize_t>(sizeof ready));
    close(fds[0]);
    auto t0 = std::chrono::steady_clock::now();
    kill(child, SIGTERM);
    int status = 0;
    waitpid(child, &status, 0);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(seconds);
    if (honour) {
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
      CHECK(seconds < 2.0);
    } else {
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == SIGTERM);
      CHECK(seconds >= 2.9);
      CHECK(seconds < 6.0);
    }
    Reader r(path);
    CHECK(r.row_counts().at("range") == kRows);
    CHECK_FALSE(r.complete());
  }
}

TEST_CASE("a locked file is reported once, counted as dropped, and leaves the run incomplete", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  {
    Writer w(options(path));
    auto track = w.add_track(TrackKind::thread, "main");
    for (int i = 0; i < 100; ++i) w.add(RangeRow{track, w.intern("before"), i, i + 1, 0, 0, 0, 0});
    w.flush();
    CHECK_FALSE(w.failed());

    Db other(path, OpenMode::read_write);
    other.exec("BEGIN EXCLUSIVE");  // another process holds the write lock
    auto during = w.intern("during");  // a string interned while commits fail must survive
    for (int i = 0; i < 50; ++i) w.add(RangeRow{track, during, 1000 + i, 1001 + i, 0, 0, 0, 0});
    w.flush();  // returns (the producer is never blocked forever) with the batch counted as dropped
    CHECK(w.failed());
    CHECK(w.dropped() == 50);
    other.exec("ROLLBACK");

    for (int i = 0; i < 10; ++i) w.add(RangeRow{track, during, 2000 + i, 2001 + i, 0, 0, 0, 0});
    w.flush();
    CHECK(w.dropped() == 50);
    CHECK_FALSE(w.finish());  // complete stays 0 after a failed commit
  }
  Reader r(path);
  CHECK_FALSE(r.complete());
  CHECK(r.row_counts().at("range") == 110);
  CHECK(r.meta().at("dropped_events") == "50");
  auto rows = r.ranges(1);
  REQUIRE(rows.size() == 110);
  CHECK(r.string_at(rows.back().name) == "during");
}

TEST_CASE("rows reach the file within the flush interval without any flush() call", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  auto o = options(path);
  o.flush_interval = std::chrono::milliseconds(100);
  Writer w(o);
  auto track = w.add_track(TrackKind::thread, "main");
  for (int i = 0; i < 1000; ++i) w.add(RangeRow{track, 0, i, i + 1, 0, 0, 0, 0});
  auto t0 = std::chrono::steady_clock::now();
  // A reader beside the live writer (WAL) sees the rows once the background thread committed them.
  std::int64_t seen = 0;
  while (seen < 1000 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Db db(path, OpenMode::read_only);
    seen = db.query_int64("SELECT count(*) FROM range");
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(waited);
  CHECK(seen == 1000);
  CHECK(waited < 1.0);  // 100 ms interval; generous for a loaded machine, far below "never"
}

TEST_CASE("ranges that share a track, start, depth and category are all kept, with their times", "[store]") {
  // A clock coarser than 1 ns (an imported trace's microseconds) gives such ranges; range_data's key is
  // (track, start, depth * 16 + category), so the later one's kind gets 4096 more. Moving its start
  // instead would move an enclosing range past the start of what it encloses.
  TempDir dir;
  auto path = dir / "run.sqlite";
  std::vector<RangeRow> sent;
  {
    Writer w(options(path));
    auto track = w.add_track(TrackKind::thread, "main");
    auto a = w.intern("a"), b = w.intern("b");
    // Three equal keys in one batch, one more in a later batch, and a different category at the same start.
    sent = {RangeRow{track, a, 5000, 5000, 0, 1, 0, 0}, RangeRow{track, b, 5000, 6000, 0, 1, 0, 0},
            RangeRow{track, a, 5000, 7000, 0, 1, 0, 0}, RangeRow{track, b, 5000, 5500, 1, 1, 0, 0}};
    for (int i = 0; i < 200; ++i)  // enough for the 128-row statements, with a duplicate inside one
      sent.push_back(RangeRow{track, a, 10'000 + (i / 2) * 10, 10'000 + (i / 2) * 10 + 3, 0, 2, 0, 0});
    w.add(std::span<const RangeRow>(sent));
    w.flush();
    w.add(RangeRow{track, b, 5000, 9000, 0, 1, 0, 0});
    w.finish();
  }
  Reader r(path);
  const auto got = r.ranges(r.tracks().at(0).id);
  REQUIRE(got.size() == sent.size() + 1);
  REQUIRE(r.row_counts().at("range") == static_cast<std::int64_t>(sent.size() + 1));
  // Every range is there with its start, name, end - start and category.
  std::map<std::pair<std::int64_t, int>, int> at;  // (start, category) -> ranges with depth 1
  for (const auto& g : got) {
    if (g.depth == 1) ++at[{g.start_ns, g.category}];
  }
  CHECK(at == std::map<std::pair<std::int64_t, int>, int>{{{5000, 0}, 4}, {{5000, 1}, 1}});
  std::multiset<std::tuple<std::uint32_t, std::int64_t, int, int>> want, have;
  for (const auto& s : sent) want.insert({s.name, s.end_ns - s.start_ns, s.category, s.depth});
  want.insert({sent[1].name, 4000, 0, 1});  // the later batch's range (b, 9000 - 5000)
  for (const auto& g : got) have.insert({g.name, g.end_ns - g.start_ns, g.category, g.depth});
  CHECK(have == want);
  // The 200 depth-2 ranges came in pairs at the same start, and are read back so.
  std::map<std::int64_t, int> starts;
  for (const auto& g : got) {
    if (g.depth == 2) ++starts[g.start_ns];
  }
  CHECK(starts.size() == 100);
  CHECK(std::all_of(starts.begin(), starts.end(), [](const auto& s) { return s.second == 2; }));
  // A range inserted through the view `range` (the SQL way in) with a taken key is numbered the same way.
  {
    Db db(path, OpenMode::read_write);
    db.exec("INSERT INTO range SELECT track_id, start_ns, end_ns, name_id, category, depth, step, corr_id FROM range "
            "WHERE start_ns = 5000 AND category = 1");
    CHECK(db.query_int64("SELECT count(*) FROM range WHERE start_ns = 5000 AND category = 1 AND depth = 1") == 2);
    CHECK(db.query_int64("SELECT max(kind) FROM range_data WHERE kind & 4095 = 17") == 17 + 4096);
  }
}

TEST_CASE("in a bulk-loaded file (no journal), a range whose key was committed earlier is added once", "[store]") {
  // Without a journal a failed statement cannot be rolled back, so a key taken by an earlier commit must be
  // found before the insert: an import writes such files, and a retry after a partial 128-row statement
  // once stored the statement's first rows twice.
  TempDir dir;
  auto path = dir / "bulk.sqlite";
  std::vector<RangeRow> later;
  std::uint32_t track = 0;
  {
    WriterOptions o = options(path);
    o.bulk_load = true;
    Writer w(o);
    track = w.add_track(TrackKind::thread, "main");
    auto op = w.intern("op");
    w.add(RangeRow{track, op, 50'000, 50'010, 0, 1, 0, 0});
    w.flush();
    for (int i = 0; i < 300; ++i) later.push_back(RangeRow{track, op, 40'000 + i * 50, 40'000 + i * 50 + 10, 0, 1, 0, 0});
    w.add(std::span<const RangeRow>(later));  // the 201st (start 50,000) meets the committed range
    w.finish();
  }
  Reader r(path);
  const auto got = r.ranges(track);
  CHECK(got.size() == 301);
  std::map<std::int64_t, int> starts;
  for (const auto& g : got) ++starts[g.start_ns];
  CHECK(starts.size() == 300);
  CHECK(starts.at(50'000) == 2);
}

TEST_CASE("a closed run file's range pages are packed full, and one a reader holds is left as written", "[store]") {
  // Appended in key order, a WITHOUT ROWID table's pages are about seven eighths full; the writer replaces
  // the file at its close with a packed copy.
  TempDir dir;
  std::map<std::string, double> unused;
  for (bool pack : {true, false}) {
    const auto path = dir / (pack ? "packed.sqlite" : "unpacked.sqlite");
    WriterOptions o = options(path);
    o.pack = pack;
    {
      Writer w(o);
      write_two_tracks(w, 100'000);
      REQUIRE(w.finish());
    }
    unused[path.stem().string()] = range_pages_unused(path);
    Reader r(path);
    CHECK(r.complete());
    CHECK(r.db().query_int64("SELECT count(*) FROM range") == 200'000);
    CHECK(r.db().query_int64("SELECT count(*) FROM range WHERE end_ns - start_ns = 700 AND category = 1") == 100'000);
    CHECK_FALSE(std::filesystem::exists(path.string() + ".packed"));
  }
  CAPTURE(unused);
  CHECK(unused.at("packed") < 0.02);
  CHECK(unused.at("unpacked") > 0.08);
  CHECK(std::filesystem::file_size(dir / "packed.sqlite") < std::filesystem::file_size(dir / "unpacked.sqlite"));

  // A file that is mostly dumped tensors is left as written: the copy would cost the whole file to save
  // an eighth of its ranges' pages.
  const auto dumped = dir / "dumped.sqlite";
  {
    Writer w(options(dumped));
    write_two_tracks(w, 100'000);
    w.add(TensorRow{"run", 0, 0, "act", "layer1", 0, "F32", {4, 1024, 1024}, std::vector<std::byte>(16 << 20)});
    REQUIRE(w.finish());
  }
  CHECK(range_pages_unused(dumped) > 0.08);
  CHECK(Reader(dumped).db().query_int64("SELECT count(*) FROM range") == 200'000);

  // A reader with the file open keeps its WAL: the file is not replaced (the WAL would be replayed into the
  // copy), and nothing recorded is lost.
  const auto held = dir / "held.sqlite";
  {
    auto w = std::make_unique<Writer>(options(held));
    write_two_tracks(*w, 100'000);
    REQUIRE(w->finish());
    Db reader(held, OpenMode::read_only);
    CHECK(reader.query_int64("SELECT count(*) FROM range_data") == 200'000);
    auto& st = reader.prepare("SELECT track_id FROM range_data");
    REQUIRE(st.step());  // a read transaction open while the writer closes
    struct stat before {}, after {};
    REQUIRE(::stat(held.c_str(), &before) == 0);
    w.reset();
    REQUIRE(::stat(held.c_str(), &after) == 0);
    CHECK(after.st_ino == before.st_ino);  // the same file, not a copy renamed over it
    st.reset();
  }
  CHECK_FALSE(std::filesystem::exists(held.string() + ".packed"));
  Reader r(held);
  CHECK(r.complete());
  CHECK(r.db().query_int64("SELECT count(*) FROM range") == 200'000);
  CHECK(range_pages_unused(held) > 0.08);
}
