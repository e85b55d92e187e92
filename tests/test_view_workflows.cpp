// Window tests of the app's workflows on real recorded runs (short CPU trainings by wb-train, synthetic
// data, 32x32): "Run with these splits" end to end (wb-train re-runs with the run's config and the new
// split as a child process; the new run opens with predicted against measured; errors land in the
// popup), a second run's lanes in the Timeline and its deltas in Ops, and a stored comparison reopened
// from the run file after its reference was deleted. Under xvfb-run when there is no display.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/reader.hpp"
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

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs a shell command with stdout and stderr into their own files; returns the exit status.
int run(const std::string& cmd, const fs::path& out, const fs::path& err) {
  int rc = std::system((cmd + " > " + shell_quote(out.string()) + " 2> " + shell_quote(err.string())).c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

std::string with_display(const std::string& cmd) {
  const char* d = std::getenv("DISPLAY");
  if (d && *d) return cmd;
  return "xvfb-run -a -s '-screen 0 1920x1080x24' " + cmd;
}

// "key value" lines of --print-tuner / --print-precision.
std::map<std::string, std::string> report_lines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    // Keys are one or two words ("predicted step_ms"); the value is the last field.
    auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return out;
}

// The recorded runs, made once for every test case of this executable: a 2-rank profiled run for the
// tuner and the timeline, and two single-rank runs with step 0 dumped (different seeds, so the
// comparison has a first divergence).
struct Runs {
  wb::test::TempDir dir;
  fs::path two, a, b;
  Runs() {
    two = dir / "two.sqlite";
    a = dir / "a.sqlite";
    b = dir / "b.sqlite";
    const std::string train = kBin + "wb-train --data synthetic --image-size 32 --data-workers 1 ";
    REQUIRE(run(train + "--nproc 2 --steps 6 --batch-size 8 --run " + shell_quote(two.string()), dir / "two.out", dir / "two.err") == 0);
    REQUIRE(run(train + "--steps 2 --batch-size 4 --dump-step 0 --run " + shell_quote(a.string()), dir / "a.out", dir / "a.err") == 0);
    REQUIRE(run(train + "--steps 2 --batch-size 4 --dump-step 0 --seed 7 --run " + shell_quote(b.string()), dir / "b.out", dir / "b.err") == 0);
  }
  // wb-view with a display; the child runs of the tuner go to this directory (TMPDIR).
  int view(const std::string& args, const std::string& name, const std::string& env = "") {
    std::string cmd = "env TMPDIR=" + shell_quote(dir.path().string()) + " " + env + " " + kBin + "wb-view " + args;
    return run(with_display(cmd), dir / (name + ".out"), dir / (name + ".err"));
  }
  std::string out(const std::string& name) { return slurp(dir / (name + ".out")); }
  std::string err(const std::string& name) { return slurp(dir / (name + ".err")); }
};

Runs& runs() {
  static Runs r;
  return r;
}

double number(const std::map<std::string, std::string>& kv, const std::string& key) {
  auto it = kv.find(key);
  if (it == kv.end()) FAIL("no line '" << key << "'");
  return std::stod(it->second);
}

}  // namespace

TEST_CASE("Run with these splits re-runs wb-train and sets predicted against measured", "[app]") {
  Runs& r = runs();
  const fs::path plain = r.dir / "tuner-plain.png", shot = r.dir / "tuner-run.png";
  REQUIRE(r.view(shell_quote(r.two.string()) + " --view allreduce --print-tuner --size 1400x860 --screenshot " + shell_quote(plain.string()), "plain") == 0);
  auto before = report_lines(r.out("plain"));
  CHECK(before.count("measured step_ms") == 0);  // no re-run yet

  const int rc = r.view(shell_quote(r.two.string()) + " --tuner-splits 40,120 --tuner-run --print-tuner --size 1400x860 --screenshot " +
                            shell_quote(shot.string()),
                        "rerun");
  CAPTURE(r.out("rerun"), r.err("rerun"));
  REQUIRE(rc == 0);
  auto kv = report_lines(r.out("rerun"));
  // The child's run: written, complete, with the split given and the parent's ranks and data settings.
  REQUIRE(kv.count("child_run"));
  const fs::path child = kv["child_run"];
  REQUIRE(fs::exists(child));
  CHECK(child.parent_path().parent_path() == r.dir.path());  // under TMPDIR
  CHECK(kv["child_split"] == "40,120");
  CHECK(kv["split"] == "40,120");  // the new run's own split, read back from it
  {
    wb::store::Reader child_run(child), parent(r.two);
    CHECK(child_run.complete());
    CHECK(child_run.world_size() == 2);
    auto cc = child_run.config(), pc = parent.config();
    CHECK(cc["allreduce_split"] == nlohmann::json({40, 120}));
    for (const char* key : {"data", "data_path", "image_size", "batch_size", "steps", "seed", "data_workers"}) {
      CAPTURE(key);
      CHECK(cc[key] == pc[key]);
    }
    CHECK(child_run.steps().size() == parent.steps().size());
  }
  for (const char* key : {"predicted step_ms", "measured step_ms", "predicted exposed_ms", "measured exposed_ms"}) {
    CAPTURE(key);
    const double v = number(kv, key);
    CHECK(std::isfinite(v));
    if (std::string(key).find("step") != std::string::npos) CHECK(v > 0.0);
    else CHECK(v >= 0.0);
  }
  // The prediction is for the split that ran, not the run's own.
  CHECK(number(kv, "predicted step_ms") != number(before, "predicted step_ms"));
  // The screenshot waited for the child and the new run: it is newer than the child's file, and shows
  // more than the plain tuner (the predicted-vs-measured table of another run).
  CHECK(fs::last_write_time(shot) >= fs::last_write_time(child));
  Image a = load_png(plain), b = load_png(shot);
  CHECK(b.distinct() >= 200);
  CHECK(differing_fraction(a, b) > 0.01);
}

