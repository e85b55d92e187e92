// Shared helpers of the whole-trainer tests: a fresh temporary directory, running wb-train (or any
// command) with its stdout and stderr captured apart, and reading a checkpoint's tensors by name.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "store/tensor_file.hpp"

namespace wb::test {

class TrainerTempDir {
 public:
  TrainerTempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "wb-trainer-test-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~TrainerTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TrainerTempDir(const TrainerTempDir&) = delete;
  TrainerTempDir& operator=(const TrainerTempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_text(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

// Single-quoted for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string out(1, '\'');
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  out += '\'';
  return out;
}

struct Result {
  int exit_code = -1;  // the exit status, or 128 + signal when killed
  std::string out;
  std::string err;
};

// Runs `command` through /bin/sh with stdout and stderr captured into files of `dir`.
inline Result run_command(const std::string& command, const std::filesystem::path& dir) {
  const auto out_file = dir / "cmd.stdout";
  const auto err_file = dir / "cmd.stderr";
  std::string full = command;
  full += " >";
  full += shell_quote(out_file.string());
  full += " 2>";
  full += shell_quote(err_file.string());
  const int status = std::system(full.c_str());
  Result r;
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (status != -1 && WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  r.out = read_text(out_file);
  r.err = read_text(err_file);
  return r;
}

// Runs wb-train with `args` (each quoted); the working directory stays the caller's.
inline Result run_train(const std::vector<std::string>& args, const std::filesystem::path& dir) {
  std::string cmd = shell_quote(WB_TRAIN);
  for (const auto& a : args) {
    cmd += ' ';
    cmd += shell_quote(a);
  }
  return run_command(cmd, dir);
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

}  // namespace wb::test
