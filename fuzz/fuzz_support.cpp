#include "fuzz/fuzz_support.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <typeinfo>

namespace wb::fuzz {
namespace {

struct Scratch {
  std::filesystem::path dir;
  Scratch() {
    std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                           : std::filesystem::temp_directory_path();
    dir = base / ("wb-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

const std::filesystem::path& scratch_dir() {
  static Scratch scratch;
  return scratch.dir;
}

std::filesystem::path write_input(std::string_view name, const std::uint8_t* data, std::size_t size) {
  std::filesystem::path path = scratch_dir() / std::string(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write the input to %s\n", path.c_str());
    std::abort();
  }
  return path;
}

void check_message(const std::exception& e, const std::filesystem::path& file) {
  const std::string what = e.what();
  const std::string name = file.filename().string();
  if (what.empty() || what.find('\n') != std::string::npos || what.find(name) == std::string::npos) {
    std::fprintf(stderr, "fuzz: the error is not one line naming %s: \"%s\"\n", name.c_str(), what.c_str());
    std::abort();
  }
}

void unexpected(const std::exception& e, std::string_view target) {
  std::fprintf(stderr, "fuzz %.*s: unexpected %s: %s\n", static_cast<int>(target.size()), target.data(),
               typeid(e).name(), e.what());
  std::abort();
}

}  // namespace wb::fuzz
