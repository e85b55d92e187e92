// Store throughput: range rows per second into one run file from 2 producer threads, end to end (commits,
// then the close: indexes and the WAL folded back), the bytes each range costs in the file, and the time
// to load one track's ranges back into memory through Reader. Goals: >= 4M rows/s end to end, <= 24 bytes
// per range, < 2 s to load 5M ranges. It also prints where a range's bytes go (dbstat): range_data's pages,
// their row payload and unused part, and the timeline's summary tables.
//
// usage: store_ingest [TOTAL_ROWS (default 10000000)] [DIR (default /tmp)] [--corr]
//   --corr  every range has a correlation id, as on a GPU run (CUPTI links each launching range to its
//           kernels); without it, ranges have none, as on a CPU run
#include <unistd.h>

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"

using namespace wb::store;
using Clock = std::chrono::steady_clock;

namespace {
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Where a range's bytes go, from SQLite's dbstat: range_data's pages, the part of them left unused, the
// rows' own bytes, and the timeline's summary tables.
struct ByteSplit {
  std::int64_t pages = 0, unused = 0, payload = 0, summary = 0;
};

ByteSplit byte_split(Db& db) {
  ByteSplit b;
  auto range_data = [&](const char* column) {
    return db.query_int64(std::string("SELECT sum(") + column + ") FROM dbstat WHERE name = 'range_data'");
  };
  b.pages = range_data("pgsize");
  b.unused = range_data("unused");
  b.payload = range_data("payload");
  b.summary = db.query_int64("SELECT sum(pgsize) FROM dbstat WHERE name LIKE 'summary%'");
  return b;
}

void print_byte_split(const ByteSplit& b, double rows) {
  std::printf("per range: range_data %.1f bytes of pages (%.1f of them row payload, %.0f%% of the pages unused), "
              "the timeline's summary %.1f\n",
              static_cast<double>(b.pages) / rows, static_cast<double>(b.payload) / rows,
              b.pages > 0 ? 100.0 * static_cast<double>(b.unused) / static_cast<double>(b.pages) : 0.0,
              static_cast<double>(b.summary) / rows);
}

// One track's ranges read back through Reader, timed, and the file's byte split.
struct LoadBack {
  std::size_t rows = 0;
  double wall_s = 0.0, cpu_s = 0.0;
  ByteSplit bytes;
};

LoadBack load_back(const std::filesystem::path& path, std::uint32_t track) {
  LoadBack out;
  double cpu0 = cpu_seconds();  // only this thread runs now
  auto t1 = Clock::now();
  Reader r(path);
  out.rows = r.ranges(track).size();
  out.wall_s = std::chrono::duration<double>(Clock::now() - t1).count();
  out.cpu_s = cpu_seconds() - cpu0;
  out.bytes = byte_split(r.db());
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  bool with_corr = false;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--corr") {
      with_corr = true;
    } else {
      args.emplace_back(argv[i]);
    }
  }
  long long total = !args.empty() ? std::atoll(args[0].c_str()) : 10'000'000LL;
  std::filesystem::path dir = args.size() > 1 ? std::filesystem::path(args[1]) : std::filesystem::temp_directory_path();
  if (total <= 0) {
    std::fprintf(stderr, "store_ingest: TOTAL_ROWS must be positive, got '%s'\n", args[0].c_str());
    return 2;
  }
  auto path = dir / ("wb-store-ingest-" + std::to_string(::getpid()) + ".sqlite");
  constexpr int kProducers = 2;
  const long long per_thread = total / kProducers;

  std::uint32_t first_track = 0;
  std::uint64_t dropped = 0;
  double cpu0 = cpu_seconds();
  auto t0 = Clock::now();
  Clock::time_point t_committed;
  WriterStats stats;
  {
    WriterOptions o;
    o.path = path;
    o.handle_signals = false;
    // Producers here emit as fast as they can, far above a trainer's event rate; a queue that holds
    // everything measures what the store sustains instead of how much the overflow guard drops.
    o.max_pending_rows = static_cast<std::size_t>(total) + 1;
    Writer w(o);
    std::vector<std::uint32_t> tracks;
    for (int p = 0; p < kProducers; ++p) tracks.push_back(w.add_track(TrackKind::thread, "producer-" + std::to_string(p)));
    first_track = tracks[0];
    std::vector<std::uint32_t> names;
    for (int i = 0; i < 200; ++i) names.push_back(w.intern("layer" + std::to_string(i / 20) + ".op" + std::to_string(i)));

    // Producers emit like an instrumented trainer: short nested ranges, handed over in small batches.
    std::vector<std::thread> producers;
    for (int p = 0; p < kProducers; ++p) {
      producers.emplace_back([&, p] {
        std::vector<RangeRow> batch;
        batch.reserve(256);
        std::int64_t t = 1'000'000'000;
        for (long long i = 0; i < per_thread; ++i) {
          t += 700;
          batch.push_back(RangeRow{tracks[static_cast<std::size_t>(p)], names[static_cast<std::size_t>(i % 200)], t,
                                   t + 500, static_cast<std::uint8_t>(i % 8), static_cast<std::uint8_t>(i % 3),
                                   static_cast<std::int32_t>(i / 50'000), with_corr ? static_cast<std::uint64_t>(i + 1) : 0});
          if (batch.size() == 256) {
            w.add(std::span<const RangeRow>(batch));
            batch.clear();
          }
        }
        w.add(std::span<const RangeRow>(batch));
      });
    }
    for (auto& t : producers) t.join();
    w.finish();
    dropped = w.dropped();
    stats = w.stats();
    t_committed = Clock::now();
  }
  auto t_closed = Clock::now();
  double cpu_s = cpu_seconds() - cpu0;
  double commit_s = std::chrono::duration<double>(t_committed - t0).count();
  double close_s = std::chrono::duration<double>(t_closed - t_committed).count();
  double rows = static_cast<double>(per_thread * kProducers);
  double rows_per_s = rows / commit_s;
  std::printf("ingest: %lld range rows from %d threads committed in %.2f s = %.2fM rows/s (dropped %llu)\n",
              per_thread * kProducers, kProducers, commit_s, rows_per_s / 1e6, static_cast<unsigned long long>(dropped));
  // Wall time depends on what else the machine runs; the writer thread's CPU time per row does not (much).
  double capacity = static_cast<double>(stats.rows_committed) / stats.commit_cpu_s;
  std::printf("writer thread: %llu rows in %llu commits, %.2f s CPU = %.2fM rows per CPU-second\n",
              static_cast<unsigned long long>(stats.rows_committed), static_cast<unsigned long long>(stats.commits),
              stats.commit_cpu_s, capacity / 1e6);
  const double end_to_end = rows / (commit_s + close_s);
  const double file_bytes = static_cast<double>(std::filesystem::file_size(path));
  std::printf("close: index build and WAL fold %.2f s; end to end %.2fM rows/s; process CPU %.2f s; file %.0f MB = "
              "%.1f bytes per range (%s)\n",
              close_s, end_to_end / 1e6, cpu_s, file_bytes / 1e6, file_bytes / rows,
              with_corr ? "every range with a correlation id" : "no correlation ids");

  const LoadBack load = load_back(path, first_track);
  const std::size_t loaded = load.rows;
  const double load_s = load.wall_s, load_cpu_s = load.cpu_s;
  std::printf("load: %zu ranges of one track in %.2f s (%.2f s CPU) = %.2fM rows/s\n", loaded, load_s, load_cpu_s,
              static_cast<double>(loaded) / load_s / 1e6);
  print_byte_split(load.bytes, rows);

  std::filesystem::remove(path);
  bool ok = dropped == 0 && loaded == static_cast<std::size_t>(per_thread);
  std::printf("goals: end to end %.2fM rows/s vs >= 4M = %.2fx; %.1f bytes per range vs <= 24 = %.2fx; "
              "load of %zu ranges %.2f s wall (%.2f s CPU) vs < 2 s = %.2fx (%.2fx)%s\n",
              end_to_end / 1e6, end_to_end / 4e6, file_bytes / rows, 24.0 / (file_bytes / rows), loaded, load_s,
              load_cpu_s, 2.0 / load_s, 2.0 / load_cpu_s, ok ? "" : " [rows lost]");
  return ok ? 0 : 1;
}
