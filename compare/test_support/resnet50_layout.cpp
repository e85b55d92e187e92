#include "compare/test_support/resnet50_layout.hpp"

#include <algorithm>

#include "layout/resnet50.hpp"

namespace wb::compare::testing {

std::vector<LayoutEntry> resnet50_state(int num_classes, int width_div) {
  // The layout's parameters, each batch norm's three buffers right after its bias (state_dict order).
  std::vector<LayoutEntry> state;
  const auto buffers = layout::buffers(width_div);
  std::size_t b = 0;
  for (const layout::Param& p : layout::params(num_classes, width_div)) {
    state.push_back({"param." + p.name, p.shape, store::DType::F32});
    if (p.kind != layout::ParamKind::bn_bias) continue;
    for (int k = 0; k < 3; ++k, ++b) {
      state.push_back({"buffer." + buffers[b].name, buffers[b].shape,
                       buffers[b].int64 ? store::DType::I64 : store::DType::F32});
    }
  }
  return state;
}

std::vector<LayoutEntry> resnet50_activations(int batch, int image, int num_classes, int width_div) {
  // The layout's module outputs as a dump names them: a block's output is its final relu's
  // ("act.layer1.0.relu"); the relu inside a block, which runs in place, has no entry of its own.
  std::vector<LayoutEntry> acts;
  for (const layout::Activation& a : layout::activations(batch, image, num_classes, width_div)) {
    const layout::Module& m = layout::modules()[static_cast<std::size_t>(a.module)];
    if (m.part == layout::Part::relu) continue;
    const std::string name = m.part == layout::Part::block ? m.name + ".relu" : m.name;
    acts.push_back({"act." + name, a.shape, store::DType::F32});
  }
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
