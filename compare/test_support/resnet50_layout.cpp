#include "compare/test_support/resnet50_layout.hpp"

#include <algorithm>

namespace wb::compare::testing {
namespace {

using Shape = std::vector<std::int64_t>;

std::int64_t conv_out(std::int64_t in, int k, int s, int p) { return (in + 2 * p - k) / s + 1; }

struct Builder {
  std::vector<LayoutEntry> state;
  void conv(const std::string& name, std::int64_t out, std::int64_t in, int k) {
    state.push_back({"param." + name + ".weight", {out, in, k, k}, store::DType::F32});
  }
  void bn(const std::string& name, std::int64_t c) {
    state.push_back({"param." + name + ".weight", {c}, store::DType::F32});
    state.push_back({"param." + name + ".bias", {c}, store::DType::F32});
    state.push_back({"buffer." + name + ".running_mean", {c}, store::DType::F32});
    state.push_back({"buffer." + name + ".running_var", {c}, store::DType::F32});
    state.push_back({"buffer." + name + ".num_batches_tracked", {}, store::DType::I64});
  }
};

constexpr int kBlocks[4] = {3, 4, 6, 3};
constexpr int kPlanes[4] = {64, 128, 256, 512};
constexpr int kStrides[4] = {1, 2, 2, 2};

}  // namespace

std::vector<LayoutEntry> resnet50_state(int num_classes, int width_div) {
  Builder b;
  const std::int64_t stem = 64 / width_div;
  b.conv("conv1", stem, 3, 7);
  b.bn("bn1", stem);
  std::int64_t inplanes = stem;
  for (int l = 0; l < 4; ++l) {
    const std::int64_t planes = kPlanes[l] / width_div;
    for (int i = 0; i < kBlocks[l]; ++i) {
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(i) + ".";
      b.conv(p + "conv1", planes, inplanes, 1);
      b.bn(p + "bn1", planes);
      b.conv(p + "conv2", planes, planes, 3);
      b.bn(p + "bn2", planes);
      b.conv(p + "conv3", planes * 4, planes, 1);
      b.bn(p + "bn3", planes * 4);
      if (i == 0) {
        b.conv(p + "downsample.0", planes * 4, inplanes, 1);
        b.bn(p + "downsample.1", planes * 4);
      }
      inplanes = planes * 4;
    }
  }
  b.state.push_back({"param.fc.weight", {num_classes, inplanes}, store::DType::F32});
  b.state.push_back({"param.fc.bias", {num_classes}, store::DType::F32});
  return b.state;
}

std::vector<LayoutEntry> resnet50_activations(int batch, int image, int num_classes, int width_div) {
  std::vector<LayoutEntry> acts;
  const std::int64_t n = batch;
  auto add = [&](const std::string& name, Shape shape) { acts.push_back({"act." + name, std::move(shape), store::DType::F32}); };
  const std::int64_t stem = 64 / width_div;
  std::int64_t h = conv_out(image, 7, 2, 3);
  add("conv1", {n, stem, h, h});
  add("bn1", {n, stem, h, h});
  add("relu", {n, stem, h, h});
  h = conv_out(h, 3, 2, 1);
  add("maxpool", {n, stem, h, h});
  std::int64_t inplanes = stem;
  for (int l = 0; l < 4; ++l) {
    const std::int64_t planes = kPlanes[l] / width_div;
    for (int i = 0; i < kBlocks[l]; ++i) {
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(i) + ".";
      const int stride = i == 0 ? kStrides[l] : 1;
      const std::int64_t h2 = conv_out(h, 3, stride, 1);
      add(p + "conv1", {n, planes, h, h});
      add(p + "bn1", {n, planes, h, h});
      add(p + "conv2", {n, planes, h2, h2});
      add(p + "bn2", {n, planes, h2, h2});
      add(p + "conv3", {n, planes * 4, h2, h2});
      add(p + "bn3", {n, planes * 4, h2, h2});
      if (i == 0) {
        add(p + "downsample.0", {n, planes * 4, h2, h2});
        add(p + "downsample.1", {n, planes * 4, h2, h2});
      }
      add(p + "relu", {n, planes * 4, h2, h2});
      h = h2;
      inplanes = planes * 4;
    }
  }
  add("avgpool", {n, inplanes, 1, 1});
  add("fc", {n, num_classes});
  return acts;
}

std::vector<LayoutEntry> resnet50_step(int batch, int image, int num_classes, int width_div) {
  std::vector<LayoutEntry> out;
  out.push_back({"input", {batch, 3, image, image}, store::DType::F32});
  out.push_back({"label", {batch}, store::DType::I64});
  const std::vector<LayoutEntry> state = resnet50_state(num_classes, width_div);
  std::vector<LayoutEntry> params, buffers;
  for (const auto& e : state) (e.key.rfind("param.", 0) == 0 ? params : buffers).push_back(e);
  out.insert(out.end(), params.begin(), params.end());
  out.insert(out.end(), buffers.begin(), buffers.end());
  const auto acts = resnet50_activations(batch, image, num_classes, width_div);
  out.insert(out.end(), acts.begin(), acts.end());
  out.push_back({"loss", {}, store::DType::F32});
  auto renamed = [](const LayoutEntry& e, const std::string& from, const std::string& to) {
    return LayoutEntry{to + e.key.substr(from.size()), e.shape, e.dtype};
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) out.push_back(renamed(*it, "param.", "grad."));
  for (const auto& p : params) out.push_back(renamed(p, "param.", "param_after."));
  for (const auto& b : buffers) out.push_back(renamed(b, "buffer.", "buffer_after."));
  for (const auto& p : params) out.push_back(renamed(p, "param.", "momentum."));
  return out;
}

}  // namespace wb::compare::testing
