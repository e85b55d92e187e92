// The GPU kit's scripts that run without a GPU (scripts/gpu-kit builds the kit; tests/gpu/ holds what
// goes in it): the search for the CUDA libraries on a GPU machine (tests/gpu/find-cuda-libs), fed a
// made-up toolkit and made-up PyTorch wheels, and the run script's answers to bad arguments. The kit
// itself is checked in a pristine Debian root (docs/guide/gpu.md).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/peers.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using wb::test::run_command;
using wb::test::shell_quote;

namespace {

std::string script(const char* name) { return (fs::path(WB_SOURCE_DIR) / "tests" / "gpu" / name).string(); }

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) out.push_back(l);
  }
  return out;
}

void touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "not a real library\n";
}

}  // namespace

TEST_CASE("find-cuda-libs lists the toolkit's folders first, then the Python's nvidia wheels", "[trainer][gpu-kit]") {
  wb::test::TempDir dir;
  const fs::path cuda = dir / "cuda", site = dir / "py" / "site-packages";
  touch(cuda / "lib64" / "libcudart.so.13");
  touch(cuda / "targets" / "x86_64-linux" / "lib" / "libcupti.so.13");
  touch(site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9");
  touch(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2");
  fs::create_directories(site / "nvidia" / "nothing");  // a wheel without lib/ is passed over
  const fs::path real = fs::canonical(dir.path());
  // A Python that sees the made-up site-packages (on sys.path, as a venv's would be).
  const std::string py = dir.file("python");
  std::ofstream(py) << "#!/bin/sh\nPYTHONPATH=" << shell_quote(site.string()) << " exec python3 \"$@\"\n";
  fs::permissions(py, fs::perms::owner_all);

  const auto r = run_command(shell_quote(script("find-cuda-libs")) + " --cuda-root " + shell_quote(cuda.string()) +
                             " --python " + shell_quote(py));
  CAPTURE(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<std::string> want = {(real / "cuda" / "lib64").string(),
                                         (real / "cuda" / "targets" / "x86_64-linux" / "lib").string(),
                                         (real / "py" / "site-packages" / "nvidia" / "cudnn" / "lib").string(),
                                         (real / "py" / "site-packages" / "nvidia" / "nccl" / "lib").string()};
  CHECK(lines(r.out) == want);

  SECTION("without that Python, the toolkit's folders alone") {
    const auto r2 = run_command(shell_quote(script("find-cuda-libs")) + " --cuda-root " + shell_quote(cuda.string()) +
                                " --python /no/such/python");
    CHECK(r2.exit_code == 0);
    CHECK(lines(r2.out) == std::vector<std::string>(want.begin(), want.begin() + 2));
  }
  SECTION("without a toolkit, the wheels alone") {
    const auto r3 = run_command(shell_quote(script("find-cuda-libs")) + " --cuda-root " +
                                shell_quote((dir / "none").string()) + " --python " + shell_quote(py));
    CHECK(r3.exit_code == 0);
    CHECK(lines(r3.out) == std::vector<std::string>(want.begin() + 2, want.end()));
  }
}

TEST_CASE("gpu-kit/run: a bad argument is one line and exit 2", "[trainer][gpu-kit]") {
  for (const char* args : {"--part 3", "--frobnicate", "--part"}) {
    CAPTURE(args);
    const auto r = run_command(shell_quote(script("kit-run")) + " " + args);
    CHECK(r.exit_code == 2);
    CHECK(lines(r.err).size() == 1);
    CHECK(r.err.find("gpu-kit/run:") == 0);
  }
}
