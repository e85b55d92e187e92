// Two ranks for real: mpirun starts wb-parallel-check, which checks allreduce sum/mean against the mean
// computed separately, broadcast, allgather, GradientSync on a simulated backward (3 buckets, spans,
// overlap), the collective order that places training-thread exchanges among the buckets (the same
// sequence on both ranks, whatever the threads' timing) and clock offsets; `--nproc 2` relaunches itself under mpirun; and the fault tests kill
// (SIGKILL) or freeze (SIGSTOP) rank 1 mid-run and require the job to end, non-zero, with a message.
// OpenMPI as root needs --allow-run-as-root; on a 2-core box --oversubscribe. Shared memory (vader)
// works here, so the transport is left to OpenMPI's default.

#include <catch2/catch.hpp>

#ifdef WB_PARALLEL_MPI  // the whole file: builds without MPI have no helper to launch

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <thread>
#include <algorithm>
#include <string>
#include <vector>

#include "support/process.hpp"
#include "support/peers.hpp"

using namespace std::chrono_literals;

namespace {

std::vector<std::string> mpirun_prefix(int np) {
  std::vector<std::string> cmd = {WB_MPIEXEC, "-np", std::to_string(np), "--oversubscribe", "--bind-to", "none"};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  return cmd;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

using Result = wb::test::ProcessResult;
using wb::test::run_command;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// The largest "<key>=<number>" figure printed by any rank.
double max_figure(const std::string& text, const std::string& key) {
  const std::regex re(key + "=([-0-9.e+]+)");
  double worst = -1.0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    worst = std::max(worst, std::stod((*it)[1].str()));
  }
  return worst;
}

// mpirun as a child with its output in a pipe, so a test can kill a rank and time the job's end.
class Job {
 public:
  explicit Job(const std::vector<std::string>& argv) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
    fcntl(fd_, F_SETFL, O_NONBLOCK);
  }
  ~Job() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(fd_);
  }
  // Reads output until `pattern` matches or `timeout` passes.
  bool read_until(const std::regex& pattern, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (std::regex_search(output_, pattern)) return true;
      drain(50);
    }
    return std::regex_search(output_, pattern);
  }
  // Waits for mpirun to exit; false if it is still running after `timeout`.
  bool wait(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      drain(50);
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        while (drain(0)) {
        }
        return true;
      }
    }
    return false;
  }
  const std::string& output() const { return output_; }
  int exit_code() const { return exit_code_; }

 private:
  bool drain(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    output_.append(buf, static_cast<std::size_t>(n));
    return true;
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string output_;
};

int pid_of_rank(const std::string& output, int rank) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) + " pid ([0-9]+)");
  REQUIRE(std::regex_search(output, m, re));
  return std::stoi(m[1].str());
}

// Gone: no such process, or a zombie nobody has reaped yet.
bool process_gone(int pid) {
  if (kill(pid, 0) != 0) return true;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return true;
  char state = '?';
  const int got = std::fscanf(f, "%*d %*s %c", &state);
  std::fclose(f);
  return got == 1 && (state == 'Z' || state == 'X');
}

bool gone_within(int pid, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!process_gone(pid)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

}  // namespace

TEST_CASE("two ranks: collectives, GradientSync with overlap, clock offsets", "[mpi]") {
  auto cmd = mpirun_prefix(2);
  cmd.push_back(WB_PARALLEL_CHECK);
  const Result r = run_command(join(cmd));
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(count(r.output, "FAIL") == 0);
  REQUIRE(count(r.output, " world 2 ") == 2);
  for (const char* check : {"allreduce-sum ok", "allreduce-mean ok", "broadcast ok", "allgather ok", "barrier ok",
                            "broadcast-parameters ok", "sync-average ok", "sync-spans ok", "sync-overlap ok",
                            "collective-order ok", "clock-offsets ok"}) {
    CAPTURE(check);
    REQUIRE(count(r.output, check) == 2);
  }
  const double rel_l2 = max_figure(r.output, "rel_l2");
  std::printf("two ranks: worst allreduce/sync rel-L2 %.3g, clock error %.0f ns (min round trip %.0f ns)\n", rel_l2,
              max_figure(r.output, "max_error_ns"), max_figure(r.output, "min_rtt_ns"));
  REQUIRE(rel_l2 >= 0.0);
  REQUIRE(rel_l2 <= 1e-6);
  // 3 steps x 3 buckets per rank, each with ready <= start <= end (checked by the helper).
  REQUIRE(count(r.output, ": span step=") == 18);
}

