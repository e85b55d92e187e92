// Helpers shared by the tensor-file tests: raw file bytes, random tensors and the error-message check;
// scratch directories and running Python (numpy) scripts written by the test come from tests/support.
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/tensor_file.hpp"
#include "support/files.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"

// The call throws TensorFileError and its message names `file` and contains `expect`.
#define REQUIRE_FILE_ERROR(expr, file, expect)                                                  \
  do {                                                                                          \
    REQUIRE_THROWS_AS(expr, ::wb::store::TensorFileError);                                      \
    REQUIRE_THROWS_WITH(expr, Catch::Matchers::Contains(std::filesystem::path(file).string()) && \
                                  Catch::Matchers::Contains(expect));                           \
  } while (0)

namespace wb::store::test {

using ::wb::test::ProcessResult;
using ::wb::test::read_text;
using ::wb::test::run_command;
using ::wb::test::run_python;
using ::wb::test::run_python_script;
using ::wb::test::TempDir;
using ::wb::test::write_text;

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  const std::string text = read_text(path);
  std::vector<std::byte> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<std::byte>(text[i]);
  return out;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& data) {
  ::wb::test::write_bytes(path, data.data(), data.size());
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
