#pragma once
// Helpers for the data tests (linked as wb_data_test_support, never into the trainer): a scratch
// folder removed on scope exit, raw file I/O, and running a Python script with Debian's interpreter.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace wb::data::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::string pattern = (std::filesystem::temp_directory_path() / ("wb-data-" + tag + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& file, const void* data, size_t n) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

template <class T>
std::vector<T> read_all(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> out(bytes.size() / sizeof(T));
  std::copy(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(out.size() * sizeof(T)),
            reinterpret_cast<char*>(out.data()));
  return out;
}

// Writes `source` to dir/name and runs it with the interpreter the build was configured with, passing
// `args`; returns the exit status.
inline int run_python(const std::filesystem::path& dir, const std::string& name, const std::string& source,
                      const std::string& args) {
  const auto script = dir / name;
  write_bytes(script, source.data(), source.size());
  const std::string cmd = std::string(WB_PYTHON) + " " + script.string() + " " + args;
  return std::system(cmd.c_str());
}

// FNV-1a over raw bytes: a cheap fingerprint of a batch sequence.
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace wb::data::testing