TEST_CASE("--nproc 2 relaunches the program under mpirun", "[mpi]") {
  const Result r = run_command(std::string(WB_PARALLEL_CHECK) + " --nproc 2 collectives");
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(count(r.output, " world 2 ") == 2);
  REQUIRE(count(r.output, "launcher openmpi") == 2);
  REQUIRE(count(r.output, "allreduce-mean ok") == 2);
}

TEST_CASE("without a launcher the program is rank 0 of 1", "[mpi]") {
  const Result r = run_command(std::string(WB_PARALLEL_CHECK) + " collectives");
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(count(r.output, "rank 0 pid") == 1);
  REQUIRE(count(r.output, " world 1 ") == 1);
  REQUIRE(count(r.output, "launcher none") == 1);
}

TEST_CASE("a rank killed with SIGKILL stops the job within 60 s, non-zero, naming the rank", "[mpi][fault]") {
  auto cmd = mpirun_prefix(2);
  cmd.insert(cmd.end(), {WB_PARALLEL_CHECK, "loop"});
  Job job(cmd);
  REQUIRE(job.read_until(std::regex("rank 0: loop running"), 30s));
  REQUIRE(job.read_until(std::regex("rank 1 pid [0-9]+"), 5s));
  const int rank0 = pid_of_rank(job.output(), 0);
  const int rank1 = pid_of_rank(job.output(), 1);
  const auto killed = std::chrono::steady_clock::now();
  REQUIRE(kill(rank1, SIGKILL) == 0);
  const bool ended = job.wait(60s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  CAPTURE(job.output(), seconds);
  REQUIRE(ended);
  REQUIRE(gone_within(rank0, 5s));
  std::printf("SIGKILL of rank 1: the job ended after %.2f s with exit code %d\n", seconds, job.exit_code());
  REQUIRE(job.exit_code() != 0);
  REQUIRE(std::regex_search(job.output(), std::regex("rank 1 with PID [0-9]+ .*exited on signal 9|rank 1: .*lost")));
}

TEST_CASE("a frozen rank (SIGSTOP) trips the watchdog: message, MPI_Abort, non-zero exit", "[mpi][fault]") {
  auto cmd = mpirun_prefix(2);
  cmd.insert(cmd.end(), {WB_PARALLEL_CHECK, "--watchdog-s", "3", "loop"});
  Job job(cmd);
  REQUIRE(job.read_until(std::regex("rank 0: loop running"), 30s));
  REQUIRE(job.read_until(std::regex("rank 1 pid [0-9]+"), 5s));
  const int rank0 = pid_of_rank(job.output(), 0);
  const int rank1 = pid_of_rank(job.output(), 1);
  const auto stopped = std::chrono::steady_clock::now();
  REQUIRE(kill(rank1, SIGSTOP) == 0);
  const bool ended = job.wait(60s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  CAPTURE(job.output(), seconds);
  if (!ended) kill(rank1, SIGKILL);
  REQUIRE(ended);
  REQUIRE(gone_within(rank0, 5s));
  REQUIRE(gone_within(rank1, 5s));
  std::printf("SIGSTOP of rank 1: the watchdog ended the job after %.2f s with exit code %d\n", seconds, job.exit_code());
  REQUIRE(seconds >= 3.0);
  REQUIRE(job.exit_code() != 0);
  REQUIRE(std::regex_search(
      job.output(), std::regex("rank 0: allreduce of bucket [0-2] \\(step [0-9]+\\) has not completed after 3 s: "
                               "a peer rank is lost")));
}

#endif  // WB_PARALLEL_MPI
