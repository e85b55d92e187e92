// Chrome-trace export: the JSON parses (Python's json), holds every range, counter, kernel and bucket,
// links kernels to their launching ranges with flow events, and is written at >= 1M events/s.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "profiler/analysis/chrome_export.hpp"
#include "profiler/analysis/run_data.hpp"
#include "store/merge.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using analysis::concat;

namespace {

// A scratch directory with an empty run/ folder for rank files.
struct RunDir {
  wb::test::TempDir tmp;
  fs::path dir = tmp.path();
  RunDir() { fs::create_directories(dir / "run"); }
};

// Runs `script` with python -c and `arg`; its stdout.
std::string run_python(const std::string& script, const fs::path& arg) {
  const wb::test::ProcessResult r =
      wb::test::run_python("-c " + wb::test::shell_quote(script) + " " + wb::test::shell_quote(arg.string()));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

}  // namespace

TEST_CASE("chrome export: one process per rank, one thread per track, every event present", "[analysis]") {
  RunDir d;
  const int kRanges = 300;
  for (int rank = 0; rank < 2; ++rank) {
    store::WriterOptions o;
    o.path = d.dir / "run" / concat("rank-", std::to_string(rank), ".sqlite");
    o.rank = rank;
    o.handle_signals = false;
    store::Writer w(o);
    w.set_meta("world_size", "2");
    std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
    std::uint32_t stream = w.add_track(store::TrackKind::stream, "cuda:0 stream 7");
    std::uint32_t queue = w.add_track(store::TrackKind::queue, "batch queue");
    std::uint32_t op = w.intern("conv \"3x3\"\\");  // a name that needs escaping
    std::uint32_t kern = w.intern("sm90_xmma_gemm");
    for (int i = 0; i < kRanges; ++i) {
      std::int64_t t = 1'000'000'000 + i * 1000 + rank * 7;
      std::uint64_t corr = i % 3 == 0 ? static_cast<std::uint64_t>(i + 1) : 0;
      w.add(store::RangeRow{main, op, t, t + 501 + i, static_cast<std::uint8_t>(i % 8), 0, i / 10, corr});
      if (corr != 0) {
        store::KernelRow k;
        k.track = stream;
        k.name = kern;
        k.start_ns = t + 300;
        k.end_ns = t + 700;
        k.corr_id = corr;
        k.grid[0] = 128;
        k.block[0] = 256;
        w.add(k);
      }
      w.add(store::CounterRow{queue, t, static_cast<double>(i % 5)});
    }
    w.add(store::AllreduceRow{rank, 0, 0, 0, 160, 1 << 20, 1'000'100'000, 1'000'200'000, 1'000'300'000});
    w.finish();
  }
  auto merged = store::merge_run(d.dir / "run");
  store::Reader reader(merged.out);
  fs::path json = d.dir / "trace.json";
  auto stats = analysis::export_chrome(reader, json);
  CHECK(stats.ranges == 2 * kRanges);
  CHECK(stats.kernels == 2 * 100);
  CHECK(stats.counters == 2 * kRanges);
  CHECK(stats.flows == 2 * 100);
  CHECK(stats.allreduces == 2);
  CHECK(stats.origin_ns == 1'000'000'000);

  // Python lists the host ranges it parsed as "pid tid name ts_ns dur_ns", plus totals per phase.
  std::string out = run_python(
      "import json,sys,collections\n"
      "d=json.load(open(sys.argv[1]))\n"
      "ev=d[\"traceEvents\"]\n"
      "c=collections.Counter(e[\"ph\"] for e in ev)\n"
      "print(\"phases\", c[\"X\"], c[\"C\"], c[\"s\"], c[\"f\"], c[\"M\"], len(ev))\n"
      "procs=sorted(e[\"pid\"] for e in ev if e[\"ph\"]==\"M\" and e[\"name\"]==\"process_name\")\n"
      "print(\"procs\", *procs)\n"
      "s={e[\"id\"]:e for e in ev if e[\"ph\"]==\"s\"}\n"
      "f={e[\"id\"]:e for e in ev if e[\"ph\"]==\"f\"}\n"
      "print(\"flows_matched\", sum(1 for i in s if i in f and s[i][\"ts\"]<=f[i][\"ts\"]))\n"
      "for e in ev:\n"
      "  if e[\"ph\"]==\"X\" and e[\"cat\"] not in (\"kernel\",\"memcpy\",\"memset\",\"allreduce\"):\n"
      "    print(\"R\", e[\"pid\"], e[\"tid\"], json.dumps(e[\"name\"]), round(e[\"ts\"]*1000), round(e[\"dur\"]*1000), e[\"args\"][\"step\"])\n",
      json);
  std::istringstream in(out);
  std::string line;
  std::set<std::string> seen;
  while (std::getline(in, line)) {
    if (line.rfind("phases ", 0) == 0) {
      long x = 0, c = 0, s = 0, f = 0, m = 0, total = 0;
      std::istringstream(line.substr(7)) >> x >> c >> s >> f >> m >> total;
      CHECK(x == 2 * kRanges + 2 * 100 + 2);
      CHECK(c == 2 * kRanges);
      CHECK(s == 200);
      CHECK(f == 200);
      CHECK(total == stats.events);
    } else if (line.rfind("procs ", 0) == 0) {
      CHECK(line == "procs 0 1");
    } else if (line.rfind("flows_matched ", 0) == 0) {
      CHECK(line == "flows_matched 200");
    } else if (line.rfind("R ", 0) == 0) {
      seen.insert(line.substr(2));
    }
  }
  // Every range of the file, with its exact nanoseconds, on its rank's process and its own thread.
  std::set<std::string> expected;
  for (const auto& t : reader.tracks()) {
    if (t.kind != store::TrackKind::thread) continue;
    for (const auto& r : reader.ranges(t.id)) {
      expected.insert(concat(std::to_string(t.rank), " ", std::to_string(t.id), " \"conv \\\"3x3\\\"\\\\\" ",
                             std::to_string(r.start_ns - stats.origin_ns), " ", std::to_string(r.end_ns - r.start_ns), " ",
                             std::to_string(r.step)));
    }
  }
  REQUIRE(expected.size() == 2u * kRanges);
  CHECK(seen == expected);
}

TEST_CASE("chrome export reports an unwritable output path", "[analysis]") {
  RunDir d;
  {
    store::WriterOptions o;
    o.path = d.dir / "run.sqlite";
    o.handle_signals = false;
    store::Writer w(o);
    w.finish();
  }
  store::Reader reader(d.dir / "run.sqlite");
  REQUIRE_THROWS_AS(analysis::export_chrome(reader, d.dir / "no-such-dir" / "x.json"), std::runtime_error);
}
