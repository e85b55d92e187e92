// From PyTorch's ops to wb-train's layers, for one rank of an imported trace.
//
// Forward: a trace taken with record_function(<module name>) around each module (torch_step.py
// --profile does this) names its layers ("layer2.0.conv2"): method "module". Otherwise the ops that
// make a ResNet-50 layer (aten::conv2d, aten::batch_norm, aten::relu_, aten::max_pool2d,
// aten::adaptive_avg_pool2d, aten::linear, or with_modules' "nn.Module: Conv2d_0" ranges) are matched
// in execution order and by type against torchvision's ResNet-50 call sequence within each step, the
// way `wb compare` matches tensors by order: method "order".
//
// Backward: each autograd node ("autograd::engine::evaluate_function: ConvolutionBackward0") is given
// the layer of the forward op that made it, through its "Sequence number" (and "Fwd thread id") when
// the trace has them: method "sequence". Without them (the legacy exporter writes no args), the nodes'
// types are matched against the forward layers in reverse order: method "order". Nodes of no layer type
// (AccumulateGrad, TBackward0, views, the residual AddBackward0) take the layer of the node before
// them, as autograd runs them right after it. Consecutive nodes of one layer become one backward range.
//
// Blocks ("layer2.0") get a range around their layers where the trace has none; the residual add
// belongs to the block's last relu, as in wb-train. The loss ops get a "loss" range and the optimizer's
// step and zero_grad an "optimizer" range.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ingest/torch_trace.hpp"
#include "store/rows.hpp"

namespace wb::ingest {

// One host range of the trace, or one layer range added around some.
struct Node {
  std::int64_t start = 0;
  std::int64_t end = 0;
  std::int64_t ext = -1;      // External id
  std::int64_t corr = -1;     // correlation (runtime calls)
  std::int64_t seq = -1;      // Sequence number
  std::int64_t fwd_tid = -1;  // Fwd thread id
  std::uint64_t corr_id = 0;  // written to range.corr_id
  std::uint32_t name = 0;     // id into the names table
  std::int32_t parent = -1;   // index into the thread's nodes, after build_tree
  std::int32_t step = -1;
  std::uint32_t thread = 0;   // index of its thread (set where device rows are linked)
  std::uint32_t layer = 0;    // forward/backward layer name id this op belongs to, 0 = none
  std::uint8_t depth = 0;
  store::Category category = store::Category::forward;
  EventCat cat = EventCat::none;
  bool added = false;         // a layer range added by the mapping
};

// Interned names: the trace's strings plus the layer names the mapping adds.
class Names {
 public:
  explicit Names(std::vector<std::string>& strings);
  // Adding a name grows the table: a reference text() returned before may then dangle.
  std::uint32_t id(const std::string& text);
  const std::string& text(std::uint32_t id) const { return strings_[id]; }

 private:
  std::vector<std::string>& strings_;
  std::map<std::string, std::uint32_t, std::less<>> ids_;
};

struct Thread {
  std::string key;          // "pid/tid"
  std::string label;        // track name
  std::vector<Node> nodes;  // sorted and nested by build_tree
};

// Sorts by start (enclosing first: longer first, added layer ranges before the ops they wrap) and sets
// parent and depth; a child that overruns its parent by at most 1 us (the legacy exporter rounds to
// whole microseconds) is clipped to it.
void build_tree(std::vector<Node>& nodes);

// Adds the layer ranges to the threads' nodes (build_tree must be run again after) and fills
// `methods` with each layer's method per direction: methods["forward"]["layer1.0.conv1"] = "module".
LayerMatchCounts map_layers(std::vector<Thread>& threads, Names& names,
                            std::map<std::string, std::map<std::string, std::string>>& methods);

// ResNet-50 (torchvision) modules in the order its forward calls them: the block's relu three times.
const std::vector<std::string>& resnet50_call_sequence();

}  // namespace wb::ingest
