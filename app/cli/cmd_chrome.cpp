// wb export chrome RUN OUT.json: a run as Chrome-trace / Perfetto JSON (open in ui.perfetto.dev or
// chrome://tracing). Reached through `wb export`, which hands the "chrome" format to export_chrome.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli/cli.hpp"
#include "profiler/analysis/chrome_export.hpp"
#include "store/reader.hpp"

namespace wb::cli {

// argv: "export", "chrome", RUN, OUT.json, ...
int export_chrome(int argc, char** argv) {
  std::string name = "export chrome";
  std::vector<char*> rest{name.data()};
  for (int i = 2; i < argc; ++i) rest.push_back(argv[i]);
  Args args(static_cast<int>(rest.size()), rest.data(),
            "usage: wb export chrome RUN OUT.json\n"
            "Writes RUN as Chrome-trace JSON: one process per rank, one thread per track, queue depths as\n"
            "counters, allreduce buckets on their own lane, flow arrows from host ops to their kernels, and for\n"
            "pipeline runs each stage's micro-batches and messages with an arrow from every send to its receive.",
            {});
  const auto& pos = args.positionals(2, 2);
  store::Reader reader(pos[0]);
  auto t0 = std::chrono::steady_clock::now();
  analysis::ChromeExportStats stats = analysis::export_chrome(reader, pos[1]);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %lld events (%lld ranges, %lld kernels, %lld counter samples, %lld flows, %lld allreduce spans%s) in %.3f s\n",
              pos[1].c_str(), static_cast<long long>(stats.events), static_cast<long long>(stats.ranges),
              static_cast<long long>(stats.kernels), static_cast<long long>(stats.counters),
              static_cast<long long>(stats.flows), static_cast<long long>(stats.allreduces),
              stats.p2p ? (", " + std::to_string(stats.p2p) + " pipeline spans").c_str() : "", s);
  return 0;
}

}  // namespace wb::cli
