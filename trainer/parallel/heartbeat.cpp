#include "trainer/parallel/heartbeat.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <vector>

#include "trainer/parallel/error.hpp"

namespace wb::parallel {
namespace {

std::int64_t unix_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string this_host() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  std::string host = buf;
  for (char& c : host) c = c == ' ' || c == '\n' ? '_' : c;
  return host.empty() ? "?" : host;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

// "at step 7, computing" / "at step 7, in allreduce of bucket 2 (step 7)"
std::string where(const HeartbeatState& s) {
  std::string out = s.step >= 0 ? "at step " + std::to_string(s.step) : "before the first step";
  return out + (s.doing.empty() ? ", computing" : ", in " + s.doing);
}

}  // namespace

std::filesystem::path heartbeat_file(const std::filesystem::path& dir, int rank) {
  return dir / ("rank-" + std::to_string(rank) + ".heartbeat");
}

std::optional<HeartbeatState> read_heartbeat(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  std::istringstream fields(line);
  HeartbeatState s;
  std::string k[7];
  if (!(fields >> k[0] >> s.rank >> k[1] >> s.beat >> k[2] >> s.unix_ns >> k[3] >> s.step >> k[4] >> s.pid >> k[5] >>
        s.host >> k[6]) ||
      k[0] != "rank" || k[1] != "beat" || k[2] != "unix_ns" || k[3] != "step" || k[4] != "pid" || k[5] != "host" ||
      k[6] != "doing") {
    return std::nullopt;
  }
  std::getline(fields, s.doing);
  if (!s.doing.empty() && s.doing.front() == ' ') s.doing.erase(0, 1);
  return s;
}

double Heartbeat::interval_for(double watchdog_timeout_s) { return std::clamp(watchdog_timeout_s / 10.0, 0.05, 1.0); }

Heartbeat::Heartbeat(std::filesystem::path dir, int rank, int world, double interval_s)
    : dir_(std::move(dir)),
      rank_(rank),
      world_(world),
      interval_s_(interval_s),
      // Three missed beats, and never under 2 s: a loaded host delays a beat, it does not stop it.
      stale_s_(std::max(3.0 * interval_s, 2.0)),
      host_(this_host()) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  beat();  // the first beat is written before training, so a peer that never beats is told apart
  if (!std::filesystem::exists(heartbeat_file(dir_, rank_))) {
    throw DistError(heartbeat_file(dir_, rank_).string() + ": cannot write this rank's heartbeat file");
  }
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::error_code ec;
  std::filesystem::remove(heartbeat_file(dir_, rank_), ec);
}

void Heartbeat::set_doing(std::string what) {
  std::lock_guard lock(mutex_);
  doing_ = std::move(what);
}

void Heartbeat::beat() {
  std::string doing;
  {
    std::lock_guard lock(mutex_);
    doing = doing_;
  }
  for (char& c : doing) c = c == '\n' ? ' ' : c;
  std::ostringstream line;
  line << "rank " << rank_ << " beat " << ++beats_ << " unix_ns " << unix_now_ns() << " step "
       << step_.load(std::memory_order_relaxed) << " pid " << ::getpid() << " host " << host_ << " doing " << doing
       << '\n';
  const std::filesystem::path file = heartbeat_file(dir_, rank_);
  std::filesystem::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << line.str();
    if (!out) return;  // a full disk delays the beat; the peers then see it stale, which is the truth
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
}

void Heartbeat::run() {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(interval_s_));
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (cv_.wait_for(lock, interval, [&] { return stop_; })) break;
    lock.unlock();
    beat();
    lock.lock();
  }
}

std::string Heartbeat::diagnose() const {
  const std::int64_t now = unix_now_ns();
  std::vector<std::string> named, alive;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const auto s = read_heartbeat(heartbeat_file(dir_, r));
    if (!s) {
      named.push_back("rank " + std::to_string(r) + " has no heartbeat in " + dir_.string());
      continue;
    }
    const double age = static_cast<double>(now - s->unix_ns) * 1e-9;
    const std::string last = "last heartbeat " + seconds_text(age) + " s ago, " + where(*s);
    if (s->host == host_ && s->pid > 0 && ::kill(s->pid, 0) != 0 && errno == ESRCH) {
      named.push_back("rank " + std::to_string(r) + " is gone (process " + std::to_string(s->pid) + " exited; " + last +
                      ")");
    } else if (age > stale_s_) {
      named.push_back("rank " + std::to_string(r) + " stopped responding (" + last + "; pid " + std::to_string(s->pid) +
                      " on " + s->host + ")");
    } else {
      alive.push_back("rank " + std::to_string(r) + " " + where(*s));
    }
  }
  std::string out;
  for (const auto& n : named) out += (out.empty() ? "" : "; ") + n;
  if (!out.empty()) return out;
  out = "every peer still has a heartbeat (";
  for (std::size_t i = 0; i < alive.size(); ++i) out += (i ? "; " : "") + alive[i];
  return out + "): a peer is stuck elsewhere or its network is lost";
}

}  // namespace wb::parallel
