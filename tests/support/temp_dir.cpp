#include "support/temp_dir.hpp"

#include <errno.h>
#include <stdlib.h>

#include <stdexcept>
#include <system_error>

namespace wb::test {

TempDir::TempDir() : TempDir(program_invocation_short_name) {}

TempDir::TempDir(std::string_view tag) {
  std::string pattern = (std::filesystem::temp_directory_path() / "wb-").string();
  pattern += tag.empty() ? std::string_view("test") : tag;
  pattern += "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "mkdtemp failed for " + pattern);
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace wb::test
