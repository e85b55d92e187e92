// Recorder round trips through the store: nested ranges from several threads, explicit spans, passthrough
// rows, periodic flushing, run-time switch-off, and counted (never hidden) drops.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using profiler::Category;
using wb::test::TempDir;

namespace {

store::WriterOptions writer_options(const fs::path& file) {
  store::WriterOptions o;
  o.path = file;
  o.handle_signals = false;
  return o;
}

// What a scripted thread expects to find on its track, in start order.
struct Expected {
  std::string name;
  int depth;
  int step;
  Category category;
};

std::uint32_t track_named(store::Reader& reader, const std::string& name) {
  for (const auto& t : reader.tracks())
    if (reader.string_at(t.name) == name) return t.id;
  FAIL("no track named " << name);
  return 0;
}

std::vector<store::RangeRow> sorted_ranges(store::Reader& reader, std::uint32_t track) {
  auto rows = reader.ranges(track);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return std::tie(a.start_ns, a.depth) < std::tie(b.start_ns, b.depth); });
  return rows;
}

}  // namespace

TEST_CASE("record struct is pinned at 32 bytes", "[profiler]") {
  STATIC_REQUIRE(sizeof(profiler::detail::Record) == 32);
}

TEST_CASE("nested ranges from several threads round-trip through Writer and Reader", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  const int kThreads = 4;
  const int kSteps = 25;
  std::vector<std::vector<Expected>> expected(kThreads);
  {
    store::Writer writer(writer_options(file));
    profiler::RecorderOptions opts;
    opts.chunk_records = 64;  // small chunks: many hand-offs during the run
    opts.initial_chunks = 64; // room for every event, so no drop depends on scheduling
    profiler::Recorder rec(writer, opts);
    const profiler::NameId step_id = rec.intern("step");
    const profiler::NameId fwd = rec.intern("layer1.0.conv1");
    const profiler::NameId bwd = rec.intern("layer1.0.conv1.backward");
    const profiler::NameId inner = rec.intern("relu");
    const profiler::NameId opt = rec.intern("sgd");

    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        profiler::set_thread_name("worker-" + std::to_string(t));
        auto& exp = expected[static_cast<std::size_t>(t)];
        for (int s = 0; s < kSteps; ++s) {
          // Every thread stamps its own step explicitly through the global step as well.
          profiler::Range step_range(step_id, Category::step);
          exp.push_back({"step", 0, profiler::current_step(), Category::step});
          for (int k = 0; k < 3 + t; ++k) {
            profiler::Range f(fwd, Category::forward);
            exp.push_back({"layer1.0.conv1", 1, profiler::current_step(), Category::forward});
            {
              profiler::Range r(inner, Category::forward);
              exp.push_back({"relu", 2, profiler::current_step(), Category::forward});
            }
          }
          {
            profiler::Range b(bwd, Category::backward);
            exp.push_back({"layer1.0.conv1.backward", 1, profiler::current_step(), Category::backward});
          }
          profiler::Range o(opt, Category::optimizer);
          exp.push_back({"sgd", 1, profiler::current_step(), Category::optimizer});
        }
      });
    }
    for (auto& th : threads) th.join();
    rec.stop();
    CHECK(rec.dropped() == 0);
    CHECK(writer.finish());
  }

  store::Reader reader(file);
  CHECK(reader.ranks().at(0).dropped_events == 0);
  for (int t = 0; t < kThreads; ++t) {
    CAPTURE(t);
    auto rows = sorted_ranges(reader, track_named(reader, "worker-" + std::to_string(t)));
    const auto& exp = expected[static_cast<std::size_t>(t)];
    REQUIRE(rows.size() == exp.size());
    std::vector<const store::RangeRow*> open;  // the stack of enclosing ranges
    for (std::size_t i = 0; i < rows.size(); ++i) {
      CAPTURE(i);
      CHECK(reader.string_at(rows[i].name) == exp[i].name);
      CHECK(rows[i].depth == exp[i].depth);
      CHECK(rows[i].step == exp[i].step);
      CHECK(rows[i].category == static_cast<std::uint8_t>(exp[i].category));
      CHECK(rows[i].start_ns <= rows[i].end_ns);
      // Nesting is exact in time: a range lies inside the one it is nested in.
      while (open.size() > static_cast<std::size_t>(rows[i].depth)) open.pop_back();
      REQUIRE(open.size() == static_cast<std::size_t>(rows[i].depth));
      if (!open.empty()) {
        CHECK(rows[i].start_ns >= open.back()->start_ns);
        CHECK(rows[i].end_ns <= open.back()->end_ns);
      }
      if (i > 0 && rows[i].depth == 0) CHECK(rows[i].start_ns >= rows[i - 1].end_ns);
      open.push_back(&rows[i]);
    }
  }
}

