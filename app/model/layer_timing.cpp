#include "app/model/layer_timing.hpp"

#include <algorithm>
#include <cmath>

#include "layout/resnet50.hpp"

namespace wb::app_model {

const analysis::LayerDiffRow* LayerTiming::find(const std::string& layer, store::Category direction) const {
  auto it = index.find({layer, direction});
  return it == index.end() ? nullptr : &diff.rows[it->second];
}

const analysis::LayerDiffRow* LayerTiming::for_tensor(const std::string& key) const {
  if (key == "loss") return find("loss", store::Category::loss);
  if (key.rfind("act.", 0) == 0) {
    // A block's relu is dumped per call; the layout knows which call the "layerN.M.relu" range is.
    return find(layout::module_of_output(std::string_view(key).substr(4)), store::Category::forward);
  }
  if (key.rfind("grad.", 0) == 0) {
    auto dot = key.rfind('.');
    if (dot <= 5) return nullptr;
    return find(key.substr(5, dot - 5), store::Category::backward);
  }
  return nullptr;
}

LayerTiming layer_timing(const analysis::RunData& a, const analysis::RunData& b) {
  LayerTiming t;
  t.diff = analysis::diff_layers(analysis::layer_times(a), analysis::layer_times(b));
  for (std::size_t i = 0; i < t.diff.rows.size(); ++i) t.index[{t.diff.rows[i].name, t.diff.rows[i].direction}] = i;
  return t;
}

double ratio_heat(double ratio) {
  if (!(ratio > 0.0) || !std::isfinite(ratio)) return 0.5;
  return std::clamp(0.5 + std::log2(ratio) / 2.0, 0.0, 1.0);
}

}  // namespace wb::app_model
