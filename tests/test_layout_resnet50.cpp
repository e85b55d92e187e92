// ResNet-50's layout (layout/resnet50) against torchvision's own resnet50, the independent reference:
// its state_dict (names, shapes and order of parameters and buffers) and the output shapes its modules
// produce (forward hooks) at two input sizes; and the lookups the rest of wb uses instead of parsing
// names (module ids, pipeline units, block names from other frameworks' text).
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "layout/resnet50.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"

namespace L = wb::layout;

namespace {

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out;
  for (auto d : s) {
    if (!out.empty()) out += 'x';
    out += std::to_string(d);
  }
  return out;
}

// Lines "name shape" from torchvision: the state_dict in order, then "act <module> <shape>" per hooked
// module output, for a 10-class model on a batch of 2 at `image`.
std::vector<std::string> torchvision_lines(int image) {
  wb::test::TempDir dir;
  const std::string script =
      "import sys, torch, torchvision\n"
      "m = torchvision.models.resnet50(num_classes=10).eval()\n"
      "for k, v in m.state_dict().items():\n"
      "    print(k, 'x'.join(str(d) for d in v.shape))\n"
      "def hook(name):\n"
      "    return lambda mod, i, o: print('act', name, 'x'.join(str(d) for d in o.shape))\n"
      "for name, mod in m.named_modules():\n"
      "    if name and not isinstance(mod, (torch.nn.ReLU, torch.nn.Sequential)):\n"
      "        mod.register_forward_hook(hook(name))\n"
      "with torch.no_grad():\n"
      "    m(torch.zeros(2, 3, " + std::to_string(image) + ", " + std::to_string(image) + "))\n";
  const auto r = wb::test::run_python_script(dir, "tv.py", script);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) {
    if (l.size() > 1 && l.back() == ' ') l.pop_back();  // a 0-d tensor's empty shape
    lines.push_back(l);
  }
  return lines;
}

}  // namespace

TEST_CASE("the layout's parameters and buffers are torchvision's state_dict, in its order", "[layout][torch]") {
  std::vector<std::string> ours;
  const auto params = L::params(10);
  const auto buffers = L::buffers();
  std::size_t b = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    ours.push_back(params[i].name + " " + shape_text(params[i].shape));
    // A batch norm's buffers follow its bias.
    if (params[i].kind == L::ParamKind::bn_bias) {
      for (int k = 0; k < 3; ++k, ++b) {
        std::string line = buffers[b].name;  // a 0-d buffer has no shape text
        if (!buffers[b].shape.empty()) {
          line += ' ';
          line += shape_text(buffers[b].shape);
        }
        ours.push_back(line);
      }
    }
  }
  CHECK(b == buffers.size());
  CHECK(params.size() == static_cast<std::size_t>(L::kParamTensors));
  std::vector<std::string> theirs;
  for (const auto& l : torchvision_lines(64)) {
    if (l.rfind("act ", 0) != 0) theirs.push_back(l);
  }
  CHECK(ours == theirs);
  std::int64_t count = 0;
  for (const auto& p : L::params(1000)) {
    std::int64_t n = 1;
    for (auto d : p.shape) n *= d;
    count += n;
  }
  CHECK(count == 25557032);  // torchvision's published parameter count for resnet50
}

TEST_CASE("the layout's activation shapes are what torchvision's modules output", "[layout][torch]") {
  for (int image : {64, 224}) {
    CAPTURE(image);
    std::vector<std::string> theirs;
    for (const auto& l : torchvision_lines(image)) {
      if (l.rfind("act ", 0) == 0) theirs.push_back(l.substr(4));
    }
    std::vector<std::string> ours;
    for (const auto& a : L::activations(2, image, 10)) {
      const L::Module& m = L::modules()[static_cast<std::size_t>(a.module)];
      if (m.kind == L::ModuleKind::relu) continue;  // torchvision reuses one ReLU module per block
      ours.push_back(m.name + " " + shape_text(a.shape));
    }
    // torchvision's hooks fire as each module finishes: a block after its downsample; the same order.
    CHECK(ours == theirs);
  }
}

TEST_CASE("module ids, units and block names", "[layout]") {
  const auto& mods = L::modules();
  CHECK(mods.size() == 4 + 16 * 8 + 4 * 2 + 4);
  CHECK(L::module_id("conv1") == 0);
  CHECK(mods[static_cast<std::size_t>(L::module_id("layer2.0.conv2"))].kind == L::ModuleKind::conv);
  CHECK(L::module_id("layer2.0.conv9") == -1);
  CHECK(L::loss_module() == L::module_id("loss"));
  CHECK(L::optimizer_module() == static_cast<int>(mods.size()) - 1);
  CHECK(L::is_batch_norm(L::module_id("layer3.0.downsample.1")));
  CHECK_FALSE(L::is_batch_norm(L::module_id("layer3.0.downsample.0")));
  int bns = 0;
  for (std::size_t i = 0; i < mods.size(); ++i) bns += L::is_batch_norm(static_cast<int>(i));
  CHECK(bns == 53);
  CHECK(L::unit_name(0) == "head");
  CHECK(L::unit_name(1) == "layer1.0");
  CHECK(L::unit_name(8) == "layer3.0");
  CHECK(L::unit_name(16) == "layer4.2");
  CHECK(L::unit_name(17) == "fc");
  CHECK(L::unit_name(18).empty());
  CHECK(L::unit_of_module("maxpool") == 0);
  CHECK(L::unit_of_module("layer3.0.downsample.1") == 8);
  CHECK(L::unit_of_module("layer3.0") == 8);
  CHECK(L::unit_of_module("loss") == 17);
  CHECK(L::unit_of_module("layer9.0") == -1);
  CHECK(L::unit_output_shape(0, 2, 224) == std::vector<std::int64_t>{2, 64, 56, 56});
  CHECK(L::unit_output_shape(16, 2, 224) == std::vector<std::int64_t>{2, 2048, 7, 7});
  CHECK_THROWS(L::unit_output_shape(17, 2, 224));
  const auto p = L::parse_block_name("layer3.12.conv2");
  REQUIRE(p);
  CHECK(p->stage == 2);
  CHECK(p->index == 12);
  CHECK(p->rest == "conv2");
  CHECK(L::parse_block_name("layer1.0")->rest.empty());
  CHECK(L::module_of_output("layer1.0.relu.2") == "layer1.0.relu");
  CHECK(L::module_of_output("layer1.0.relu.1") == "layer1.0.relu.1");
  CHECK(L::module_of_output("layer2.0.conv2") == "layer2.0.conv2");
  CHECK(L::kind_of_name("layer2.0.downsample.1") == L::NameKind::batch_norm);
  CHECK(L::kind_of_name("layer2.0") == L::NameKind::block);
  CHECK(L::kind_of_name("aten::conv2d") == L::NameKind::other);
  for (const char* bad : {"layer5.0.conv1", "layer0.1", "layerx.1", "layer1.", "layer1.a.conv1", "conv1", "layer12.0"}) {
    CAPTURE(bad);
    CHECK_FALSE(L::parse_block_name(bad));
  }
}