TEST_CASE("a re-run that cannot start or fails shows the error popup", "[app]") {
  Runs& r = runs();
  struct Case {
    std::string bin, expect;
  };
  for (const Case& c : {Case{"/no/such/wb-train", "wb-train not found: /no/such/wb-train"}, Case{"/bin/false", "wb-train exited with status 1"}}) {
    CAPTURE(c.bin);
    const fs::path png = r.dir / "tuner-error.png";
    const int rc = r.view(shell_quote(r.two.string()) + " --tuner-run --screenshot " + shell_quote(png.string()), "tuner-error", "WB_TRAIN_BIN=" + c.bin);
    CHECK(rc == 2);
    CAPTURE(r.err("tuner-error"));
    CHECK(r.err("tuner-error").find(c.expect) != std::string::npos);
    CHECK(load_png(png).reds() > 40);  // the popup's red title
  }
  // A bad split is refused before anything starts.
  REQUIRE(r.view(shell_quote(r.two.string()) + " --tuner-splits 40,400 --tuner-run --screenshot " + shell_quote((r.dir / "bad-split.png").string()), "bad-split") == 2);
  CHECK(r.err("bad-split").find("--tuner-splits 40,400: expected ascending split points in [1, 160]") != std::string::npos);
}

TEST_CASE("Try the best candidates runs wb tune-split on the run and reopens it with the measured trials", "[app]") {
  Runs& r = runs();
  const fs::path run = r.dir / "try.sqlite", shot = r.dir / "tuner-try.png";
  fs::copy_file(r.two, run, fs::copy_options::overwrite_existing);  // tune-split records into the file
  const std::size_t before = wb::store::Reader(run).split_trials().size();
  const int rc = r.view(shell_quote(run.string()) + " --view allreduce --tuner-try 1,1,2 --print-tuner --size 1400x860 --screenshot " +
                            shell_quote(shot.string()),
                        "try");
  CAPTURE(r.out("try"), r.err("try"));
  REQUIRE(rc == 0);
  // The current split and one candidate, one round each: two trials more, in the file and in the reopened run.
  const std::size_t after = wb::store::Reader(run).split_trials().size();
  CHECK(after == before + 2);
  auto kv = report_lines(r.out("try"));
  CHECK(kv["trials"] == std::to_string(after));
  CHECK(load_png(shot).distinct() >= 200);

  // wb tune-split that cannot start, or fails: the popup says so, and the file is as it was.
  for (const std::string& bin : {std::string("/no/such/wb"), std::string("/bin/false")}) {
    CAPTURE(bin);
    const int bad = r.view(shell_quote(run.string()) + " --view allreduce --tuner-try 1,1,2 --screenshot " +
                               shell_quote((r.dir / "try-bad.png").string()),
                           "try-bad", "WB_BIN=" + bin);
    CHECK(bad == 2);
    CAPTURE(r.err("try-bad"));
    CHECK(r.err("try-bad").find(bin == "/bin/false" ? "wb tune-split exited with status 1" : "/no/such/wb") != std::string::npos);
    CHECK(wb::store::Reader(run).split_trials().size() == after);
  }
  CHECK(r.view(shell_quote(run.string()) + " --tuner-try 1,1 --screenshot " + shell_quote((r.dir / "x.png").string()), "try-usage") == 2);
  CHECK(r.err("try-usage").find("--tuner-try 1,1: expected candidates,rounds,steps") != std::string::npos);
}

