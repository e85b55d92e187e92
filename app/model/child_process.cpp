#include "app/model/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "allreduce/split_points.hpp"

extern char** environ;

namespace wb::app_model {

ChildProcess::ChildProcess(const std::filesystem::path& exe, const std::vector<std::string>& args) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw ChildError(exe.string() + ": cannot create a pipe: " + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> argv_store;
  argv_store.push_back(exe.string());
  argv_store.insert(argv_store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw ChildError(exe.string() + ": cannot start: " + std::strerror(rc));
  }
  pid_ = pid;
  reader_ = std::thread([this, fd = fds[0]] { read_loop(fd); });
}

ChildProcess::~ChildProcess() {
  if (running()) terminate();
  if (reader_.joinable()) reader_.join();
}

void ChildProcess::read_loop(int fd) {
  char buf[4096];
  while (true) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    std::lock_guard lock(mutex_);
    for (ssize_t i = 0; i < n; ++i) {
      char c = buf[i];
      if (c == '\n' || c == '\r') {
        if (!partial_.empty()) lines_.push_back(std::move(partial_));
        partial_.clear();
      } else {
        partial_.push_back(c);
      }
    }
  }
  close(fd);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  std::lock_guard lock(mutex_);
  if (!partial_.empty()) lines_.push_back(std::move(partial_));
  partial_.clear();
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

bool ChildProcess::running() const {
  std::lock_guard lock(mutex_);
  return !exit_code_.has_value();
}

std::optional<int> ChildProcess::exit_code() const {
  std::lock_guard lock(mutex_);
  return exit_code_;
}

std::vector<std::string> ChildProcess::lines() const {
  std::lock_guard lock(mutex_);
  auto out = lines_;
  if (!partial_.empty()) out.push_back(partial_);
  return out;
}

std::string ChildProcess::last_line() const {
  std::lock_guard lock(mutex_);
  if (!partial_.empty()) return partial_;
  return lines_.empty() ? std::string() : lines_.back();
}

void ChildProcess::terminate() {
  if (pid_ > 0 && running()) kill(pid_, SIGTERM);
}

int ChildProcess::wait() {
  if (reader_.joinable()) reader_.join();
  std::lock_guard lock(mutex_);
  return exit_code_.value_or(-1);
}

std::filesystem::path sibling_executable(std::string_view name) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return std::filesystem::path(name);
  return self.parent_path() / name;
}

std::filesystem::path train_executable() {
  const char* env = std::getenv("WB_TRAIN_BIN");
  const bool from_env = env && *env;
  std::filesystem::path exe = from_env ? std::filesystem::path(env) : sibling_executable("wb-train");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(exe, ec) || access(exe.c_str(), X_OK) != 0)
    throw ChildError("wb-train not found: " + exe.string() + " is not an executable file" +
                     (from_env ? " (from WB_TRAIN_BIN)" : " (expected next to wb-view; WB_TRAIN_BIN=PATH points elsewhere)"));
  return exe;
}

TrainLaunch make_train_launch(const nlohmann::json& config, int world_size, const std::vector<int>& split,
                              const std::filesystem::path& dir, std::string_view stem) {
  TrainLaunch launch;
  launch.config = config.is_object() ? config : nlohmann::json::object();
  auto& c = launch.config;
  // wb-train rejects config_file inside a config; run comes as a flag. The split is written once, here,
  // in the form wb-train's config reads and records: the points, or "none" for the single bucket.
  const allreduce::SplitPoints points = allreduce::SplitPoints::from_points(split);
  c.erase("config_file");
  c.erase("run");
  c["allreduce_split"] = points.is_single_bucket() ? nlohmann::json(points.to_string()) : nlohmann::json(points.points());
  c["bucket_mb"] = 0.0;
  if (world_size > 1) c["nproc"] = world_size;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  launch.config_path = dir / (std::string(stem) + ".json");
  launch.run_path = dir / (std::string(stem) + ".sqlite");
  std::ofstream out(launch.config_path);
  out << c.dump(2) << "\n";
  if (!out) throw ChildError(launch.config_path.string() + ": cannot write the wb-train config");
  launch.args = {"--config", launch.config_path.string(), "--run", launch.run_path.string()};
  return launch;
}

std::optional<TrainProgress> parse_progress(std::string_view line) {
  const char* end = line.data() + line.size();
  for (std::size_t pos = line.find("step "); pos != std::string_view::npos; pos = line.find("step ", pos + 1)) {
    TrainProgress p;
    auto r1 = std::from_chars(line.data() + pos + 5, end, p.step);
    if (r1.ec != std::errc() || end - r1.ptr < 2 || r1.ptr[0] != ' ' || r1.ptr[1] != '[') continue;
    auto r2 = std::from_chars(r1.ptr + 2, end, p.done);
    if (r2.ec != std::errc() || r2.ptr >= end || *r2.ptr != '/') continue;
    auto r3 = std::from_chars(r2.ptr + 1, end, p.steps);
    if (r3.ec != std::errc() || r3.ptr >= end || *r3.ptr != ']' || p.steps <= 0) continue;
    return p;
  }
  return std::nullopt;
}

}  // namespace wb::app_model
