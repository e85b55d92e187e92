// Every table written with Writer reads back equal through Reader; Transaction and overlap queries.
#include <catch2/catch.hpp>

#include <random>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "store_test_util.hpp"

using namespace wb::store;
using wb::test::TempDir;

namespace {

WriterOptions options(const std::filesystem::path& p) {
  WriterOptions o;
  o.path = p;
  o.handle_signals = false;
  return o;
}

std::vector<std::byte> random_bytes(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

}  // namespace

TEST_CASE("every table round-trips through Writer and Reader", "[store]") {
  // prepare
  TempDir dir;
  auto path = dir / "run.sqlite";
  std::mt19937_64 rng(42);
  std::vector<RangeRow> ranges;
  std::vector<KernelRow> kernels;
  std::vector<CounterRow> counters;
  std::vector<AllreduceRow> allreduces;
  std::vector<StepRow> steps;
  std::vector<ParamRow> params;
  std::vector<TensorRow> tensors;
  RankRow rank{3, "node-7", "cuda:1", 4242, -1234567, -1234999, 0};
  std::uint32_t thread_track = 0, stream_track = 0, queue_track = 0, comm_track = 0;
  std::vector<std::uint32_t> name_ids;
  {
    auto opts = options(path);
    opts.rank = 3;
    Writer w(opts);
    thread_track = w.add_track(TrackKind::thread, "main");
    stream_track = w.add_track(TrackKind::stream, "stream 7");
    queue_track = w.add_track(TrackKind::queue, "batch queue");
    comm_track = w.add_track(TrackKind::comm, "nccl");
    for (int i = 0; i < 50; ++i) name_ids.push_back(w.intern("op." + std::to_string(i)));
    REQUIRE(w.intern("op.7") == name_ids[7]);  // memoized

    for (int i = 0; i < 1000; ++i) {
      RangeRow r;
      r.track = thread_track;
      r.name = name_ids[static_cast<std::size_t>(i) % name_ids.size()];
      r.start_ns = 1'000'000'000'000LL + i * 1000;
      r.end_ns = r.start_ns + 500 + (i % 7) * 100;
      r.category = static_cast<std::uint8_t>(i % 8);
      r.depth = static_cast<std::uint8_t>(i % 3);
      r.step = i / 100;
      r.corr_id = (i % 2) ? 0xFFFF'FFFF'0000'0000ULL + static_cast<std::uint64_t>(i) : 0;  // high bit set survives
      ranges.push_back(r);
    }
    for (int i = 0; i < 300; ++i) {
      KernelRow k;
      k.track = stream_track;
      k.name = name_ids[static_cast<std::size_t>(i) % 11];
      k.start_ns = 5'000 + i * 300;
      k.end_ns = k.start_ns + 250;
      k.corr_id = static_cast<std::uint64_t>(i + 1);
      k.kind = static_cast<std::uint8_t>(i % 3);
      k.grid[0] = i, k.grid[1] = 2, k.grid[2] = 3;
      k.block[0] = 256, k.block[1] = 1, k.block[2] = i % 4;
      k.bytes = (k.kind == 0) ? 0 : i * 4096LL;
      if (i % 5 != 0) {  // launch details where known, -1 elsewhere
        k.blocks_per_sm = 0.25f * static_cast<float>(i % 7);
        k.occupancy = 0.125f * static_cast<float>(i % 8);
        k.launch_ns = k.start_ns - 40;
        k.launch_end_ns = k.start_ns - 10;
      }
      kernels.push_back(k);
    }
    for (int i = 0; i < 200; ++i) counters.push_back(CounterRow{queue_track, 100LL * i, 0.25 * (i % 9)});
    for (int s = 0; s < 5; ++s)
      for (int b = 0; b < 3; ++b)
        allreduces.push_back(AllreduceRow{3, s, b, b * 50, b * 50 + 49, 1LL << (20 + b), 10LL * s + b,
                                          10LL * s + b + 1, 10LL * s + b + 5});
    for (int s = 0; s < 10; ++s)
      steps.push_back(StepRow{3, s, s * 1000LL, s * 1000LL + 900, 10LL * s, 5LL * s, 2.3 - 0.1 * s, 0.1 / (s + 1), 32});
    params.push_back(ParamRow{0, "conv1.weight", {64, 3, 7, 7}, 64 * 3 * 7 * 7, 1, true});
    params.push_back(ParamRow{1, "bn1.weight", {64}, 64, 1, false});
    params.push_back(ParamRow{2, "fc.bias", {1000}, 1000, 0, false});
    tensors.push_back(TensorRow{"run", 0, 3, "input", "", 0, "F32", {2, 3, 4, 4}, random_bytes(rng, 2 * 3 * 4 * 4 * 4)});
    tensors.push_back(TensorRow{"run", 0, 3, "param", "conv1.weight", 1, "F32", {4, 3}, random_bytes(rng, 48)});
    tensors.push_back(TensorRow{"run", 0, 3, "grad", "conv1.weight", 7, "F32", {4, 3}, random_bytes(rng, 48)});
    tensors.push_back(TensorRow{"run", 0, 3, "label", "", 2, "I64", {2}, random_bytes(rng, 16)});
    tensors.push_back(TensorRow{"run", 0, 3, "loss", "", 9, "F64", {}, random_bytes(rng, 8)});
    tensors.push_back(TensorRow{"torch", 0, 0, "act", "layer1.0", 3, "F32", {0, 5}, {}});  // empty tensor

    // run: from several threads, as producers do
    std::thread t1([&] { w.add(std::span<const RangeRow>(ranges).first(500)); });
    std::thread t2([&] {
      for (std::size_t i = 500; i < ranges.size(); ++i) w.add(ranges[i]);
    });
    t1.join();
    t2.join();
    w.add(std::span<const KernelRow>(kernels));
    w.add(std::span<const CounterRow>(counters));
    w.add(std::span<const AllreduceRow>(allreduces));
    for (const auto& s : steps) w.add(s);
    for (const auto& p : params) w.add(p);
    for (const auto& t : tensors) w.add(t);
    w.set_rank(rank);
    w.set_meta("config_json", R"({"batch_size": 32, "model": "resnet50"})");
    w.set_meta("world_size", "4");
    w.set_meta("device", "cuda:1");
    REQUIRE(w.finish());
    REQUIRE(w.dropped() == 0);
  }
  ComparisonRow cmp{0, "2026-01-02T03:04:05Z", "a.sqlite", "ref.safetensors", "migration-fp32", 10, 2,
                    R"({"name":"layer1.0.conv1","kind":"act","reason":"cosine"})", R"({"rows":[]})"};
  std::vector<ComparisonEntryRow> cmp_rows{{0, 0, "input", "input", "pass", "{}"},
                                           {0, 1, "layer1.0.conv1", "act", "fail", R"({"cosine":0.5})"}};
  auto cmp_id = save_comparison(path, cmp, cmp_rows);

  // verify
  Reader r(path);
  auto meta = r.meta();
  CHECK(meta.at("schema_version") == std::to_string(kSchemaVersion));
  CHECK(meta.at("complete") == "1");
  CHECK(meta.at("rank") == "3");
  CHECK(r.complete());
  CHECK(r.world_size() == 4);
  CHECK(r.config()["batch_size"] == 32);
  CHECK(r.db().query_int64("PRAGMA user_version") == kSchemaVersion);
  CHECK(schema_version(r.db()) == kSchemaVersion);

  auto tracks = r.tracks();
  REQUIRE(tracks.size() == 4);
  CHECK(tracks[0].id == thread_track);
  CHECK(tracks[0].rank == 3);
  CHECK(tracks[0].kind == TrackKind::thread);
  CHECK(r.string_at(tracks[0].name) == "main");
  CHECK(tracks[1].kind == TrackKind::stream);
  CHECK(r.string_at(tracks[1].name) == "stream 7");
  CHECK(tracks[2].kind == TrackKind::queue);
  CHECK(tracks[3].kind == TrackKind::comm);
  CHECK(tracks[3].id == comm_track);
  for (std::size_t i = 0; i < name_ids.size(); ++i) CHECK(r.string_at(name_ids[i]) == "op." + std::to_string(i));
  REQUIRE_THROWS_AS(r.string_at(99999), StoreError);

  auto got_ranges = r.ranges(thread_track);
  CHECK(got_ranges == ranges);  // inserted in start order already
  CHECK(r.kernels(stream_track) == kernels);
  CHECK(r.counters(queue_track) == counters);
  CHECK(r.allreduces() == allreduces);
  CHECK(r.allreduces(3).size() == allreduces.size());
  CHECK(r.allreduces(0).empty());
  CHECK(r.steps() == steps);
  CHECK(r.steps(3) == steps);
  CHECK(r.params() == params);
  auto ranks = r.ranks();
  REQUIRE(ranks.size() == 1);
  CHECK(ranks[0] == rank);

  auto infos = r.tensors();
  REQUIRE(infos.size() == tensors.size());
  for (const auto& t : tensors) {
    CAPTURE(t.kind, t.name);
    auto got = r.tensor(t.source, t.kind, t.name, t.step, t.rank);
    CHECK(got == t);
    bool listed = false;
    for (const auto& info : infos)
      listed |= info.source == t.source && info.kind == t.kind && info.name == t.name && info.shape == t.shape &&
                info.dtype == t.dtype && info.bytes == static_cast<std::int64_t>(t.data.size()) &&
                info.exec_order == t.exec_order;
    CHECK(listed);
  }
  CHECK(r.tensors("torch").size() == 1);
  // Without a kind, a name under several kinds is ambiguous; a unique one is found.
  REQUIRE_THROWS_AS(r.tensor("run", "conv1.weight", 0, 3), StoreError);
  CHECK(r.tensor("torch", "layer1.0", 0, 0).kind == "act");
  REQUIRE_THROWS_AS(r.tensor("run", "param", "nope", 0, 3), StoreError);

  auto comparisons = r.comparisons();
  REQUIRE(comparisons.size() == 1);
  cmp.id = cmp_id;
  CHECK(comparisons[0] == cmp);
  auto got_rows = r.comparison_rows(cmp_id);
  REQUIRE(got_rows.size() == 2);
  for (auto& row : cmp_rows) row.comparison_id = cmp_id;
  CHECK(got_rows == cmp_rows);

  auto counts = r.row_counts();
  CHECK(counts.at("range") == 1000);
  CHECK(counts.at("kernel") == 300);
  CHECK(counts.at("counter") == 200);
  CHECK(counts.at("allreduce") == 15);
  CHECK(counts.at("step") == 10);
  CHECK(counts.at("param") == 3);
  CHECK(counts.at("tensor") == 6);
  CHECK(counts.at("track") == 4);
  CHECK(counts.at("rank") == 1);
  CHECK(counts.at("comparison") == 1);
  CHECK(counts.at("comparison_row") == 2);

  // The closed file is one self-contained file (WAL folded back).
  CHECK_FALSE(std::filesystem::exists(dir / "run.sqlite-wal"));
}

TEST_CASE("overlap queries return exactly the ranges that intersect the window", "[store]") {
  TempDir dir;
  auto path = dir / "run.sqlite";
  std::mt19937_64 rng(7);
  std::vector<RangeRow> rows;
  std::uint32_t track = 0;
  {
    Writer w(options(path));
    track = w.add_track(TrackKind::thread, "main");
    std::uint32_t other = w.add_track(TrackKind::thread, "worker");
    auto name = w.intern("op");
    std::int64_t t = 0;
    for (int i = 0; i < 5000; ++i) {
      t += static_cast<std::int64_t>(rng() % 1000);
      // Mostly short ranges with a few long ones, so a naive start-time window would miss some.
      std::int64_t len = (i % 500 == 0) ? 200'000 : static_cast<std::int64_t>(rng() % 3000);
      rows.push_back(RangeRow{track, name, t, t + len, 0, 0, -1, 0});
      w.add(rows.back());
      w.add(RangeRow{other, name, t, t + 1, 0, 0, -1, 0});
    }
    w.finish();
  }
  Reader r(path);
  for (auto [t0, t1] : {std::pair<std::int64_t, std::int64_t>{0, 10}, {100'000, 150'000}, {1'000'000, 1'000'000},
                        {2'400'000, 9'000'000}, {-50, -10}}) {
    CAPTURE(t0, t1);
    std::vector<RangeRow> expected;
    for (const auto& row : rows)
      if (row.start_ns <= t1 && row.end_ns >= t0) expected.push_back(row);
    std::stable_sort(expected.begin(), expected.end(),
                     [](const RangeRow& a, const RangeRow& b) { return a.start_ns < b.start_ns; });
    auto got = r.ranges(track, t0, t1);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].start_ns == expected[i].start_ns);
  }
  // Progress reports the total and ends at it.
  std::uint64_t last_done = 0, last_total = 0;
  auto all = r.ranges(track, [&](std::uint64_t done, std::uint64_t total) {
    last_done = done;
    last_total = total;
  });
  CHECK(all.size() == rows.size());
  CHECK(last_done == rows.size());
  CHECK(last_total == rows.size());
}

