// The PyTorch side of the step comparison (compare/reference/*.py), driven from CTest: each Python test
// script checks torch_step.py / wbdump.py / wbformat.py against an independent computation and exits
// non-zero on the first failed check. The C++ side then reads torch_step.py's output with the store's
// own safetensors reader, so the two implementations of the format are checked against each other.
#include <catch2/catch.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/tensor_file.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"
#include "support/peers.hpp"

namespace fs = std::filesystem;

namespace {

using wb::test::ProcessResult;
using wb::test::shell_quote;
using wb::test::TempDir;

// Runs compare/reference/tests/<script> --tmp DIR with the Python that has torch.
ProcessResult run_script(const std::string& script, const fs::path& tmp) {
  const fs::path path = fs::path(WB_SOURCE_DIR) / "compare" / "reference" / "tests" / script;
  ProcessResult result = wb::test::run_python(shell_quote(path.string()) + " --tmp " + shell_quote(tmp.string()));
  std::cout << script << ":\n" << result.output << std::flush;  // the figures, kept in the CTest log
  return result;
}

std::vector<std::string> expected_act_names() {
  std::vector<std::string> names = {"conv1", "bn1", "relu", "maxpool"};
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    for (int b = 0; b < blocks[stage]; ++b) {
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      for (const char* s : {".conv1", ".bn1", ".relu.0", ".conv2", ".bn2", ".relu.1", ".conv3", ".bn3"}) names.push_back(p + s);
      if (b == 0) {
        names.push_back(p + ".downsample.0");
        names.push_back(p + ".downsample.1");
      }
      names.push_back(p + ".relu.2");
      names.push_back(p);
    }
  }
  names.push_back("avgpool");
  names.push_back("fc");
  return names;
}

}  // namespace

TEST_CASE("wbformat.py writes and reads safetensors and run files", "[compare][python]") {
  TempDir tmp;
  const ProcessResult r = run_script("test_wbformat.py", tmp.path());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

TEST_CASE("torch_step.py replays a dumped step as an independent computation does", "[compare][python]") {
  TempDir tmp;
  const ProcessResult r = run_script("test_torch_step.py", tmp.path());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  // The store's reader accepts the file and sees the contract's keys, order and metadata.
  std::map<std::string, std::string> metadata;
  const std::vector<wb::store::HostTensor> tensors =
      wb::store::read_safetensors(tmp.path() / "torch_step_ref.safetensors", &metadata);
  // input, label, 161 params, 159 buffers, 174 acts, loss, 161 grads, 161 params after, 159 buffers
  // after, 161 momentum buffers.
  REQUIRE(tensors.size() == 1139);
  CHECK(metadata.at("wb.source") == "torch_step.py");
  const nlohmann::json order = nlohmann::json::parse(metadata.at("wb.exec_order"));
  REQUIRE(order.size() == tensors.size());
  std::map<std::string, const wb::store::HostTensor*> by_name;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    CAPTURE(tensors[i].name);
    CHECK(order.at(tensors[i].name).get<std::size_t>() == i);  // data order is execution order
    by_name[tensors[i].name] = &tensors[i];
  }
  std::vector<std::string> acts;
  for (const auto& t : tensors) {
    if (t.name.rfind("act.", 0) == 0) acts.push_back(t.name.substr(4));
  }
  CHECK(acts == expected_act_names());

  const auto& loss = *by_name.at("loss");
  CHECK(loss.dtype == wb::store::DType::F32);
  CHECK(loss.shape.empty());
  CHECK(by_name.at("label")->dtype == wb::store::DType::I32);
  CHECK(by_name.at("buffer_after.bn1.num_batches_tracked")->dtype == wb::store::DType::I64);
  CHECK(by_name.at("act.fc")->shape == std::vector<std::int64_t>{4, 10});
  CHECK(by_name.at("act.avgpool")->shape == std::vector<std::int64_t>{4, 2048, 1, 1});
  // A block's output is its last relu call, byte for byte.
  CHECK(by_name.at("act.layer4.2.relu.2")->data == by_name.at("act.layer4.2")->data);
}

TEST_CASE("wbdump.py in a training script dumps what torch_step.py replays", "[compare][python]") {
  TempDir tmp;
  const ProcessResult r = run_script("test_wbdump.py", tmp.path());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

TEST_CASE("torch_step.py rejects bad input with exit 2 and one line naming the file", "[compare][python]") {
  TempDir tmp;
  const ProcessResult r = run_script("test_errors.py", tmp.path());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}
