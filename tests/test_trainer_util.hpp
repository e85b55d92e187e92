// Shared helpers of the whole-trainer tests: running wb-train, its one-line errors, and reading a
// checkpoint's tensors by name. TempDir, run_command, shell_quote, read_text and write_text come from
// tests/support.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "store/tensor_file.hpp"
#include "support/files.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "support/peers.hpp"

namespace wb::test {

// A command's exit code, stdout and stderr (support/process.hpp).
using Result = ProcessResult;

// Runs wb-train with `args` (each quoted) in the caller's working directory.
inline Result run_train(const std::vector<std::string>& args) {
  std::string cmd = shell_quote(WB_TRAIN);
  for (const auto& a : args) {
    cmd += ' ';
    cmd += shell_quote(a);
  }
  return run_command(cmd);
}

inline int count_lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

// args followed by more.
inline std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// One line on stderr, starting with the program name and holding every `needle`; exit code 2.
inline void require_one_line_error(const Result& r, const std::vector<std::string>& needles) {
  CAPTURE(r.exit_code, r.err, r.out);
  CHECK(r.exit_code == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.rfind("wb-train: ", 0) == 0);
  for (const auto& n : needles) {
    CAPTURE(n);
    CHECK(r.err.find(n) != std::string::npos);
  }
}

// A checkpoint's tensors by name.
inline std::map<std::string, store::HostTensor> read_checkpoint(const std::filesystem::path& file) {
  std::map<std::string, store::HostTensor> out;
  for (auto& t : store::read_safetensors(file)) {
    std::string name = t.name;
    out.emplace(std::move(name), std::move(t));
  }
  return out;
}

// Number of tensors of `a` whose bytes differ from `b`'s (or that `b` lacks), among names starting
// with `prefix` ("" for every tensor); also the largest absolute element difference of F32 tensors.
struct CheckpointDiff {
  int compared = 0;
  int differing = 0;
  double max_abs = 0.0;
};
inline CheckpointDiff diff_checkpoints(const std::map<std::string, store::HostTensor>& a,
                                       const std::map<std::string, store::HostTensor>& b, const std::string& prefix,
                                       bool exclude_prefix = false) {
  CheckpointDiff d;
  for (const auto& [name, ta] : a) {
    const bool has_prefix = name.rfind(prefix, 0) == 0;
    if (has_prefix == exclude_prefix) continue;
    ++d.compared;
    auto it = b.find(name);
    if (it == b.end() || it->second.data != ta.data || it->second.shape != ta.shape) ++d.differing;
    if (it != b.end() && ta.dtype == store::DType::F32 && it->second.data.size() == ta.data.size()) {
      const std::size_t n = ta.data.size() / sizeof(float);
      for (std::size_t i = 0; i < n; ++i) {
        float x = 0, y = 0;
        std::memcpy(&x, ta.data.data() + i * sizeof(float), sizeof(float));
        std::memcpy(&y, it->second.data.data() + i * sizeof(float), sizeof(float));
        const double e = std::abs(static_cast<double>(x) - static_cast<double>(y));
        if (e > d.max_abs) d.max_abs = e;
      }
    }
  }
  return d;
}

// Processes a test launched (a wb-train job under mpirun), read from /proc.
// Direct children of `parent` whose command name is `comm`.
inline std::vector<pid_t> children_named(pid_t parent, const std::string& comm) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text_if_present(e.path() / "stat");
    const auto open = stat.find('(');
    const auto close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 >= stat.size()) continue;
    const std::string command = stat.substr(open + 1, close - open - 1);
    const char state = stat[close + 2];
    const long ppid = std::strtol(stat.c_str() + close + 4, nullptr, 10);
    if (ppid == parent && command == comm && state != 'Z') out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// The rank a launched process was given (OMPI_COMM_WORLD_RANK in its environment), -1 if unknown.
inline int rank_of(pid_t pid) {
  const std::string env = read_text_if_present("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = "OMPI_COMM_WORLD_RANK=";
  std::size_t at = 0;
  while (at < env.size()) {
    const std::size_t end = env.find('\0', at);
    const std::string var = env.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (var.rfind(key, 0) == 0) return std::stoi(var.substr(key.size()));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return -1;
}

// True while the process exists and is not a zombie.
inline bool alive(pid_t pid) {
  const std::string stat = read_text_if_present("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// Starts wb-train with `args` in the background, its stdout and stderr into files; its pid (a
// multi-rank launch replaces itself with mpirun, whose children are the ranks).
inline pid_t spawn_train(std::vector<std::string> args, const std::filesystem::path& out,
                         const std::filesystem::path& err) {
  args.insert(args.begin(), WB_TRAIN);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, WB_TRAIN, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return pid;
}

}  // namespace wb::test
