// wb-train on an image folder cut from a real photograph: a step dump compared with torch_step.py,
// which preprocesses the same files with torchvision, passes the input row bit for bit (and fails it
// when the recorded geometry is tampered with); bad images end the run with one line naming the file,
// or are counted with --skip-bad-images.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>

#include "support/python.hpp"
#include "test_trainer_util.hpp"
#include "support/peers.hpp"

using namespace wb::test;
namespace fs = std::filesystem;

namespace {

void make_folder(const fs::path& out, const std::string& args) {
  const auto r = run_python(shell_quote(std::string(WB_SOURCE_DIR) + "/scripts/make_imagefolder.py") + " " +
                            shell_quote(out.string()) + " " + args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

Result compare(const fs::path& run, const fs::path& ref) {
  return run_command(shell_quote(WB_CLI) + " compare " + shell_quote(run.string()) + " " + shell_quote(ref.string()) +
                     " --all");
}

}  // namespace

TEST_CASE("an image-folder step dump matches torchvision's preprocessing of the same files", "[trainer][imagefolder]") {
  TempDir dir;
  make_folder(dir.path() / "train", "--classes 3 --per-class 4 --size 70:300");
  const fs::path run = dir.path() / "run.sqlite";
  const auto r = run_train({"--data", "imagefolder", "--data-path", (dir.path() / "train").string(), "--transforms",
                            "torchvision-train", "--image-size", "64", "--batch-size", "3", "--steps", "1",
                            "--dump-step", "0", "--data-workers", "1", "--threads", "2", "--run", run.string()});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("12 images in 3 classes, transforms torchvision-train at 64x64") != std::string::npos);

  const fs::path ref = dir.path() / "ref.safetensors";
  const std::string torch_step = shell_quote(std::string(WB_SOURCE_DIR) + "/compare/reference/torch_step.py");
  auto t = run_python(torch_step + " " + shell_quote(run.string()) + " --out " + shell_quote(ref.string()) +
                      " --threads 2");
  INFO(t.output);
  REQUIRE(t.exit_code == 0);
  auto c = compare(run, ref);
  INFO(c.output);
  REQUIRE(c.exit_code == 0);
  // The input row: bit-identical (max abs 0) to torchvision's ToTensor + Normalize of PIL's pixels.
  REQUIRE(c.out.find("PASS    input                                         [3,3,64,64]        0.000e+00") !=
          std::string::npos);

  // Tampering with the recorded crop of one sample makes torchvision preprocess another region: the
  // input row fails, and it is the first divergence.
  const auto tamper = run_python_script(dir, "tamper.py", R"PY(
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rec = json.loads(db.execute("SELECT value FROM meta WHERE key = 'dump_input.rank0'").fetchone()[0])
rec["samples"][1]["crop"][1] += 1 if rec["samples"][1]["crop"][1] == 0 else -1
db.execute("UPDATE meta SET value = ? WHERE key = 'dump_input.rank0'", (json.dumps(rec),))
db.commit()
)PY", shell_quote(run.string()));
  INFO(tamper.output);
  REQUIRE(tamper.exit_code == 0);
  t = run_python(torch_step + " " + shell_quote(run.string()) + " --out " + shell_quote(ref.string()) + " --threads 2");
  REQUIRE(t.exit_code == 0);
  c = compare(run, ref);
  REQUIRE(c.exit_code == 1);
  REQUIRE(c.out.find("FAIL    input") != std::string::npos);
}

TEST_CASE("bad images: one line naming the file, or counted with --skip-bad-images", "[trainer][imagefolder]") {
  TempDir dir;
  make_folder(dir.path() / "set", "--classes 2 --per-class 4 --size 40:80 --broken");
  const std::vector<std::string> base = {"--data", "imagefolder", "--data-path", (dir.path() / "set").string(),
                                         "--image-size", "32", "--batch-size", "4", "--steps", "3",
                                         "--no-random-flip", "--data-workers", "1", "--threads", "1"};
  const auto r = run_train(with(base, {"--run", (dir.path() / "a.sqlite").string()}));
  require_one_line_error(r, {"set/class_00/broken_", ": corrupt or truncated"});

  const auto s = run_train(with(base, {"--skip-bad-images", "--run", (dir.path() / "b.sqlite").string()}));
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  REQUIRE(s.err.find("rank 0 skipped 5 bad image(s) (--skip-bad-images); the first: ") != std::string::npos);

  const auto e = run_train(with(base, {"--eval", "--run", (dir.path() / "c.sqlite").string()}));
  require_one_line_error(e, {"--eval", "--val-path"});
  fs::create_directories(dir.path() / "empty/only_class");
  const auto m = run_train({"--data", "imagefolder", "--data-path", (dir.path() / "empty").string(), "--steps", "1",
                            "--run", (dir.path() / "d.sqlite").string()});
  require_one_line_error(m, {"only_class: class folder without image files"});
}

TEST_CASE("evaluation on --val-path: top-1/top-5 recorded in the run and printed by wb report", "[trainer][imagefolder]") {
  TempDir dir;
  make_folder(dir.path() / "train", "--classes 3 --per-class 4 --size 40:120");
  make_folder(dir.path() / "val", "--classes 3 --per-class 3 --size 40:120 --seed 9");
  const fs::path run = dir.path() / "run.sqlite";
  const auto r = run_train({"--data", "imagefolder", "--data-path", (dir.path() / "train").string(), "--val-path",
                            (dir.path() / "val").string(), "--image-size", "32", "--batch-size", "3", "--steps", "2",
                            "--eval", "--num-classes", "3", "--threads", "1", "--data-workers", "1", "--run", run.string()});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // 9 validation images in batches of 3: all of them, with the eval recipe.
  REQUIRE(r.out.find("wb-train: eval on 9 validation images: top-1 ") != std::string::npos);
  const auto q = run_python_script(dir, "eval.py", R"PY(
import sqlite3, sys
for row in sqlite3.connect(sys.argv[1]).execute("SELECT step, top1, top5, images, seconds FROM evaluation"):
    print(*row)
)PY", shell_quote(run.string()));
  INFO(q.output);
  REQUIRE(q.exit_code == 0);
  double top1 = -1, top5 = -1, seconds = -1;
  int step = -1, images = -1;
  REQUIRE(std::sscanf(q.out.c_str(), "%d %lf %lf %d %lf", &step, &top1, &top5, &images, &seconds) == 5);
  REQUIRE(step == 2);
  REQUIRE(images == 9);
  // A 3-class model: every label is in the top 5, and top-1 is a multiple of 1/9.
  REQUIRE(top5 == Approx(100.0));
  REQUIRE(std::fmod(top1 * 9.0 / 100.0 + 1e-6, 1.0) < 1e-4);
  REQUIRE(seconds > 0.0);
  const auto rep = run_command(shell_quote(WB_CLI) + " report " + shell_quote(run.string()));
  REQUIRE(rep.exit_code == 0);
  REQUIRE(rep.out.find("Evaluation\n  after step   top-1    top-5  images   time") != std::string::npos);
  REQUIRE(rep.out.find("per image (one worker): ") != std::string::npos);
  REQUIRE(rep.out.find(" decode ") != std::string::npos);
}
