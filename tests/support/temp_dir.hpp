#pragma once
// A fresh scratch directory for one test, removed with everything in it when it goes out of scope.

#include <filesystem>
#include <string>
#include <string_view>

namespace wb::test {

class TempDir {
 public:
  // <temp dir>/wb-<tag>-XXXXXX (mkdtemp); without a tag, the test executable's name is the tag.
  TempDir();
  explicit TempDir(std::string_view tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& name) const { return path_ / name; }
  // The path of `name` in the directory, as a string.
  std::string file(const std::filesystem::path& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace wb::test