TEST_CASE("explicit spans, steps and passthrough rows keep their times, shifted onto rank 0's clock", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  const std::int64_t offset = 1'234;
  {
    store::Writer writer(writer_options(file));
    profiler::RecorderOptions opts;
    opts.clock = profiler::ClockMap(0, offset, 0, offset);
    profiler::Recorder rec(writer, opts);
    profiler::NameId wait = rec.intern("data wait");
    profiler::set_thread_name("main");
    profiler::set_step(7);
    profiler::record_range(wait, Category::data, 1'000'000, 1'500'000);
    profiler::record_range(wait, Category::data, 2'000'000, 2'250'000, 8);
    profiler::set_step(-1);
    rec.add(store::AllreduceRow{0, 7, 1, 85, 159, 4096, 10'000, 11'000, 15'000});
    rec.add(store::StepRow{0, 7, 900'000, 3'000'000, 500'000, 0, 2.5, 0.1, 32});
    rec.stop();
    CHECK(writer.finish());
  }
  store::Reader reader(file);
  auto rows = sorted_ranges(reader, track_named(reader, "main"));
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].start_ns == 1'000'000 + offset);
  CHECK(rows[0].end_ns == 1'500'000 + offset);
  CHECK(rows[0].step == 7);
  CHECK(rows[0].depth == 0);
  CHECK(rows[0].category == static_cast<std::uint8_t>(Category::data));
  CHECK(rows[1].start_ns == 2'000'000 + offset);
  CHECK(rows[1].step == 8);
  auto ar = reader.allreduces();
  REQUIRE(ar.size() == 1);
  CHECK(ar[0] == store::AllreduceRow{0, 7, 1, 85, 159, 4096, 10'000 + offset, 11'000 + offset, 15'000 + offset});
  auto steps = reader.steps();
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].start_ns == 900'000 + offset);
  CHECK(steps[0].end_ns == 3'000'000 + offset);
  CHECK(steps[0].data_wait_ns == 500'000);
}

TEST_CASE("records reach the file within the flush interval without an explicit flush", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  store::Writer writer(writer_options(file));
  profiler::Recorder rec(writer);  // default: 50 ms recorder flush, 100 ms writer commits
  profiler::NameId id = rec.intern("op");
  profiler::set_thread_name("main");
  for (int i = 0; i < 100; ++i) profiler::Range r(id, Category::forward);
  // docs/ARCHITECTURE.md: a killed process loses at most 200 ms. Poll the file from a second connection.
  std::int64_t seen = 0;
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(2)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    store::Reader reader(file);
    seen = reader.row_counts()["range"];
    if (seen == 100) break;
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(waited);
  CHECK(seen == 100);
  // Nominally 50 ms (recorder) + 100 ms (writer commit); the bound leaves room for a saturated shared
  // machine while still failing if rows only arrived at stop().
  CHECK(waited <= 1000);
  rec.stop();
}

TEST_CASE("chunks are recycled: a small pool carries a long run without drops", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  const int kEvents = 5000;
  {
    store::Writer writer(writer_options(file));
    profiler::RecorderOptions opts;
    opts.chunk_records = 16;
    opts.initial_chunks = 4;
    opts.max_chunks = 4;  // 64 records of storage for 5000 events
    profiler::Recorder rec(writer, opts);
    profiler::NameId id = rec.intern("op");
    profiler::set_thread_name("main");
    for (int i = 0; i < kEvents; ++i) {
      profiler::record_range(id, Category::forward, i * 10, i * 10 + 5, i);
      if (i % 40 == 39) rec.flush();  // hands the full chunks back to the pool before it runs dry
    }
    rec.stop();
    CHECK(rec.dropped() == 0);
    writer.finish();
  }
  store::Reader reader(file);
  auto rows = sorted_ranges(reader, track_named(reader, "main"));
  REQUIRE(rows.size() == static_cast<std::size_t>(kEvents));
  for (int i = 0; i < kEvents; ++i) {
    CAPTURE(i);
    CHECK(rows[static_cast<std::size_t>(i)].start_ns == i * 10);
    CHECK(rows[static_cast<std::size_t>(i)].end_ns == i * 10 + 5);
    CHECK(rows[static_cast<std::size_t>(i)].step == i);
  }
}

TEST_CASE("a tiny pool drops events and counts every one of them", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  const int kEvents = 1000;
  {
    store::Writer writer(writer_options(file));
    profiler::RecorderOptions opts;
    opts.chunk_records = 16;
    opts.initial_chunks = 2;
    opts.max_chunks = 2;
    opts.wake_on_full_chunk = false;           // the flusher sleeps through the burst...
    opts.flush_interval = std::chrono::seconds(60);  // ...so exactly two chunks' worth survive
    profiler::Recorder rec(writer, opts);
    profiler::NameId id = rec.intern("op");
    profiler::CounterTrack q = rec.add_counter_track("batch queue");
    profiler::set_thread_name("main");
    for (int i = 0; i < kEvents / 2; ++i) {
      profiler::Range r(id, Category::forward);
      profiler::counter(q, i);
    }
    rec.stop();
    CHECK(rec.dropped() == static_cast<std::uint64_t>(kEvents - 32));
    CHECK(writer.dropped() == static_cast<std::uint64_t>(kEvents - 32));
    writer.finish();
  }
  store::Reader reader(file);
  auto counts = reader.row_counts();
  CHECK(counts["range"] + counts["counter"] == 32);
  CHECK(reader.ranks().at(0).dropped_events == kEvents - 32);
  CHECK(reader.meta()["dropped_events"] == std::to_string(kEvents - 32));
}

TEST_CASE("--no-profile: a disabled recorder records no ranges or counters", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  {
    store::Writer writer(writer_options(file));
    profiler::RecorderOptions opts;
    opts.enabled = false;
    profiler::Recorder rec(writer, opts);
    profiler::NameId id = rec.intern("op");
    profiler::CounterTrack q = rec.add_counter_track("batch queue");
    for (int i = 0; i < 100; ++i) {
      profiler::Range r(id, Category::forward);
      profiler::counter(q, 1.0);
    }
    rec.set_enabled(true);
    { profiler::Range r(id, Category::backward); }
    rec.set_enabled(false);
    { profiler::Range r(id, Category::forward); }
    rec.stop();
    writer.finish();
  }
  store::Reader reader(file);
  auto counts = reader.row_counts();
  CHECK(counts["range"] == 1);
  CHECK(counts["counter"] == 0);
}

TEST_CASE("only one recorder runs at a time; options are checked", "[profiler]") {
  TempDir dir;
  store::Writer writer(writer_options(dir.path() / "a.sqlite"));
  {
    profiler::Recorder rec(writer);
    CHECK(profiler::Recorder::current() == &rec);
    REQUIRE_THROWS_AS(profiler::Recorder(writer), profiler::ProfilerError);
  }
  CHECK(profiler::Recorder::current() == nullptr);
  profiler::RecorderOptions bad;
  bad.chunk_records = 0;
  REQUIRE_THROWS_AS(profiler::Recorder(writer, bad), profiler::ProfilerError);
  // Ranges with no recorder are harmless no-ops.
  profiler::Range r(0, Category::forward);
  CHECK(profiler::intern("x") == 0);
}

TEST_CASE("a thread that ends before the recorder stops keeps its events", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  {
    store::Writer writer(writer_options(file));
    profiler::Recorder rec(writer);
    profiler::NameId id = rec.intern("decode");
    for (int w = 0; w < 3; ++w) {
      std::thread([&, w] {
        profiler::set_thread_name("data-worker-" + std::to_string(w));
        for (int i = 0; i < 10 + w; ++i) profiler::Range r(id, Category::data);
      }).join();
    }
    rec.flush();
    store::Reader mid(file);
    CHECK(mid.row_counts()["range"] == 33);  // flush() made everything durable
    rec.stop();
    writer.finish();
  }
  store::Reader reader(file);
  for (int w = 0; w < 3; ++w) CHECK(reader.ranges(track_named(reader, "data-worker-" + std::to_string(w))).size() == 10u + w);
}

TEST_CASE("the recorder's cost per event is measured on a private chunk that never reaches the file", "[profiler]") {
  TempDir dir;
  fs::path file = dir.path() / "run.sqlite";
  double ns = 0.0;
  {
    store::Writer writer(writer_options(file));
    profiler::Recorder rec(writer, profiler::RecorderOptions{});
    profiler::NameId id = rec.intern("op");
    { profiler::Range r(id, Category::forward); }  // this thread is attached and recording
    ns = profiler::measure_ns_per_event(20000, 3);
    { profiler::Range r(id, Category::backward); }
    rec.stop();
    writer.finish();
  }
  // Two clock reads and a 32-byte store: more than a nanosecond, far less than a microsecond, whatever
  // the machine (a loop the compiler had removed would give ~0).
  CAPTURE(ns);
  CHECK(ns > 1.0);
  CHECK(ns < 2000.0);
  store::Reader reader(file);
  CHECK(reader.row_counts()["range"] == 2);  // the two real ranges, none of the 60000 measured ones
}
