#include "trainer/parallel/watchdog.hpp"

#include <cmath>
#include <cstdio>
#include <exception>
#include <sstream>
#include <vector>

#include "trainer/parallel/error.hpp"

namespace wb::parallel {

std::string timeout_message(int rank, const std::string& what, double timeout_s, const std::string& cause) {
  std::ostringstream out;
  out << "rank " << rank << ": " << what << " has not completed after " << timeout_s
      << " s: " << (cause.empty() ? "a peer rank is lost" : cause);
  return out.str();
}

Watchdog::Watchdog(int rank, double timeout_s, Action action, Diagnose diagnose)
    : rank_(rank), timeout_s_(timeout_s), action_(std::move(action)), diagnose_(std::move(diagnose)) {
  if (!(timeout_s > 0.0) || !std::isfinite(timeout_s)) {
    std::ostringstream msg;
    msg << "watchdog timeout " << timeout_s << " s: expected a positive number of seconds";
    throw DistError(msg.str());
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::Watchdog(Communicator& comm, double timeout_s, Diagnose diagnose)
    : Watchdog(
          comm.rank(), timeout_s,
          [&comm](const std::string& message) {
            std::fprintf(stderr, "%s\n", message.c_str());
            std::fflush(stderr);
            comm.abort_job(kWatchdogExitCode);
          },
          std::move(diagnose)) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Watchdog::Guard Watchdog::watch(std::string what) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  std::uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_id_++;
    entries_.emplace(id, Entry{deadline, std::move(what)});
  }
  cv_.notify_all();
  return Guard(this, id);
}

Watchdog::Guard::~Guard() {
  if (owner_) owner_->release(id_);
}

void Watchdog::release(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  entries_.erase(id);
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (entries_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto earliest = Clock::time_point::max();
    for (const auto& [id, e] : entries_) earliest = std::min(earliest, e.deadline);
    if (Clock::now() < earliest) {
      cv_.wait_until(lock, earliest);
      continue;
    }
    std::vector<std::string> expired;
    const auto now = Clock::now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.deadline <= now) {
        expired.push_back(std::move(it->second.what));
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
    // The action may not return (MPI_Abort) and must not run under the lock guards take.
    lock.unlock();
    for (const auto& what : expired) {
      std::string cause;
      if (diagnose_) {
        try {
          cause = diagnose_();
        } catch (const std::exception& e) {
          cause = std::string("a peer rank is lost (its heartbeat could not be read: ") + e.what() + ")";
        }
      }
      action_(timeout_message(rank_, what, timeout_s_, cause));
    }
    lock.lock();
  }
}

}  // namespace wb::parallel
