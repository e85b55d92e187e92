// End-to-end cost of profiling on CPU training: the same wb-train run (synthetic data, ResNet-50) with the
// profiler on and off, alternated over several rounds in one invocation so load drifts hit both alike
// (the order flips every round). Each run's steady state is its step table without the first
// --warmup steps; the figure compares the median over the profiled runs of each run's median step time
// with the same for the unprofiled runs. Prints per-run medians, the paired per-round overheads, the
// median over all steps pooled, the load average, and last, the overhead against the 2 % goal.
//
// --memory compares the memory profile instead: profiling on in both runs, one with the memory profile
// (the default) and one with --no-memory-profile; the last line is its overhead against the 1 % goal.
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "store/db.hpp"
#include "tests/support/peers.hpp"

namespace fs = std::filesystem;
using namespace wb;

namespace {

using wb::bench::load_average;
using wb::bench::median;

constexpr double kGoalPercent = 2.0;
constexpr double kMemoryGoalPercent = 1.0;

struct Options {
  int rounds = 3;
  int steps = 30;
  int warmup = 3;
  int batch = 32;
  int image = 32;
  int threads = 1;  // one compute thread: OpenMP teams spin badly when the cores are oversubscribed
  int workers = 2;
  std::string train = WB_TRAIN;  // --train: another build's wb-train (a before/after comparison)
  bool memory = false;            // compare the memory profile on/off (profiling on in both)
};

const char* kUsage =
    "usage: profiler_overhead [--memory] [--rounds N] [--steps N] [--warmup N] [--batch N] [--image N] [--threads N]\n"
    "                         [--workers N] [--train WB_TRAIN]\n"
    "Runs wb-train with and without profiling, alternated for N rounds (default 3 rounds of 30 steps, batch 32,\n"
    "32x32, 1 compute thread, 2 data workers), and compares the median steady-state step times.\n"
    "--memory: with profiling in both, with and without the memory profile (--no-memory-profile).\n";

int parse_int(const std::string& flag, const char* text, int lo) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > 1'000'000) {
    throw std::invalid_argument(flag + ": expected an integer >= " + std::to_string(lo) + ", got '" + text + "'");
  }
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--memory") {
      o.memory = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(a + ": unknown flag or missing value\n" + kUsage);
    const char* v = argv[++i];
    if (a == "--rounds") o.rounds = parse_int(a, v, 1);
    else if (a == "--steps") o.steps = parse_int(a, v, 2);
    else if (a == "--warmup") o.warmup = parse_int(a, v, 0);
    else if (a == "--batch") o.batch = parse_int(a, v, 1);
    else if (a == "--image") o.image = parse_int(a, v, 32);
    else if (a == "--threads") o.threads = parse_int(a, v, 1);
    else if (a == "--workers") o.workers = parse_int(a, v, 1);
    else if (a == "--train") o.train = v;
    else throw std::invalid_argument(a + ": unknown flag\n" + kUsage);
  }
  if (o.warmup >= o.steps) throw std::invalid_argument("--warmup must be below --steps");
  return o;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  out += '\'';
  return out;
}

struct RunResult {
  std::vector<double> step_ms;  // steady-state steps only
  std::int64_t ranges = 0;
  std::int64_t memory_rows = 0;
  double median_ms = 0.0;
};

