// Run-file size of a triggered capture against a full recording: the same wb-train run (synthetic
// 32x32 data, batch 2, one compute thread, STEPS steps) recorded in full and with --capture slow:K
// (window 5), one after the other. Prints each file's size and rows per event table, the windows the
// capture kept and why, and last the ratio of the sizes. Takes about 2 x STEPS x the step time (0.2 s
// a step on one loaded core: about 13 minutes for the default 2,000 steps).
//
//   build/bin/capture_size [STEPS] [K]     (default 2000 steps, slow:3)
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "store/db.hpp"
#include "tests/support/peers.hpp"

namespace fs = std::filesystem;

namespace {

std::string quote(const std::string& s) { return "'" + s + "'"; }

int train(const fs::path& run, long steps, const std::string& extra) {
  const std::string cmd = quote(WB_TRAIN) + " --data synthetic --synthetic-samples 256 --batch-size 2 --image-size 32" +
                          " --threads 1 --log-every 200 --steps " + std::to_string(steps) + " --run " +
                          quote(run.string()) + extra;
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

void describe(const char* what, const fs::path& run) {
  wb::store::Db db = wb::store::open_run(run);
  std::printf("%-28s %10.2f MB  steps %lld  ranges %lld  counters %lld  kernels %lld\n", what,
              static_cast<double>(fs::file_size(run)) / 1e6,
              static_cast<long long>(db.query_int64("SELECT count(*) FROM step")),
              static_cast<long long>(db.query_int64("SELECT count(*) FROM range")),
              static_cast<long long>(db.query_int64("SELECT count(*) FROM counter")),
              static_cast<long long>(db.query_int64("SELECT count(*) FROM kernel")));
}

}  // namespace

int main(int argc, char** argv) {
  const long steps = argc > 1 ? std::atol(argv[1]) : 2000;
  const std::string k = argc > 2 ? argv[2] : "3";
  if (steps < 20 || argc > 3) {
    std::fprintf(stderr, "usage: %s [STEPS] [K]\nRecords STEPS (>= 20, default 2000) wb-train steps in full and with "
                 "--capture slow:K (default 3), and compares the run files' sizes.\n", argv[0]);
    return 2;
  }
  const fs::path dir = fs::temp_directory_path() / ("wb-capture-size-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path full = dir / "full.sqlite", captured = dir / "captured.sqlite";
  if (train(full, steps, "") != 0 || train(captured, steps, " --capture slow:" + k + " --capture-window 5") != 0) {
    std::fprintf(stderr, "capture_size: wb-train failed (files kept in %s)\n", dir.c_str());
    return 1;
  }
  describe("full recording", full);
  describe(("--capture slow:" + k).c_str(), captured);
  {
    wb::store::Db db = wb::store::open_run(captured);
    auto& st = db.prepare("SELECT first_step, last_step, trigger_step, detail FROM capture_window ORDER BY first_step");
    while (st.step())
      std::printf("  window steps %lld-%lld (trigger step %lld): %s\n", static_cast<long long>(st.column_int64(0)),
                  static_cast<long long>(st.column_int64(1)), static_cast<long long>(st.column_int64(2)),
                  st.column_text(3).c_str());
    st.reset();
  }
  const double a = static_cast<double>(fs::file_size(full)), b = static_cast<double>(fs::file_size(captured));
  fs::remove_all(dir);
  std::printf("run file of %ld steps: full %.2f MB, --capture slow:%s %.2f MB: %.1fx smaller\n", steps, a / 1e6,
              k.c_str(), b / 1e6, a / b);
  return 0;
}
