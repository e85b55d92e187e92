// Checkpoints of wb-train: 2 steps, --save, --resume and 1 more step must land on the same parameters,
// momentum and BN statistics as 3 straight steps (bit for bit: same data order, same kernels and thread
// count, and fp32 values stored exactly), and a checkpoint must load into torchvision's resnet50 with
// load_state_dict(strict=True).
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "store/reader.hpp"
#include "support/python.hpp"
#include "test_trainer_util.hpp"
#include "support/peers.hpp"

namespace {

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using wb::test::with;
using wb::test::Result;
using wb::test::run_train;
using wb::test::TempDir;
namespace fs = std::filesystem;

std::vector<std::string> common_args() {
  return {"--data", "synthetic", "--synthetic-samples", "256", "--batch-size", "4", "--image-size", "32",
          "--threads", "2", "--seed", "7", "--lr", "0.05"};
}

// The three runs, made once for every test case of this file.
struct Runs {
  TempDir dir;
  Result two, resumed, three;
  Runs() {
    two = run_train(with(common_args(), {"--steps", "2", "--run", (dir / "two.sqlite").string(), "--save",
                                         (dir / "two.safetensors").string()}));
    resumed = run_train(with(common_args(), {"--steps", "3", "--resume", (dir / "two.safetensors").string(), "--run",
                                             (dir / "resumed.sqlite").string(), "--save",
                                             (dir / "resumed.safetensors").string()}));
    three = run_train(with(common_args(), {"--steps", "3", "--run", (dir / "three.sqlite").string(), "--save",
                                           (dir / "three.safetensors").string()}));
  }
};

Runs& runs() {
  static Runs r;
  return r;
}

}  // namespace

TEST_CASE("wb-train: 2 steps, save, resume, 1 step == 3 straight steps, bit for bit", "[trainer]") {
  Runs& r = runs();
  CAPTURE(r.two.err, r.resumed.err, r.three.err);
  REQUIRE(r.two.exit_code == 0);
  REQUIRE(r.resumed.exit_code == 0);
  REQUIRE(r.three.exit_code == 0);

  auto two = wb::test::read_checkpoint(r.dir / "two.safetensors");
  auto resumed = wb::test::read_checkpoint(r.dir / "resumed.safetensors");
  auto three = wb::test::read_checkpoint(r.dir / "three.safetensors");
  // 161 parameters, 53 BN layers x 3 buffers, 161 momentum buffers.
  REQUIRE(three.size() == 161 + 53 * 3 + 161);

  // Everything: parameters, running statistics, num_batches_tracked and momentum.
  auto all = wb::test::diff_checkpoints(resumed, three, "");
  CAPTURE(all.differing, all.max_abs);
  CHECK(all.compared == static_cast<int>(three.size()));
  CHECK(all.differing == 0);
  CHECK(all.max_abs == 0.0);

  // The comparison can fail: the state after 2 steps differs from the state after 3 in every parameter
  // that training moves.
  auto moved = wb::test::diff_checkpoints(two, three, "momentum.", /*exclude_prefix=*/true);
  CAPTURE(moved.differing, moved.max_abs);
  CHECK(moved.differing > 150);
  CHECK(moved.max_abs > 1e-4);

  // The resumed run trained exactly step 2, on the same batch: its loss and LR equal the straight run's.
  wb::store::Reader resumed_run(r.dir / "resumed.sqlite");
  wb::store::Reader three_run(r.dir / "three.sqlite");
  auto resumed_steps = resumed_run.steps();
  auto three_steps = three_run.steps();
  REQUIRE(resumed_steps.size() == 1);
  REQUIRE(three_steps.size() == 3);
  CHECK(resumed_steps[0].step == 2);
  CHECK(resumed_steps[0].loss == three_steps[2].loss);
  CHECK(resumed_steps[0].lr == three_steps[2].lr);
  CHECK(resumed_run.complete());
  CHECK(resumed_run.meta().at("steps_done") == "3");
}