RunResult run_once(const Options& o, const fs::path& dir, bool profile, int round) {
  std::string file = profile ? "on-" : "off-";
  file += std::to_string(round) + ".sqlite";
  const fs::path run = dir / file;
  const fs::path log = dir / "train.log";
  std::string cmd = quote(o.train);
  for (const std::string& a :
       {std::string("--data"), std::string("synthetic"), std::string("--synthetic-samples"),
        std::to_string(std::max(256, o.steps * o.batch)), std::string("--batch-size"), std::to_string(o.batch),
        std::string("--image-size"), std::to_string(o.image), std::string("--steps"), std::to_string(o.steps),
        std::string("--threads"), std::to_string(o.threads), std::string("--data-workers"), std::to_string(o.workers),
        std::string("--run"), run.string()}) {
    cmd += ' ';
    cmd += quote(a);
  }
  if (!profile) cmd += o.memory ? " --no-memory-profile" : " --no-profile";
  cmd += " >";
  cmd += quote(log.string());
  cmd += " 2>&1";
  const int status = std::system(cmd.c_str());
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    throw std::runtime_error("wb-train failed (" + cmd + "):\n" + text);
  }
  RunResult r;
  store::Db db(run, store::OpenMode::read_only);
  auto& st = db.prepare("SELECT step, end_ns - start_ns FROM step WHERE rank = 0 ORDER BY step");
  while (st.step()) {
    if (st.column_int64(0) >= o.warmup) r.step_ms.push_back(static_cast<double>(st.column_int64(1)) / 1e6);
  }
  st.reset();
  r.ranges = db.query_int64("SELECT count(*) FROM range");
  r.memory_rows = db.query_int64("SELECT count(*) FROM memory");
  if (static_cast<int>(r.step_ms.size()) != o.steps - o.warmup) {
    throw std::runtime_error(run.string() + ": expected " + std::to_string(o.steps - o.warmup) +
                             " steady-state steps in the step table, found " + std::to_string(r.step_ms.size()));
  }
  if (o.memory ? (r.ranges == 0 || profile != (r.memory_rows > 0)) : profile != (r.ranges > 0)) {
    throw std::runtime_error(run.string() + ": " + std::to_string(r.ranges) + " ranges and " +
                             std::to_string(r.memory_rows) + " memory rows recorded with " +
                             (o.memory ? "the memory profile " : "profiling ") + (profile ? "on" : "off"));
  }
  r.median_ms = median(r.step_ms);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  try {
    const Options o = parse(argc, argv);
    dir = wb::bench::make_temp_dir("wb-profiler-overhead");
    const char* what = o.memory ? "memory profile" : "profiling";
    std::printf("%s overhead: wb-train, synthetic, ResNet-50, batch %d, %dx%d, %d steps (first %d dropped), "
                "%d thread(s), %d data workers, %d rounds%s\n",
                o.memory ? "memory profile" : "profiler", o.batch, o.image, o.image, o.steps, o.warmup, o.threads, o.workers, o.rounds,
                o.memory ? " (profiling on in both)" : "");
    std::printf("load average at start: %s (the figures are noisy when the machine is loaded)\n", load_average().c_str());

    std::vector<double> on_medians, off_medians, paired, on_all, off_all;
    for (int round = 0; round < o.rounds; ++round) {
      RunResult on, off;
      // Alternate which mode runs first, so a steady drift in load does not favour one.
      for (int k = 0; k < 2; ++k) {
        const bool profile = (k == 0) == (round % 2 == 0);
        RunResult r = run_once(o, dir, profile, round);
        std::printf("  round %d  %s %-3s  median step %9.2f ms  (%zu steps, %lld ranges, %lld memory rows)\n", round + 1,
                    what, profile ? "on" : "off", r.median_ms, r.step_ms.size(), static_cast<long long>(r.ranges),
                    static_cast<long long>(r.memory_rows));
        std::fflush(stdout);
        (profile ? on : off) = std::move(r);
      }
      on_medians.push_back(on.median_ms);
      off_medians.push_back(off.median_ms);
      on_all.insert(on_all.end(), on.step_ms.begin(), on.step_ms.end());
      off_all.insert(off_all.end(), off.step_ms.begin(), off.step_ms.end());
      paired.push_back(100.0 * (on.median_ms / off.median_ms - 1.0));
    }
    std::printf("per-round overhead (on vs off of the same round):");
    for (double p : paired) std::printf(" %+.2f%%", p);
    std::printf("\n");
    const double pooled_on = median(on_all), pooled_off = median(off_all);
    std::printf("median of all steady-state steps: on %.2f ms, off %.2f ms (%+.2f%%)\n", pooled_on, pooled_off,
                100.0 * (pooled_on / pooled_off - 1.0));
    // The headline: each run's median step time, then the median over the runs of each mode, so one run
    // slowed down by a burst of load elsewhere moves it least.
    const double med_on = median(on_medians), med_off = median(off_medians);
    const double overhead = 100.0 * (med_on / med_off - 1.0);
    std::printf("median of the per-run medians: on %.2f ms, off %.2f ms\n", med_on, med_off);
    std::printf("load average at end: %s\n", load_average().c_str());
    const double goal = o.memory ? kMemoryGoalPercent : kGoalPercent;
    std::printf("%s overhead: %+.2f%% of step time (goal <= %.0f%%: %s)\n", o.memory ? "memory profile" : "profiler",
                overhead, goal, overhead <= goal ? "met" : "missed");
    std::error_code ec;
    fs::remove_all(dir, ec);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "profiler_overhead: %s\n", e.what());
    if (!dir.empty()) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
    return 1;
  }
}
