// The ResNet-50 layout the compare tests and benchmark build their dumps from matches torchvision:
// state_dict names, order and shapes, and every leaf module's output shape at 32x32.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "compare/test_support/resnet50_layout.hpp"
#include "support/files.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;

TEST_CASE("the ResNet-50 layout matches torchvision", "[compare]") {
  const wb::test::TempDir dir;
  const fs::path out = dir / "layout.json";
  const char* const script = R"PY(
import json, sys, torch, torchvision
m = torchvision.models.resnet50(num_classes=10)
state = []
params = {n for n, _ in m.named_parameters()}
for n, t in m.state_dict().items():
    state.append([("param." if n in params else "buffer.") + n, list(t.shape)])
acts = {}
order = []
def hook(name):
    def f(mod, i, o):
        if name not in acts: order.append(name)
        acts[name] = list(o.shape)
    return f
for n, mod in m.named_modules():
    if n and len(list(mod.children())) == 0:
        mod.register_forward_hook(hook(n))
with torch.no_grad():
    m(torch.zeros(2, 3, 32, 32))
json.dump({"state": state, "acts": [["act." + n, acts[n]] for n in order]}, open(sys.argv[1], "w"))
)PY";
  const wb::test::ProcessResult py =
      wb::test::run_python_script(dir, "layout.py", script, wb::test::shell_quote(out.string()));
  INFO(py.output);
  REQUIRE(py.exit_code == 0);
  const auto j = nlohmann::json::parse(wb::test::read_text(out));

  const auto state = wb::compare::testing::resnet50_state(10);
  REQUIRE(state.size() == j.at("state").size());
  for (std::size_t i = 0; i < state.size(); ++i) {
    CAPTURE(i);
    CHECK(state[i].key == j["state"][i][0].get<std::string>());
    CHECK(state[i].shape == j["state"][i][1].get<std::vector<std::int64_t>>());
  }
  // torchvision calls a block's relu three times; the hook keeps the last call, the block's output,
  // which is what the layout lists (at the block's end rather than at its first call).
  std::map<std::string, std::vector<std::int64_t>> torch_acts;
  for (const auto& a : j.at("acts")) torch_acts[a[0].get<std::string>()] = a[1].get<std::vector<std::int64_t>>();
  const auto acts = wb::compare::testing::resnet50_activations(2, 32, 10);
  CHECK(acts.size() == torch_acts.size());
  for (const auto& a : acts) {
    CAPTURE(a.key);
    REQUIRE(torch_acts.count(a.key) == 1);
    CHECK(a.shape == torch_acts[a.key]);
  }
}
