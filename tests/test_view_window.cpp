// Window tests: wb-view renders each view of a real recorded run (a short 2-rank CPU training with
// profiling and a step-one dump, compared against the PyTorch baseline of that step) into a PNG under
// the current display, or under xvfb-run when there is none. Each screenshot must be a real picture
// (many distinct colours) and differ from the other views'; a bad file must show the error popup.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "store_test_util.hpp"
#include "support/process.hpp"
#include "view_test_util.hpp"
#include "support/peers.hpp"

using wb::test::differing_fraction;
using wb::test::Image;
using wb::test::load_png;

namespace fs = std::filesystem;

namespace {

const std::string kBin = std::string(WB_BINARY_DIR) + "/bin/";

using wb::test::shell_quote;

// Runs a shell command, its output into log; returns the exit status.
int run(const std::string& cmd, const fs::path& log) {
  int rc = std::system((cmd + " > " + shell_quote(log.string()) + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::string with_display(const std::string& cmd) {
  const char* d = std::getenv("DISPLAY");
  if (d && *d) return cmd;
  return "xvfb-run -a -s '-screen 0 1600x1000x24' " + cmd;
}

// The recorded runs, made once for all test cases of this executable.
struct Runs {
  wb::test::TempDir dir;
  fs::path one, two, reference;
  Runs() {
    one = dir / "one.sqlite";
    two = dir / "two.sqlite";
    const std::string train = kBin + "wb-train --steps 3 --batch-size 4 --dump-step 1 --data-workers 1 ";
    REQUIRE(run(train + "--run " + shell_quote(one.string()), dir / "one.log") == 0);
    REQUIRE(run(train + "--nproc 2 --run " + shell_quote(two.string()), dir / "two.log") == 0);
    // The PyTorch baseline of the dumped step; a second run is the documented fallback reference.
    reference = dir / "ref.safetensors";
    std::string torch = std::string(WB_PYTHON) + " " + WB_SOURCE_DIR + "/compare/reference/torch_step.py " + shell_quote(two.string()) +
                        " --out " + shell_quote(reference.string());
    if (run(torch, dir / "ref.log") != 0) reference = one;
  }
};

Runs& runs() {
  static Runs r;
  return r;
}

}  // namespace

TEST_CASE("each view of a real 2-rank run renders a distinct, non-blank screenshot", "[app]") {
  Runs& r = runs();
  const char* views[] = {"overview", "timeline", "ops", "queue", "allreduce", "precision", "memory"};
  std::map<std::string, Image> shots;
  for (const char* v : views) {
    CAPTURE(v);
    fs::path png = r.dir / (std::string(v) + ".png");
    std::string cmd = kBin + "wb-view " + shell_quote(r.two.string()) + " --view " + v + " --screenshot " + shell_quote(png.string()) + " --size 1400x860";
    if (std::string(v) == "precision") cmd += " --reference " + shell_quote(r.reference.string());
    int rc = run(with_display(cmd), r.dir / (std::string(v) + ".log"));
    REQUIRE(rc == 0);
    REQUIRE(fs::exists(png));
    Image img = load_png(png);
    CHECK(img.w == 1400);
    CHECK(img.h == 860);
    std::size_t colours = img.distinct();
    CAPTURE(colours);
    CHECK(colours >= 200);
    shots[v] = std::move(img);
  }
  for (const char* a : views)
    for (const char* b : views) {
      if (std::string(a) >= std::string(b)) continue;
      CAPTURE(a, b);
      CHECK(differing_fraction(shots[a], shots[b]) > 0.05);
    }
}

TEST_CASE("a single-rank run renders its overview and timeline", "[app]") {
  Runs& r = runs();
  for (const char* v : {"overview", "timeline"}) {
    CAPTURE(v);
    fs::path png = r.dir / (std::string("one-") + v + ".png");
    REQUIRE(run(with_display(kBin + "wb-view " + shell_quote(r.one.string()) + " --view " + v + " --screenshot " + shell_quote(png.string())),
                r.dir / "one-view.log") == 0);
    CHECK(load_png(png).distinct() >= 200);
  }
}

TEST_CASE("the Timeline outlines a step's critical path across ranks in its own colour", "[app]") {
  Runs& r = runs();
  auto shot = [&](const std::string& step) {
    fs::path png = r.dir / ("path-" + step + ".png");
    REQUIRE(run(with_display(kBin + "wb-view " + shell_quote(r.two.string()) + " --view timeline --path-step " + step +
                             " --screenshot " + shell_quote(png.string()) + " --size 1400x860"),
                r.dir / "path.log") == 0);
    return load_png(png);
  };
  // The path's orange (255, 150, 40): outlines, lines and its label. Step 2 has a path (every rank
  // recorded it with its allreduces); step 9 does not exist, so nothing is outlined.
  const double with_path = shot("2").share_near(255, 150, 40, 2);
  const double without = shot("9").share_near(255, 150, 40, 2);
  CAPTURE(with_path, without);
  // 530 to 1,250 pixels of 1400x860 in runs here: how much depends on the run's own timing (how often the
  // path changes lanes, how many of its boxes merge under 2 px), so the floor is 360 pixels: the label alone
  // is about 16, and no path stays under 240.
  CHECK(with_path > 0.0003);
  CHECK(without < 0.0002);
}

TEST_CASE("a bad file shows the error popup in the screenshot and exits 2", "[app]") {
  Runs& r = runs();
  struct Case {
    std::string name;
    std::string bytes;
  };
  // Not SQLite; an SQLite header cut short (a truncated file).
  for (const Case& c : {Case{"junk.sqlite", "definitely not a run"}, Case{"cut.sqlite", std::string("SQLite format 3\0", 16) + std::string(50, 'x')}}) {
    CAPTURE(c.name);
    fs::path bad = r.dir / c.name;
    {
      std::ofstream out(bad, std::ios::binary);
      out << c.bytes;
    }
    fs::path png = r.dir / (c.name + ".png");
    fs::path log = r.dir / (c.name + ".log");
    int rc = run(with_display(kBin + "wb-view " + shell_quote(bad.string()) + " --screenshot " + shell_quote(png.string())), log);
    CHECK(rc == 2);
    REQUIRE(fs::exists(png));
    Image img = load_png(png);
    // A modal popup dims the whole window behind it (the dark background turns grey), and its title
    // "The file could not be opened" is red.
    CHECK(img.share_near(89, 90, 92, 8) > 0.3);
    CHECK(img.reds() > 40);
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text.find(c.name) != std::string::npos);
  }
  // A good run shows no popup: nothing dimmed.
  fs::path ok = r.dir / "ok.png";
  REQUIRE(run(with_display(kBin + "wb-view " + shell_quote(r.one.string()) + " --view allreduce --screenshot " + shell_quote(ok.string())), r.dir / "ok.log") == 0);
  CHECK(load_png(ok).share_near(89, 90, 92, 8) < 0.05);
}