TEST_CASE("Transaction rolls back unless committed", "[store]") {
  TempDir dir;
  Db db(dir / "t.sqlite", OpenMode::create);
  apply_schema(db);
  SECTION("not committed: rolled back") {
    {
      Transaction tx(db);
      db.prepare("INSERT INTO string(id, text) VALUES (?, ?)").bind(1, 1).bind(2, "gone").run();
      CHECK(db.query_int64("SELECT count(*) FROM string") == 1);  // visible inside the transaction
    }
    CHECK(db.query_int64("SELECT count(*) FROM string") == 0);
  }
  SECTION("an exception unwinds and rolls back") {
    auto insert_then_throw = [&] {
      Transaction tx(db);
      db.prepare("INSERT INTO string(id, text) VALUES (?, ?)").bind(1, 1).bind(2, "x").run();
      db.prepare("INSERT INTO string(id, text) VALUES (?, ?)").bind(1, 2).bind(2, "x").run();  // UNIQUE(text)
      tx.commit();
    };
    REQUIRE_THROWS_AS(insert_then_throw(), StoreError);
    CHECK(db.query_int64("SELECT count(*) FROM string") == 0);
  }
  SECTION("committed: kept") {
    {
      Transaction tx(db);
      db.prepare("INSERT INTO string(id, text) VALUES (?, ?)").bind(1, 1).bind(2, "kept").run();
      tx.commit();
    }
    CHECK(db.query_int64("SELECT count(*) FROM string") == 1);
  }
}

