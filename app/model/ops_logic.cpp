#include "app/model/ops_logic.hpp"

#include <map>
#include <string>
#include <utility>

namespace wb::app_model {

std::vector<OpDelta> op_deltas(const std::vector<analysis::OpStat>& ops, const std::vector<analysis::OpStat>& second,
                               double steps, double second_steps) {
  std::map<std::pair<std::string, store::Category>, const analysis::OpStat*> index;
  for (const auto& o : second) index[{o.name, o.category}] = &o;
  std::vector<OpDelta> out(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    auto it = index.find({ops[i].name, ops[i].category});
    if (it == index.end()) continue;
    const analysis::OpStat& b = *it->second;
    OpDelta& d = out[i];
    d.present = true;
    d.mean_ns = ops[i].mean_ns - b.mean_ns;
    d.total_ns = static_cast<double>(ops[i].total_ns) - static_cast<double>(b.total_ns);
    d.mean_ratio = b.mean_ns > 0.0 ? d.mean_ns / b.mean_ns : 0.0;
    if (steps > 0.0 && second_steps > 0.0 && b.total_ns > 0)
      d.per_step_ratio = (static_cast<double>(ops[i].total_ns) / steps) / (static_cast<double>(b.total_ns) / second_steps);
  }
  return out;
}

}  // namespace wb::app_model
