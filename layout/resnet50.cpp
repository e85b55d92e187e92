#include "layout/resnet50.hpp"

#include <stdexcept>
#include <unordered_map>

namespace wb::layout {

namespace {

struct Tables {
  std::vector<Module> modules;
  std::vector<Conv> convs;
  std::unordered_map<std::string, int> ids;
};

Tables make_tables() {
  Tables t;
  auto add = [&](std::string name, ModuleKind kind, int stage, int block, int unit, Part part = Part::none) {
    t.ids.emplace(name, static_cast<int>(t.modules.size()));
    t.modules.push_back({std::move(name), kind, stage, block, unit, -1, part});
    return static_cast<int>(t.modules.size()) - 1;
  };
  auto add_conv = [&](std::string name, int stage, int block, int unit, Part part, std::int64_t in, std::int64_t out,
                      int k, int stride, int pad) {
    const int id = add(std::move(name), ModuleKind::conv, stage, block, unit, part);
    t.modules[static_cast<std::size_t>(id)].conv = static_cast<int>(t.convs.size());
    t.convs.push_back({id, in, out, k, stride, pad});
  };
  add_conv("conv1", -1, -1, 0, Part::none, 3, kStemWidth, 7, 2, 3);
  add("bn1", ModuleKind::batch_norm, -1, -1, 0);
  add("relu", ModuleKind::relu, -1, -1, 0);
  add("maxpool", ModuleKind::maxpool, -1, -1, 0);
  std::int64_t in = kStemWidth;
  int unit = 1;
  for (int s = 0; s < kStages; ++s) {
    const std::int64_t width = kStageWidth[static_cast<std::size_t>(s)], out = width * kExpansion;
    for (int b = 0; b < kBlocksPerStage[static_cast<std::size_t>(s)]; ++b, ++unit) {
      const std::string p = block_name(s, b);
      const int stride = (b == 0 && s > 0) ? 2 : 1;  // v1.5: the stride sits on the 3x3
      add_conv(p + ".conv1", s, b, unit, Part::conv1, in, width, 1, 1, 0);
      add(p + ".bn1", ModuleKind::batch_norm, s, b, unit, Part::bn1);
      add(p + ".relu", ModuleKind::relu, s, b, unit, Part::relu);
      add_conv(p + ".conv2", s, b, unit, Part::conv2, width, width, 3, stride, 1);
      add(p + ".bn2", ModuleKind::batch_norm, s, b, unit, Part::bn2);
      add_conv(p + ".conv3", s, b, unit, Part::conv3, width, out, 1, 1, 0);
      add(p + ".bn3", ModuleKind::batch_norm, s, b, unit, Part::bn3);
      if (b == 0) {
        add_conv(p + ".downsample.0", s, b, unit, Part::downsample_conv, in, out, 1, stride, 0);
        add(p + ".downsample.1", ModuleKind::batch_norm, s, b, unit, Part::downsample_bn);
      }
      add(p, ModuleKind::block, s, b, unit, Part::block);
      in = out;
    }
  }
  add("avgpool", ModuleKind::avgpool, -1, -1, kUnits - 1);
  add("fc", ModuleKind::fc, -1, -1, kUnits - 1);
  add("loss", ModuleKind::loss, -1, -1, kUnits - 1);
  add("optimizer", ModuleKind::optimizer, -1, -1, -1);
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

// "12" -> 12; std::nullopt for anything but a short run of digits.
std::optional<int> small_number(std::string_view s) {
  if (s.empty() || s.size() > 4) return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

}  // namespace

const std::vector<Module>& modules() { return tables().modules; }

int module_id(std::string_view name) {
  const auto& ids = tables().ids;
  const auto it = ids.find(std::string(name));
  return it == ids.end() ? -1 : it->second;
}

int loss_module() { return static_cast<int>(modules().size()) - 2; }
int optimizer_module() { return static_cast<int>(modules().size()) - 1; }

bool is_batch_norm(int module) {
  return module >= 0 && module < static_cast<int>(modules().size()) &&
         modules()[static_cast<std::size_t>(module)].kind == ModuleKind::batch_norm;
}

std::string block_name(int stage, int index) {
  return "layer" + std::to_string(stage + 1) + "." + std::to_string(index);
}

BlockPlace block_place(int block) {
  int b = block;
  for (int s = 0; s < kStages; ++s) {
    if (b < kBlocksPerStage[static_cast<std::size_t>(s)]) return {s, b};
    b -= kBlocksPerStage[static_cast<std::size_t>(s)];
  }
  throw std::out_of_range("layout: block " + std::to_string(block) + " is not one of ResNet-50's 16");
}

std::string unit_name(int unit) {
  if (unit == 0) return "head";
  if (unit == kUnits - 1) return "fc";
  if (unit < 0 || unit >= kUnits) return "";
  const BlockPlace p = block_place(unit - 1);
  return block_name(p.stage, p.index);
}

int unit_of_module(std::string_view name) {
  const int id = module_id(name);
  return id < 0 ? -1 : modules()[static_cast<std::size_t>(id)].unit;
}

std::optional<BlockName> parse_block_name(std::string_view name) {
  if (name.size() < 8 || name.substr(0, 5) != "layer" || name[6] != '.') return std::nullopt;
  const auto stage = small_number(name.substr(5, 1));
  if (!stage || *stage < 1 || *stage > kStages) return std::nullopt;
  const std::string_view tail = name.substr(7);
  const std::size_t dot = tail.find('.');
  const auto index = small_number(tail.substr(0, dot));
  if (!index) return std::nullopt;
  return BlockName{*stage - 1, *index, dot == std::string_view::npos ? std::string() : std::string(tail.substr(dot + 1))};
}

const std::vector<Conv>& convs() { return tables().convs; }

std::vector<Param> params(std::int64_t classes, int width_div) {
  std::vector<Param> out;
  std::int64_t features = 0;
  for (const Module& m : modules()) {
    if (m.kind == ModuleKind::conv) {
      const Conv& c = convs()[static_cast<std::size_t>(m.conv)];
      const std::int64_t in = c.in == 3 ? 3 : c.in / width_div;
      out.push_back({m.name + ".weight", ParamKind::conv_weight, module_id(m.name),
                     {c.out / width_div, in, c.kernel, c.kernel}});
      features = c.out / width_div;
    } else if (m.kind == ModuleKind::batch_norm) {
      const int id = module_id(m.name);
      out.push_back({m.name + ".weight", ParamKind::bn_weight, id, {features}});
      out.push_back({m.name + ".bias", ParamKind::bn_bias, id, {features}});
    } else if (m.kind == ModuleKind::fc) {
      const std::int64_t width = kStageWidth[kStages - 1] * kExpansion / width_div;
      const int id = module_id(m.name);
      out.push_back({"fc.weight", ParamKind::fc_weight, id, {classes, width}});
      out.push_back({"fc.bias", ParamKind::fc_bias, id, {classes}});
    }
  }
  return out;
}

std::vector<Buffer> buffers(int width_div) {
  std::vector<Buffer> out;
  for (const Param& p : params(1, width_div)) {
    if (p.kind != ParamKind::bn_weight) continue;
    const std::string bn = p.name.substr(0, p.name.size() - std::string_view(".weight").size());
    out.push_back({bn + ".running_mean", p.module, false, p.shape});
    out.push_back({bn + ".running_var", p.module, false, p.shape});
    out.push_back({bn + ".num_batches_tracked", p.module, true, {}});
  }
  return out;
}

std::int64_t conv_out(std::int64_t size, int kernel, int stride, int pad) {
  return (size + 2 * pad - kernel) / stride + 1;
}

std::vector<Activation> activations(std::int64_t batch, std::int64_t image, std::int64_t classes, int width_div) {
  std::vector<Activation> out;
  std::int64_t h = image, c = 3;
  std::int64_t block_in_h = image;  // the spatial size entering the current block
  for (const Module& m : modules()) {
    const int id = module_id(m.name);
    switch (m.kind) {
      case ModuleKind::conv: {
        const Conv& k = convs()[static_cast<std::size_t>(m.conv)];
        // A block's first conv and its downsample read the block's input; the others read what precedes them.
        const bool reads_block_input = m.part == Part::conv1 || m.part == Part::downsample_conv;
        if (m.part == Part::conv1) block_in_h = h;
        const std::int64_t from = reads_block_input ? block_in_h : h;
        h = conv_out(from, k.kernel, k.stride, k.pad);
        c = k.out / width_div;
        out.push_back({id, {batch, c, h, h}});
        break;
      }
      case ModuleKind::maxpool:
        h = conv_out(h, 3, 2, 1);
        out.push_back({id, {batch, c, h, h}});
        break;
      case ModuleKind::batch_norm:
      case ModuleKind::relu:
      case ModuleKind::block:
        out.push_back({id, {batch, c, h, h}});
        break;
      case ModuleKind::avgpool:
        out.push_back({id, {batch, c, 1, 1}});
        break;
      case ModuleKind::fc:
        out.push_back({id, {batch, classes}});
        break;
      case ModuleKind::loss:
      case ModuleKind::optimizer:
        break;
    }
  }
  return out;
}

std::vector<std::int64_t> unit_output_shape(int unit, std::int64_t n, std::int64_t image) {
  if (unit < 0 || unit >= kUnits - 1) {
    throw std::out_of_range("layout: unit " + std::to_string(unit) + " has no activation output (the tail's is the loss)");
  }
  const std::string last = unit == 0 ? "maxpool" : unit_name(unit);
  for (const Activation& a : activations(n, image, 1)) {
    if (modules()[static_cast<std::size_t>(a.module)].name == last) return a.shape;
  }
  throw std::logic_error("layout: no activation for unit " + std::to_string(unit));
}

std::optional<std::int64_t> forward_rank(std::string_view name) {
  std::vector<std::string_view> parts = split_dots(name);
  // A trailing parameter or buffer name orders within its module.
  constexpr std::array<std::string_view, 5> kLeaves = {"weight", "bias", "running_mean", "running_var",
                                                       "num_batches_tracked"};
  std::int64_t leaf = 0;
  for (std::size_t i = 0; i < kLeaves.size(); ++i) {
    if (parts.size() > 1 && parts.back() == kLeaves[i]) {
      leaf = static_cast<std::int64_t>(i) + 1;
      parts.pop_back();
      break;
    }
  }
  // Module position: stem 0..3, layer L block B sub-module s at 100 + 1000 L + 40 B + s, then avgpool, fc.
  auto at = [&](std::int64_t module) { return std::optional<std::int64_t>(module * 8 + leaf); };
  if (parts.size() == 1) {
    constexpr std::array<std::string_view, 4> kStem = {"conv1", "bn1", "relu", "maxpool"};
    for (std::size_t i = 0; i < kStem.size(); ++i) {
      if (parts[0] == kStem[i]) return at(static_cast<std::int64_t>(i));
    }
    if (parts[0] == "avgpool") return at(10000);
    if (parts[0] == "fc") return at(10001);
    return std::nullopt;
  }
  if (parts[0].size() != 6 || parts[0].substr(0, 5) != "layer") return std::nullopt;
  const auto layer = small_number(parts[0].substr(5));
  const auto block = small_number(parts[1]);
  if (!layer || !block || *layer < 1 || *layer > 4 || *block > 20) return std::nullopt;
  const std::int64_t base = 100 + 1000 * *layer + 40 * *block;
  if (parts.size() == 2) return at(base + 12);  // the block's own output
  const std::string_view sub = parts[2];
  int index = -1;  // the ".N" of downsample.N and relu.N; -1 when there is none
  if (parts.size() > 4) return std::nullopt;
  if (parts.size() == 4) {
    const auto n = small_number(parts[3]);
    if (!n) return std::nullopt;
    index = *n;
  }
  if (sub == "conv1" && parts.size() == 3) return at(base + 0);
  if (sub == "bn1" && parts.size() == 3) return at(base + 1);
  if (sub == "conv2" && parts.size() == 3) return at(base + 3);
  if (sub == "bn2" && parts.size() == 3) return at(base + 4);
  if (sub == "conv3" && parts.size() == 3) return at(base + 6);
  if (sub == "bn3" && parts.size() == 3) return at(base + 7);
  if (sub == "downsample" && (index == 0 || index == 1)) return at(base + 8 + index);
  if (sub == "relu") {
    if (index == -1) return at(base + 10);  // one hook on the block's relu module: its last call
    if (index == 0) return at(base + 2);
    if (index == 1) return at(base + 5);
    if (index == 2) return at(base + 10);
  }
  return std::nullopt;
}

std::string module_of_output(std::string_view dump_name) {
  constexpr std::string_view kLastCall = ".relu.2";
  if (dump_name.size() > kLastCall.size() && dump_name.substr(dump_name.size() - kLastCall.size()) == kLastCall) {
    dump_name.remove_suffix(2);
  }
  return std::string(dump_name);
}

NameKind kind_of_name(std::string_view name) {
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (name == "loss") return NameKind::loss;
  if (name == "optimizer") return NameKind::optimizer;
  if (ends("downsample.0")) return NameKind::conv;
  if (ends("downsample.1")) return NameKind::batch_norm;
  const std::size_t dot = name.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? name : name.substr(dot + 1);
  if (last.substr(0, 4) == "conv") return NameKind::conv;
  if (last.substr(0, 2) == "bn") return NameKind::batch_norm;
  if (last == "relu") return NameKind::relu;
  if (last == "maxpool") return NameKind::maxpool;
  if (last == "avgpool") return NameKind::avgpool;
  if (last == "fc") return NameKind::fc;
  // "layer2.0": a block (two components, the first layerN)
  if (name.substr(0, 5) == "layer" && dot != std::string_view::npos && name.find('.') == dot) return NameKind::block;
  return NameKind::other;
}

}  // namespace wb::layout
