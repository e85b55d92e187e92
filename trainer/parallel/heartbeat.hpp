#pragma once
// Heartbeats: each rank's liveness, readable by its peers, so that a collective that times out names
// the rank that stopped instead of only the rank that waited.
//
// Each rank's Heartbeat thread rewrites one small text file, DIR/rank-R.heartbeat, every interval:
//   rank 1 beat 57 unix_ns 1764033071123456789 step 7 pid 4242 host node3 doing allreduce of bucket 2 (step 7)
// (written to a temporary name and renamed over the old one, so a reader never sees half a beat, on a
// local or a network filesystem alike). DIR is the job's rank-file folder, which every rank already
// reaches; across hosts it must be on a shared filesystem, as the rank files must be for wb-train to
// merge them. A rank stopped by SIGSTOP, a debugger or a lost node stops beating with its process; a
// rank that died leaves its last beat behind, and on the same host its process is seen to be gone.
//
// When the watchdog times out it calls diagnose(), which reads every peer's file and names
//   "rank 2 stopped responding (last heartbeat 31.2 s ago, at step 7, computing; pid 4242 on node3)"
//   "rank 2 is gone (process 4242 exited; last heartbeat 0.3 s ago, at step 7, computing)"
// or, when every peer still beats, says where each one is. Ages compare the writer's wall clock with
// the reader's: the hosts' clocks must agree to well under the stale threshold (NTP does).
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace wb::parallel {

// One rank's last beat, as read from its file.
struct HeartbeatState {
  int rank = -1;
  std::uint64_t beat = 0;
  std::int64_t unix_ns = 0;  // CLOCK_REALTIME of the beat
  std::int64_t step = -1;
  pid_t pid = 0;
  std::string host;
  std::string doing;  // "" while computing; else e.g. "allreduce of bucket 2 (step 7)"
};

std::filesystem::path heartbeat_file(const std::filesystem::path& dir, int rank);
// The last beat in `file`; nullopt when there is none (no file yet, or not a heartbeat).
std::optional<HeartbeatState> read_heartbeat(const std::filesystem::path& file);

class Heartbeat {
 public:
  // Starts beating into dir/rank-<rank>.heartbeat every interval_s; a peer is stopped when its last
  // beat is older than stale_s(). Throws DistError when the folder cannot be written.
  Heartbeat(std::filesystem::path dir, int rank, int world, double interval_s);
  // Stops the thread and removes this rank's file (a clean end leaves none behind).
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // The interval that goes with a watchdog timeout: a tenth of it, between 50 ms and 1 s.
  static double interval_for(double watchdog_timeout_s);

  void set_step(std::int64_t step) { step_.store(step, std::memory_order_relaxed); }
  void set_doing(std::string what);
  double stale_s() const { return stale_s_; }
  const std::filesystem::path& dir() const { return dir_; }

  // One clause on the peers for the watchdog's message (see the top of this file).
  std::string diagnose() const;

 private:
  void run();
  void beat();

  std::filesystem::path dir_;
  int rank_;
  int world_;
  double interval_s_;
  double stale_s_;
  std::string host_;
  std::uint64_t beats_ = 0;
  std::atomic<std::int64_t> step_{-1};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::string doing_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace wb::parallel
