#pragma once
// Whole files in and out: text, raw bytes and raw arrays of plain values (float32, int32, ...).

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace wb::test {

// The whole file; throws std::runtime_error when it cannot be read.
std::string read_text(const std::filesystem::path& file);
// The whole file, or "" when it cannot be read (say, /proc/<pid>/stat of a process that just ended).
std::string read_text_if_present(const std::filesystem::path& file);
// Replaces the file with `text`; throws std::runtime_error when it cannot be written.
void write_text(const std::filesystem::path& file, const std::string& text);
void write_bytes(const std::filesystem::path& file, const void* data, std::size_t n);

// The values of a raw file of T (a trailing partial value is dropped).
template <class T = float>
std::vector<T> read_raw(const std::filesystem::path& file) {
  const std::string bytes = read_text(file);
  std::vector<T> v(bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

template <class T>
void write_raw(const std::filesystem::path& file, const std::vector<T>& v) {
  write_bytes(file, v.data(), v.size() * sizeof(T));
}

}  // namespace wb::test