TEST_CASE("a split handle dragged with injected mouse input moves the split in the window", "[app]") {
  Runs& r = runs();
  // Drag the handle at 160 to 150 in the window; the figures must be those of the split set directly.
  REQUIRE(r.view(shell_quote(r.two.string()) + " --tuner-splits 85,160 --tuner-drag 160:150 --print-tuner --screenshot " +
                     shell_quote((r.dir / "drag.png").string()),
                 "drag") == 0);
  REQUIRE(r.view(shell_quote(r.two.string()) + " --view allreduce --tuner-splits 85,150 --print-tuner --screenshot " +
                     shell_quote((r.dir / "direct.png").string()),
                 "direct") == 0);
  REQUIRE(r.view(shell_quote(r.two.string()) + " --view allreduce --tuner-splits 85,160 --print-tuner --screenshot " +
                     shell_quote((r.dir / "undragged.png").string()),
                 "undragged") == 0);
  auto dragged = report_lines(r.out("drag")), direct = report_lines(r.out("direct")), undragged = report_lines(r.out("undragged"));
  CAPTURE(r.out("drag"), r.out("direct"), r.out("undragged"));
  CHECK(undragged["split"] == "85,160");
  CHECK(dragged["split"] == "85,150");
  CHECK(dragged["predicted step_ms"] == direct["predicted step_ms"]);
  CHECK(dragged["predicted exposed_ms"] == direct["predicted exposed_ms"]);
  CHECK(number(dragged, "predicted step_ms") > 0.0);
  // Where the handle is drawn changed too.
  CHECK(differing_fraction(load_png(r.dir / "drag.png"), load_png(r.dir / "undragged.png")) > 0.001);
}

TEST_CASE("a second run shows in the timeline and as deltas in ops", "[app]") {
  Runs& r = runs();
  for (const char* v : {"timeline", "ops"}) {
    CAPTURE(v);
    const fs::path one = r.dir / (std::string(v) + "-alone.png"), both = r.dir / (std::string(v) + "-compare.png");
    REQUIRE(r.view(shell_quote(r.two.string()) + " --view " + v + " --screenshot " + shell_quote(one.string()), "alone") == 0);
    REQUIRE(r.view(shell_quote(r.two.string()) + " --compare " + shell_quote(r.a.string()) + " --view " + v + " --screenshot " + shell_quote(both.string()),
                   "compare") == 0);
    Image x = load_png(one), y = load_png(both);
    CHECK(y.distinct() >= 200);
    CHECK(differing_fraction(x, y) > 0.02);
  }
}

TEST_CASE("a stored comparison reopens from the run file after its reference is gone", "[app]") {
  Runs& r = runs();
  const fs::path json = r.dir / "compare.json";
  // wb compare saves the result into the first run file; different seeds make it fail (exit 1).
  REQUIRE(run(kBin + "wb compare " + shell_quote(r.a.string()) + " " + shell_quote(r.b.string()) + " --json " + shell_quote(json.string()), r.dir / "cmp.out",
              r.dir / "cmp.err") == 1);
  CHECK(slurp(r.dir / "cmp.err").find("saved as comparison 1") != std::string::npos);
  auto expected = nlohmann::json::parse(slurp(json));
  REQUIRE(expected["first_divergence"].is_object());
  const std::string first = expected["first_divergence"]["name"];
  CHECK(slurp(r.dir / "cmp.out").find(first) != std::string::npos);

  auto check = [&](const std::string& name, const char* tensors) {
    auto kv = report_lines(r.out(name));
    CAPTURE(r.out(name), r.err(name));
    CHECK(kv["comparison"] == "1");
    CHECK(std::stoll(kv["passed"]) == expected["summary"]["passed"].get<long long>());
    CHECK(std::stoll(kv["failed"]) == expected["summary"]["failed"].get<long long>());
    CHECK(std::stoll(kv["missing_a"]) == expected["summary"]["missing_a"].get<long long>());
    CHECK(std::stoll(kv["missing_b"]) == expected["summary"]["missing_b"].get<long long>());
    CHECK(std::stoull(kv["rows"]) == expected["rows"].size());
    CHECK(kv["first_divergence"] == first);
    CHECK(kv["tensors"] == tensors);
  };
  const fs::path with_ref = r.dir / "stored-with-ref.png", without = r.dir / "stored-without-ref.png";
  REQUIRE(r.view(shell_quote(r.a.string()) + " --comparison 1 --print-precision --screenshot " + shell_quote(with_ref.string()), "stored1") == 0);
  check("stored1", "loaded");
  fs::remove(r.b);
  REQUIRE_FALSE(fs::exists(r.b));
  REQUIRE(r.view(shell_quote(r.a.string()) + " --comparison 1 --print-precision --screenshot " + shell_quote(without.string()), "stored2") == 0);
  check("stored2", "absent");
  Image x = load_png(with_ref), y = load_png(without);
  CHECK(y.distinct() >= 200);
  CHECK(y.reds() > 40);  // failing verdicts and the first divergence are red, as before
  // The detail plots give way to the note; the table and first divergence stay.
  CHECK(differing_fraction(x, y) > 0.01);
  CHECK(differing_fraction(x, y) < 0.6);

  REQUIRE(r.view(shell_quote(r.a.string()) + " --comparison 9 --screenshot " + shell_quote((r.dir / "no-such.png").string()), "stored9") == 2);
  CHECK(r.err("stored9").find("no stored comparison 9 (it holds 1)") != std::string::npos);
}
