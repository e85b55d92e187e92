// Import speed of `wb import torch-trace`: events per second on a Kineto-format trace of EVENTS events
// (ResNet-style steps: module ranges, nested cpu_ops with External ids and sequence numbers, runtime
// calls, kernels on a stream), for the whole import (read, parse, build ranges and layers, write and
// index the run file) and for the parse alone. The peer is nlohmann::json's DOM parse of the same
// file, run alternately with ours. Goal: >= 1M events/s for the whole import.
//
// usage: trace_import [EVENTS (default 1000000)] [ROUNDS (default 3)] [DIR (default /tmp)]
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ingest/torch_trace.hpp"
#include "ingest/trace_json.hpp"

namespace ingest = wb::ingest;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// About `events` events: per layer a python_function range around three nested cpu_ops, the innermost
// launching one kernel through cudaLaunchKernel; a ProfilerStep every 1000 layers.
std::string make_trace(long long events) {
  std::string s;
  s.reserve(static_cast<std::size_t>(events) * 230);
  s += R"({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}], )"
       R"("distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": [)";
  char buf[512];
  double t = 1000.0;
  long long n = 0, ext = 1, corr = 1, seq = 1;
  const char* ops[3] = {"aten::conv2d", "aten::convolution", "aten::cudnn_convolution"};
  int step = 0;
  bool first = true;
  auto add = [&](const char* text) {
    if (!first) s += ",\n";
    first = false;
    s += text;
    ++n;
  };
  while (n < events) {
    double step_start = t;
    for (int layer = 0; layer < 1000 && n < events; ++layer) {
      std::snprintf(buf, sizeof buf,
                    R"({"ph": "X", "cat": "python_function", "name": "nn.Module: Conv2d_%d", "pid": 7, "tid": 7, "ts": %.3f, "dur": %.3f, "args": {"Python id": %d}})",
                    layer, t, 40.0, layer);
      add(buf);
      for (int d = 0; d < 3; ++d) {
        std::snprintf(buf, sizeof buf,
                      R"({"ph": "X", "cat": "cpu_op", "name": "%s", "pid": 7, "tid": 7, "ts": %.3f, "dur": %.3f, "args": {"External id": %lld, "Sequence number": %lld, "Fwd thread id": 0, "Input Dims": [[32, 64, 56, 56], [64, 64, 3, 3]]}})",
                      ops[d], t + 1.0 + d, 38.0 - 2.0 * d, ext + d, seq);
        add(buf);
      }
      std::snprintf(buf, sizeof buf,
                    R"({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": %.3f, "dur": 4.125, "args": {"cbid": 211, "correlation": %lld, "External id": %lld}})",
                    t + 10.0, corr, ext + 2);
      add(buf);
      std::snprintf(buf, sizeof buf,
                    R"({"ph": "X", "cat": "kernel", "name": "sm90_xmma_fprop_implicit_gemm_f32f32", "pid": 0, "tid": 7, "ts": %.3f, "dur": 30.5, "args": {"device": 0, "stream": 7, "correlation": %lld, "External id": %lld, "grid": [64, 2, 1], "block": [256, 1, 1]}})",
                    t + 15.0, corr, ext + 2);
      add(buf);
      ext += 3;
      ++corr;
      ++seq;
      t += 50.0;
    }
    std::snprintf(buf, sizeof buf,
                  R"({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d", "pid": 7, "tid": 7, "ts": %.3f, "dur": %.3f, "args": {"External id": %lld}})",
                  step++, step_start - 0.5, t - step_start + 1.0, ext++);
    add(buf);
    t += 10.0;
  }
  s += "]}\n";
  return s;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of the process (every thread): on a shared machine, what the work costs.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  long long events = argc > 1 ? std::atoll(argv[1]) : 1'000'000LL;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  fs::path dir = argc > 3 ? argv[3] : fs::temp_directory_path();
  if (events <= 0 || rounds <= 0) {
    std::fprintf(stderr, "trace_import: EVENTS and ROUNDS must be positive\n");
    return 2;
  }
  ingest::tune_allocator_for_import();  // as `wb import` does
  const std::string tag = std::to_string(::getpid());
  const fs::path trace = dir / ("wb-trace-import-" + tag + ".json");
  const fs::path out = dir / ("wb-trace-import-" + tag + ".sqlite");
  {
    std::string text = make_trace(events);
    std::ofstream(trace, std::ios::binary) << text;
    std::printf("trace: %lld events, %.1f MB (%s)\n", events, static_cast<double>(text.size()) / 1e6, trace.c_str());
  }
  std::vector<double> ours_import, ours_parse, peer_parse, import_cpu, parse_cpu, peer_cpu;
  long long parsed = 0;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    double c0 = cpu_seconds();
    ingest::ImportOptions o;
    o.overwrite = true;
    ingest::import_torch_traces({trace}, out, o);
    ours_import.push_back(seconds_since(t0));
    import_cpu.push_back(cpu_seconds() - c0);

    t0 = Clock::now();
    c0 = cpu_seconds();
    auto p = ingest::read_trace(trace);
    ours_parse.push_back(seconds_since(t0));
    parse_cpu.push_back(cpu_seconds() - c0);
    parsed = static_cast<long long>(p.events.size());

    t0 = Clock::now();
    c0 = cpu_seconds();
    std::ifstream in(trace, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = nlohmann::json::parse(ss.str());
    peer_parse.push_back(seconds_since(t0));
    peer_cpu.push_back(cpu_seconds() - c0);
    if (j["traceEvents"].size() != static_cast<std::size_t>(parsed)) {
      std::fprintf(stderr, "trace_import: nlohmann read %zu events, ours %lld\n", j["traceEvents"].size(), parsed);
      return 1;
    }
    std::printf("round %d: import %.3f s (cpu %.3f s), our parse %.3f s (cpu %.3f s), nlohmann::json parse %.3f s (cpu %.3f s)\n",
                r + 1, ours_import.back(), import_cpu.back(), ours_parse.back(), parse_cpu.back(), peer_parse.back(),
                peer_cpu.back());
  }
  fs::remove(trace);
  fs::remove(out);
  auto best = [](std::vector<double> v) { return *std::min_element(v.begin(), v.end()); };
  double imp = best(ours_import), parse = best(ours_parse), peer = best(peer_parse);
  std::printf("CPU time, best: import %.3f s, parse %.3f s, nlohmann::json %.3f s (wall time counts waits for a shared CPU)\n",
              best(import_cpu), best(parse_cpu), best(peer_cpu));
  const double ev = static_cast<double>(events);
  std::printf("wall: whole import %.2fM events/s, parse alone %.2fM events/s, nlohmann::json DOM parse %.2fM events/s\n",
              ev / imp / 1e6, ev / parse / 1e6, ev / peer / 1e6);
  std::printf("CPU: whole import %.2fM events/s, parse alone %.2fM events/s, nlohmann::json DOM parse %.2fM events/s\n",
              ev / best(import_cpu) / 1e6, ev / best(parse_cpu) / 1e6, ev / best(peer_cpu) / 1e6);
  std::printf("whole import vs the 1M events/s goal: %.2fx wall, %.2fx CPU; our parse vs nlohmann::json's: %.2fx\n",
              ev / imp / 1e6, ev / best(import_cpu) / 1e6, best(peer_cpu) / best(parse_cpu));
  return 0;
}
