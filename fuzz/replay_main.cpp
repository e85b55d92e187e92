// Replays inputs through a fuzz target without libFuzzer: every file named on the command line, and
// every file of every folder named (not recursive, sorted), once each. Exit 0 when every input ran
// through; a finding aborts (as it does under libFuzzer), so CTest reports the test as failed.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

int replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot open\n", file.c_str());
    return 1;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
  // A copy of exactly the input's size, so a read past its end is caught by the sanitizers too.
  std::vector<std::uint8_t> data(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(data.empty() ? nullptr : data.data(), data.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE|DIR...\nRuns each input once through the fuzz target.\n", argv[0]);
    return 2;
  }
  int failures = 0;
  std::size_t count = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path arg = argv[i];
    if (std::filesystem::is_directory(arg)) {
      std::set<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (entry.is_regular_file() && entry.path().filename().string().front() != '.') files.insert(entry.path());
      }
      for (const auto& f : files) {
        failures += replay(f);
        ++count;
      }
    } else if (std::filesystem::is_regular_file(arg)) {
      failures += replay(arg);
      ++count;
    } else {
      std::fprintf(stderr, "%s: no such file or folder\n", arg.c_str());
      return 2;
    }
  }
  std::printf("%zu input(s) replayed, %d could not be read\n", count, failures);
  return failures == 0 ? 0 : 1;
}