TEST_CASE("wb-train --resume with nothing left to train, or from a missing file, is bad input", "[trainer]") {
  Runs& r = runs();
  REQUIRE(r.two.exit_code == 0);
  TempDir dir;
  SECTION("the checkpoint already has the steps asked for") {
    Result res = run_train(with(common_args(), {"--steps", "2", "--resume", (r.dir / "two.safetensors").string(), "--run",
                                                (dir / "again.sqlite").string()}));
    CAPTURE(res.err);
    CHECK(res.exit_code == 2);
    CHECK(wb::test::count_lines(res.err) == 1);
    CHECK(res.err.find("--resume") != std::string::npos);
    CHECK(res.err.find("at step 2") != std::string::npos);
  }
  SECTION("the checkpoint file does not exist") {
    const std::string missing = (dir / "missing.safetensors").string();
    Result res = run_train(with(common_args(), {"--steps", "2", "--resume", missing, "--run",
                                                (dir / "again.sqlite").string()}));
    CAPTURE(res.err);
    CHECK(res.exit_code == 2);
    CHECK(wb::test::count_lines(res.err) == 1);
    CHECK(res.err.find(missing) != std::string::npos);
  }
}

TEST_CASE("a wb-train checkpoint loads into torchvision's resnet50 with strict=True", "[trainer]") {
  Runs& r = runs();
  REQUIRE(r.three.exit_code == 0);
  const fs::path ckpt = r.dir / "three.safetensors";
  // PyTorch side: wbformat.read_safetensors, momentum.* filtered, strict load, then the float64 sums of
  // the loaded state and one BN counter read back from the module.
  Result py = wb::test::run_python_script(
      r.dir, "load.py",
      "import sys\n"
      "sys.path.insert(0, sys.argv[1])\n"
      "import torch, torchvision\n"
      "from wbformat import read_safetensors\n"
      "tensors, meta = read_safetensors(sys.argv[2])\n"
      "sd = {k: torch.from_numpy(v.copy()) for k, v in tensors.items() if not k.startswith('momentum.')}\n"
      "m = torchvision.models.resnet50(num_classes=10)\n"
      "m.load_state_dict(sd, strict=True)\n"
      "params = sum(p.detach().double().sum().item() for p in m.parameters())\n"
      "means = sum(b.double().sum().item() for n, b in m.named_buffers() if n.endswith('running_mean'))\n"
      "print(len(sd), repr(params), repr(means), int(m.bn1.num_batches_tracked), meta.get('wb.sgd_steps'))\n",
      wb::test::shell_quote(std::string(WB_SOURCE_DIR) + "/compare/reference") + " " +
          wb::test::shell_quote(ckpt.string()));
  CAPTURE(py.out, py.err);
  REQUIRE(py.exit_code == 0);

  // The same sums on our side, from the file.
  auto ckpt_tensors = wb::test::read_checkpoint(ckpt);
  double params = 0.0, means = 0.0;
  for (const auto& [name, t] : ckpt_tensors) {
    if (t.dtype != wb::store::DType::F32 || name.rfind("momentum.", 0) == 0) continue;
    const bool is_mean = name.size() > 12 && name.compare(name.size() - 12, 12, "running_mean") == 0;
    const bool is_param = name.find("running_") == std::string::npos;
    const std::size_t n = t.data.size() / sizeof(float);
    for (std::size_t i = 0; i < n; ++i) {
      float v = 0.0f;
      std::memcpy(&v, t.data.data() + i * sizeof(float), sizeof(float));
      if (is_param) params += v;
      if (is_mean) means += v;
    }
  }
  std::istringstream in(py.out);
  std::size_t loaded = 0;
  double py_params = 0.0, py_means = 0.0;
  long long tracked = -1;
  std::string sgd_steps;
  in >> loaded >> py_params >> py_means >> tracked >> sgd_steps;
  CHECK(loaded == 161 + 53 * 3);
  CHECK_THAT(py_params, WithinRel(params, 1e-10));
  CHECK_THAT(py_means, WithinRel(means, 1e-10) || WithinAbs(means, 1e-9));
  CHECK(tracked == 3);
  CHECK(sgd_steps == "3");
}
