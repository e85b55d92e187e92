// Helpers shared by the tensor-file tests: a scratch directory under /tmp, running Python (numpy)
// scripts written by the test, raw file bytes, random tensors and the error-message check.
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/tensor_file.hpp"

// The call throws TensorFileError and its message names `file` and contains `expect`.
#define REQUIRE_FILE_ERROR(expr, file, expect)                                                  \
  do {                                                                                          \
    REQUIRE_THROWS_AS(expr, ::wb::store::TensorFileError);                                      \
    REQUIRE_THROWS_WITH(expr, Catch::Matchers::Contains(std::filesystem::path(file).string()) && \
                                  Catch::Matchers::Contains(expect));                           \
  } while (0)

namespace wb::store::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/wb_tensorfile_XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
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

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline ProcessResult run_command(const std::string& command) {
  ProcessResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  const std::string text = read_text(path);
  std::vector<std::byte> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<std::byte>(text[i]);
  return out;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& data) {
  write_text(path, std::string(reinterpret_cast<const char*>(data.data()), data.size()));
}

// Writes `script` to dir/name and runs it with the Python that has numpy; args are appended as is.
inline ProcessResult run_python(const TempDir& dir, const std::string& name, const std::string& script,
                                const std::string& args) {
  const auto path = dir / name;
  write_text(path, script);
  return run_command(std::string(WB_PYTHON) + " " + path.string() + " " + args);
}

// Random contents of the right size: booleans are 0/1, every other dtype random bit patterns
// (NaNs with payloads, infinities and subnormals included, which a bit-exact path must keep).
inline HostTensor random_tensor(std::string name, DType dtype, std::vector<std::int64_t> shape,
                                std::mt19937_64& rng) {
  HostTensor t{std::move(name), dtype, std::move(shape), {}};
  t.data.resize(static_cast<std::size_t>(t.numel()) * dtype_size(dtype));
  for (auto& b : t.data) b = static_cast<std::byte>(dtype == DType::BOOL ? rng() & 1 : rng() & 0xFF);
  return t;
}

// prefix + i + suffix (built by appending: GCC 12 warns falsely on "literal" + std::string&&).
inline std::string numbered(std::string prefix, std::size_t i, std::string_view suffix = {}) {
  prefix += std::to_string(i);
  prefix += suffix;
  return prefix;
}

inline std::vector<std::int64_t> shape_of(const nlohmann::json& j) { return j.get<std::vector<std::int64_t>>(); }

inline std::string describe(const std::vector<std::int64_t>& shape) { return nlohmann::json(shape).dump(); }

}  // namespace wb::store::test
