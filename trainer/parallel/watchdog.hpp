#pragma once
// A watchdog on collectives. A rank that dies (SIGKILL, OOM, lost node) leaves its peers blocked in a
// collective that can never complete; MPI may not notice on every transport, and a rank that hangs
// (SIGSTOP, a stuck device) is noticed by none. Each collective is watched: if it has not completed
// after the timeout, the watchdog prints
//   rank R: allreduce of bucket B (step S) has not completed after 30 s: CAUSE
// where CAUSE names the peer whose heartbeat stopped (a Diagnose, usually Heartbeat::diagnose, see
// heartbeat.hpp), or says "a peer rank is lost" without one, and runs its action, by default
// Communicator::abort_job (MPI_Abort; ncclCommAbort first on GPU), so the job stops with a non-zero
// exit code instead of hanging. The same path serves MPI and NCCL: only abort_job differs.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "trainer/parallel/communicator.hpp"

namespace wb::parallel {

inline constexpr double kDefaultWatchdogSeconds = 30.0;
inline constexpr int kWatchdogExitCode = 3;

// "rank R: <what> has not completed after T s: <cause>" (cause "a peer rank is lost" when empty)
std::string timeout_message(int rank, const std::string& what, double timeout_s, const std::string& cause = {});

class Watchdog {
 public:
  using Action = std::function<void(const std::string& message)>;
  // Says which peer is at fault, when asked at a timeout (on the watchdog's thread).
  using Diagnose = std::function<std::string()>;

  // Runs `action(message)` on the watchdog's thread for every watched operation that outlives
  // `timeout_s` (once per operation). timeout_s must be > 0.
  Watchdog(int rank, double timeout_s, Action action, Diagnose diagnose = {});
  // The default action: print the message on stderr, then comm.abort_job(kWatchdogExitCode).
  Watchdog(Communicator& comm, double timeout_s, Diagnose diagnose = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `what` (e.g. "allreduce of bucket 2 (step 5)") until the guard is destroyed.
  class Guard {
   public:
    Guard(Guard&& other) noexcept : owner_(other.owner_), id_(other.id_) { other.owner_ = nullptr; }
    Guard& operator=(Guard&&) = delete;
    ~Guard();

   private:
    friend class Watchdog;
    Guard(Watchdog* owner, std::uint64_t id) : owner_(owner), id_(id) {}
    Watchdog* owner_;
    std::uint64_t id_;
  };
  [[nodiscard]] Guard watch(std::string what);

  double timeout_s() const { return timeout_s_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    Clock::time_point deadline;
    std::string what;
  };
  void run();
  void release(std::uint64_t id);

  int rank_;
  double timeout_s_;
  Action action_;
  Diagnose diagnose_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t next_id_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace wb::parallel
