// Speed of `wb export` (Chrome trace JSON): events written per second of CPU time, on a run file of
// RANGES host ranges on one thread (four op names, nested categories, 1000 ranges per step). The peer is
// the straightforward way to write the same file: read the same rows, build the events as
// nlohmann::json objects and dump them, run alternately with ours. Goal: >= 1M events/s.
//
// usage: chrome_export [RANGES (default 400000)] [ROUNDS (default 3)] [DIR (default /tmp)]
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "profiler/analysis/chrome_export.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"

namespace fs = std::filesystem;
namespace store = wb::store;

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void make_run(const fs::path& path, int ranges) {
  store::WriterOptions o;
  o.path = path;
  o.handle_signals = false;
  store::Writer w(o);
  const std::uint32_t main = w.add_track(store::TrackKind::thread, "main");
  const std::uint32_t names[4] = {w.intern("layer1.0.conv1"), w.intern("layer1.0.bn1"), w.intern("relu"),
                                  w.intern("sgd")};
  std::vector<store::RangeRow> batch;
  for (int i = 0; i < ranges; ++i) {
    batch.push_back(store::RangeRow{main, names[i % 4], i * 1000LL, i * 1000LL + 777,
                                    static_cast<std::uint8_t>(i % 3), 0, i / 1000, 0});
    if (batch.size() == 50'000) {
      w.add(std::span<const store::RangeRow>(batch));
      w.flush();
      batch.clear();
    }
  }
  w.add(std::span<const store::RangeRow>(batch));
  w.finish();
}

// The peer: every range as a complete ("X") event object, the whole document dumped at once.
long long export_with_nlohmann(store::Reader& reader, const fs::path& out) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& t : reader.tracks()) {
    for (const auto& r : reader.ranges(t.id)) {
      events.push_back({{"name", reader.string_at(r.name)},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", t.id},
                        {"ts", static_cast<double>(r.start_ns) / 1000.0},
                        {"dur", static_cast<double>(r.end_ns - r.start_ns) / 1000.0},
                        {"args", {{"step", r.step}, {"depth", r.depth}}}});
    }
  }
  std::ofstream f(out, std::ios::binary);
  f << nlohmann::json{{"traceEvents", events}}.dump();
  return static_cast<long long>(events.size());
}

}  // namespace

int main(int argc, char** argv) {
  const int ranges = argc > 1 ? std::atoi(argv[1]) : 400'000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const fs::path dir = argc > 3 ? fs::path(argv[3]) : fs::path("/tmp");
  if (ranges <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: chrome_export [RANGES > 0] [ROUNDS > 0] [DIR]\n");
    return 2;
  }
  const std::string tag = std::to_string(getpid());
  const fs::path run = dir / ("wb-bench-chrome-" + tag + ".sqlite");
  const fs::path ours_out = dir / ("wb-bench-chrome-" + tag + ".json");
  const fs::path peer_out = dir / ("wb-bench-chrome-peer-" + tag + ".json");
  make_run(run, ranges);
  store::Reader reader(run);

  double best_ours = 1e30, best_peer = 1e30;
  long long events = 0, peer_events = 0;
  for (int r = 0; r < rounds; ++r) {
    double c0 = cpu_seconds();
    const auto stats = wb::analysis::export_chrome(reader, ours_out);
    const double ours = cpu_seconds() - c0;
    events = stats.events;
    if (stats.ranges != ranges) {
      std::fprintf(stderr, "chrome_export: exported %lld ranges, wrote %d\n", static_cast<long long>(stats.ranges), ranges);
      return 1;
    }
    c0 = cpu_seconds();
    peer_events = export_with_nlohmann(reader, peer_out);
    const double peer = cpu_seconds() - c0;
    best_ours = std::min(best_ours, ours);
    best_peer = std::min(best_peer, peer);
    std::printf("round %d: wb export %.3f s CPU (%lld events), nlohmann::json %.3f s CPU (%lld events)\n", r + 1,
                ours, events, peer, peer_events);
  }
  fs::remove(run);
  fs::remove(ours_out);
  fs::remove(peer_out);
  const double rate = static_cast<double>(events) / best_ours;
  std::printf("best CPU time: wb export %.2fM events/s, nlohmann::json %.2fM events/s\n", rate / 1e6,
              static_cast<double>(peer_events) / best_peer / 1e6);
  std::printf("wb export vs the 1M events/s goal: %.2fx; vs nlohmann::json: %.2fx faster\n", rate / 1e6,
              best_peer / best_ours);
  return 0;
}
