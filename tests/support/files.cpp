#include "support/files.hpp"

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace wb::test {

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + file.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string read_text_if_present(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::filesystem::path& file, const std::string& text) { write_bytes(file, text.data(), text.size()); }

void write_bytes(const std::filesystem::path& file, const void* data, std::size_t n) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

}  // namespace wb::test