TEST_CASE("SQLite errors name the file, the statement and the source line", "[store]") {
  TempDir dir;
  Db db(dir / "e.sqlite", OpenMode::create);
  auto msg = wb::test::error_message<StoreError>([&] { db.prepare("SELECT nope FROM nowhere"); });
  CAPTURE(msg);
  CHECK_THAT(msg, Catch::Contains("e.sqlite"));
  CHECK_THAT(msg, Catch::Contains("no such table: nowhere"));
  CHECK_THAT(msg, Catch::Contains("SELECT nope FROM nowhere"));
  CHECK_THAT(msg, Catch::Contains("store/db.cpp:"));
  REQUIRE_THROWS_AS(WB_SQLITE_CHECK(db.handle(), 1), StoreError);
}

TEST_CASE("row helpers: category names and shapes", "[store]") {
  for (int c = 0; c < 8; ++c) {
    auto cat = static_cast<Category>(c);
    CHECK(category_from_name(category_name(cat)) == cat);
  }
  CHECK(category_name(Category::h2d) == "h2d");
  REQUIRE_THROWS_AS(category_from_name("fwd"), std::invalid_argument);
  CHECK(shape_from_json(" [8, 3,32 ,32] ") == std::vector<std::int64_t>{8, 3, 32, 32});
  CHECK(shape_from_json("[]").empty());
  CHECK(shape_to_json({8, 3, 32, 32}) == "[8,3,32,32]");
  CHECK(shape_to_json({}) == "[]");
  for (const char* bad : {"", "[", "[1,", "[1 2]", "[1.5]", "[a]", "8,3", "[1]x"}) {
    CAPTURE(bad);
    REQUIRE_THROWS_AS(shape_from_json(bad), std::invalid_argument);
  }
}
