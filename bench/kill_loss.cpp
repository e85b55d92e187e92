// How much of a recording a SIGKILL loses: wb-train records a steady stream of op ranges; it is
// killed with SIGKILL at a random moment of its training, and the loss is the time between the kill
// and the last event that reached the run file (the end of the last range, counter sample or step
// row). docs/ARCHITECTURE.md promises at most 200 ms (rows are committed every 100 ms). The figure
// slightly overstates the loss: the op running at the kill had not ended, so it was never generated.
//
//   build/bin/kill_loss [KILLS] [--train WB_TRAIN]   (default 20 kills of this build's wb-train; --train
//                                                    measures another build's, e.g. before a change)
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "profiler/record/clock.hpp"
#include "store/db.hpp"
#include "store/reader.hpp"
#include "tests/support/peers.hpp"

extern char** environ;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The newest event time in a (killed) run file.
std::int64_t last_event_ns(const fs::path& file) {
  wb::store::Reader r(file);
  wb::store::Db& db = r.db();
  std::int64_t last = 0;
  for (const char* sql : {"SELECT coalesce(max(end_ns), 0) FROM range", "SELECT coalesce(max(t_ns), 0) FROM counter",
                          "SELECT coalesce(max(end_ns), 0) FROM step"})
    last = std::max(last, db.query_int64(sql));
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  int kills = 20;
  fs::path train = fs::path(WB_TRAIN);
  bool usage = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--train" && i + 1 < argc) {
      train = argv[++i];
    } else if (!a.empty() && a.find_first_not_of("0123456789") == std::string::npos) {
      kills = std::atoi(a.c_str());
    } else {
      usage = true;
    }
  }
  if (kills < 1 || usage || !fs::is_regular_file(train)) {
    std::fprintf(stderr, "usage: %s [KILLS] [--train WB_TRAIN]\nKills a recording wb-train KILLS times (default 20) "
                 "and reports the milliseconds of events lost.\n", argv[0]);
    return 2;
  }
  const fs::path dir = fs::temp_directory_path() / ("wb-kill-loss-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> pause_ms(0, 1500);
  std::vector<double> losses;
  for (int k = 0; k < kills; ++k) {
    const fs::path run = dir / ("kill-" + std::to_string(k) + ".sqlite");
    const fs::path out = dir / ("kill-" + std::to_string(k) + ".out");
    std::vector<std::string> args = {train.string(), "--data", "synthetic", "--synthetic-samples", "256",
                                     "--batch-size", "4", "--image-size", "32", "--steps", "100000",
                                     "--log-every", "1", "--run", run.string()};
    std::vector<char*> argvv;
    for (auto& a : args) argvv.push_back(a.data());
    argvv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    if (posix_spawn(&pid, train.c_str(), &fa, nullptr, argvv.data(), environ) != 0) {
      std::fprintf(stderr, "kill_loss: cannot start %s\n", train.c_str());
      return 1;
    }
    posix_spawn_file_actions_destroy(&fa);
    // Training for a few steps, so the stream of events is steady, then a random pause.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    while (read_all(out).find("step 3 [") == std::string::npos && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms(rng)));
    const std::int64_t kill_ns = wb::profiler::now_ns();
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    try {
      const double loss_ms = static_cast<double>(kill_ns - last_event_ns(run)) * 1e-6;
      losses.push_back(loss_ms);
      std::printf("kill %2d: %.1f ms of events lost\n", k + 1, loss_ms);
      std::fflush(stdout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kill_loss: kill %d: %s\n", k + 1, e.what());
      return 1;
    }
  }
  fs::remove_all(dir);
  std::sort(losses.begin(), losses.end());
  const double median = losses.size() % 2 ? losses[losses.size() / 2]
                                          : 0.5 * (losses[losses.size() / 2 - 1] + losses[losses.size() / 2]);
  std::printf("kill loss over %d SIGKILLs: median %.1f ms, max %.1f ms (goal <= 200 ms)\n", kills, median,
              losses.back());
  return losses.back() <= 200.0 ? 0 : 1;
}
