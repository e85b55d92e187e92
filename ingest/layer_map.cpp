#include "ingest/layer_map.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <string_view>
#include <unordered_map>

#include "profiler/analysis/layer_diff.hpp"
#include "layout/resnet50.hpp"

namespace wb::ingest {

Names::Names(std::vector<std::string>& strings) : strings_(strings) {
  for (std::size_t i = 0; i < strings_.size(); ++i) ids_.emplace(strings_[i], static_cast<std::uint32_t>(i));
}

std::uint32_t Names::id(const std::string& text) {
  auto it = ids_.find(text);
  if (it != ids_.end()) return it->second;
  auto id = static_cast<std::uint32_t>(strings_.size());
  strings_.push_back(text);
  ids_.emplace(text, id);
  return id;
}

void build_tree(std::vector<Node>& nodes) {
  // Outer ranges first at equal starts. Traces list a thread's ranges mostly in time order (a step's
  // range comes after its contents, the layer mapping appends its ranges at the end), so the nodes that
  // break the order are taken out, sorted alone and merged back: linear time on an almost sorted thread.
  auto before = [](const Node& a, const Node& b) {
    if (a.start != b.start) return a.start < b.start;
    if (a.end != b.end) return a.end > b.end;
    return a.added && !b.added;
  };
  // In place: the nodes in order are compacted to the front, the late ones sorted behind them, and the
  // two merged (with a buffer the size of the late ones).
  if (!std::is_sorted(nodes.begin(), nodes.end(), before)) {
    std::vector<Node> late;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (kept == 0 || !before(nodes[i], nodes[kept - 1])) nodes[kept++] = nodes[i];
      else late.push_back(nodes[i]);
    }
    std::sort(late.begin(), late.end(), before);
    std::copy(late.begin(), late.end(), nodes.begin() + static_cast<std::ptrdiff_t>(kept));
    std::inplace_merge(nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(kept), nodes.end(), before);
  }
  constexpr std::int64_t kRounding = 1000;  // 1 us
  std::vector<std::int32_t> stack;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    Node& n = nodes[i];
    while (!stack.empty()) {
      const Node& top = nodes[static_cast<std::size_t>(stack.back())];
      if (n.start < top.end && n.end <= top.end + kRounding) break;
      stack.pop_back();
    }
    if (!stack.empty()) {
      const Node& top = nodes[static_cast<std::size_t>(stack.back())];
      n.end = std::min(n.end, top.end);
      n.parent = stack.back();
    } else {
      n.parent = -1;
    }
    n.depth = static_cast<std::uint8_t>(std::min<std::size_t>(stack.size(), 255));
    stack.push_back(static_cast<std::int32_t>(i));
  }
}

const std::vector<std::string>& resnet50_call_sequence() {
  // The layout's modules in forward order, each block's relu module called three times (after bn1, after
  // bn2, after the residual sum), as torchvision's Bottleneck calls it.
  static const std::vector<std::string> seq = [] {
    std::vector<std::string> s;
    std::string relu;
    for (const layout::Module& m : layout::modules()) {
      switch (m.part) {
        case layout::Part::relu: relu = m.name; s.push_back(m.name); break;
        case layout::Part::bn2: s.push_back(m.name); s.push_back(relu); break;
        case layout::Part::block: s.push_back(relu); break;
        default:
          if (m.kind != layout::ModuleKind::loss && m.kind != layout::ModuleKind::optimizer) s.push_back(m.name);
      }
    }
    return s;
  }();
  return seq;
}

namespace {

enum class Kind : std::uint8_t { none, conv, bn, relu, maxpool, avgpool, fc, loss };

constexpr std::string_view kEvalPrefix = "autograd::engine::evaluate_function: ";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }


Kind kind_of_module(std::string_view name) {
  switch (layout::kind_of_name(name)) {
    case layout::NameKind::conv: return Kind::conv;
    case layout::NameKind::batch_norm: return Kind::bn;
    case layout::NameKind::relu: return Kind::relu;
    case layout::NameKind::maxpool: return Kind::maxpool;
    case layout::NameKind::avgpool: return Kind::avgpool;
    case layout::NameKind::fc: return Kind::fc;
    default: return Kind::none;
  }
}

// "layer2.0" for "layer2.0.conv2" (and for "layer2.0" itself); "" outside the blocks.
std::string_view block_of(std::string_view name) {
  const auto b = layout::parse_block_name(name);
  if (!b) return {};
  return b->rest.empty() ? name : name.substr(0, name.size() - b->rest.size() - 1);
}

// The forward ops (and with_modules' module ranges) that are one ResNet-50 layer.
Kind kind_of_forward_op(std::string_view n, EventCat cat) {
  if (cat == EventCat::python_function) {
    if (!starts_with(n, "nn.Module: ")) return Kind::none;
    n.remove_prefix(11);
    if (starts_with(n, "Conv2d_")) return Kind::conv;
    if (starts_with(n, "BatchNorm2d_")) return Kind::bn;
    if (starts_with(n, "ReLU_")) return Kind::relu;
    if (starts_with(n, "MaxPool2d_")) return Kind::maxpool;
    if (starts_with(n, "AdaptiveAvgPool2d_")) return Kind::avgpool;
    if (starts_with(n, "Linear_")) return Kind::fc;
    return Kind::none;
  }
  if (!starts_with(n, "aten::")) return Kind::none;
  n.remove_prefix(6);
  if (n == "conv2d" || n == "convolution" || n == "_convolution" || n == "mkldnn_convolution" || n == "cudnn_convolution" ||
      n == "thnn_conv2d")
    return Kind::conv;
  if (n == "batch_norm" || n == "_batch_norm_impl_index" || n == "native_batch_norm" || n == "cudnn_batch_norm" ||
      n == "_native_batch_norm_legit")
    return Kind::bn;
  if (n == "relu" || n == "relu_") return Kind::relu;
  if (n == "max_pool2d" || n == "max_pool2d_with_indices") return Kind::maxpool;
  if (n == "adaptive_avg_pool2d" || n == "_adaptive_avg_pool2d") return Kind::avgpool;
  if (n == "linear" || n == "addmm") return Kind::fc;
  return Kind::none;
}

Kind kind_of_backward(std::string_view fn) {
  if (contains(fn, "Convolution") || contains(fn, "Conv2D") || contains(fn, "ConvNd")) return Kind::conv;
  if (contains(fn, "BatchNorm")) return Kind::bn;
  if (contains(fn, "Relu") || contains(fn, "Threshold")) return Kind::relu;
  if (contains(fn, "MaxPool")) return Kind::maxpool;
  if (contains(fn, "AdaptiveAvgPool") || contains(fn, "AvgPool") || starts_with(fn, "MeanBackward")) return Kind::avgpool;
  if (starts_with(fn, "AddmmBackward") || starts_with(fn, "MmBackward") || contains(fn, "Linear")) return Kind::fc;
  if (contains(fn, "NllLoss") || contains(fn, "LogSoftmax") || contains(fn, "CrossEntropy")) return Kind::loss;
  return Kind::none;  // AccumulateGrad, TBackward0, views, AddBackward0: follow the node before
}

struct Unit {
  std::uint32_t layer;
  Kind kind;
};

struct Where {
  std::size_t thread;
  std::size_t node;
};

// The end of node i's subtree (nodes are in tree order).
std::size_t subtree_end(const std::vector<Node>& nodes, std::size_t i) {
  std::size_t j = i + 1;
  while (j < nodes.size() && nodes[j].depth > nodes[i].depth) ++j;
  return j;
}

Node wrap(const Node& first, std::int64_t end, std::uint32_t name, store::Category category) {
  Node n;
  n.start = first.start;
  n.end = end;
  n.name = name;
  n.category = category;
  n.step = first.step;
  n.layer = name;
  n.added = true;
  return n;
}

// map_layers' steps over one rank's threads, in the order they run: each step reads what the ones
// before it found. Names are interned in the same order every time (the forward layers, "loss",
// "optimizer", then the blocks).
struct LayerMapper {
  using Category = store::Category;

  LayerMapper(std::vector<Thread>& threads_, Names& names_, std::map<std::string, std::map<std::string, std::string>>& methods_)
      : threads(threads_), names(names_), methods(methods_), call_seq(resnet50_call_sequence()), added(threads_.size()) {
    for (const auto& n : call_seq) call_kinds.push_back(kind_of_module(n));
    // Module names anywhere in the trace decide the method for the whole rank.
    for (const auto& t : threads)
      for (const auto& n : t.nodes)
        if ((n.cat == EventCat::none || n.cat == EventCat::user_annotation) && n.category == Category::forward &&
            analysis::is_layer_name(names.text(n.name)))
          by_module = true;
  }

  // Forward: every forward node takes its parent's layer, or its own when it is one (a module range,
  // or an op matched in order against the call sequence).
  void map_forward() {
    for (std::size_t ti = 0; ti < threads.size(); ++ti) {
      auto& nodes = threads[ti].nodes;
      std::map<std::int32_t, std::size_t> call_pos;  // per step: next position in call_seq
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        Node& n = nodes[i];
        const Node* parent = n.parent >= 0 ? &nodes[static_cast<std::size_t>(n.parent)] : nullptr;
        n.layer = parent ? parent->layer : 0;
        if (n.category != Category::forward) continue;
        const std::string& text = names.text(n.name);  // invalid once names.id() adds a name below
        const bool residual_add = text == "aten::add_" || text == "aten::add";
        if (by_module) {
          if ((n.cat == EventCat::none || n.cat == EventCat::user_annotation) && analysis::is_layer_name(text))
            add_forward_module(n, text);
        } else if (parent == nullptr || parent->layer == 0) {
          match_forward_op(ti, n, text, call_pos);
        }
        // The residual add runs in the block's own forward, outside its modules: wb-train counts it in the
        // block's last relu.
        if (n.layer != 0 && residual_add) {
          const std::string& layer = names.text(n.layer);
          if (!block_of(layer).empty() && block_of(layer) == layer) n.layer = names.id(layer + ".relu");
        }
        if (n.seq >= 0 && n.layer != 0) layer_of_seq[n.seq] = n.layer;
      }
    }
  }

  // A module range of the trace (with_modules): the layer itself.
  void add_forward_module(Node& n, const std::string& text) {
    n.layer = n.name;
    Kind k = kind_of_module(text);
    if (k != Kind::none) {
      forward_units[n.step].push_back({n.name, k});
      forward_end[n.step] = std::max(forward_end[n.step], n.end);
    }
    if (!block_of(text).empty() && block_of(text) == text) existing_blocks.insert({text, n.step});
    methods["forward"][text] = "module";
    ++counts.forward_module;
  }

  // An op outside any layer: the next layer of its kind in the step's call sequence, wrapped in a range.
  void match_forward_op(std::size_t ti, Node& n, const std::string& text, std::map<std::int32_t, std::size_t>& call_pos) {
    Kind k = kind_of_forward_op(text, n.cat);
    if (k == Kind::none) return;
    std::size_t& pos = call_pos[n.step];
    std::size_t j = pos;
    while (j < call_seq.size() && call_kinds[j] != k) ++j;
    if (j == call_seq.size()) {
      ++counts.forward_unmatched;
      return;
    }
    pos = j + 1;
    std::uint32_t layer = names.id(call_seq[j]);
    n.layer = layer;
    added[ti].push_back(wrap(n, n.end, layer, Category::forward));
    forward_units[n.step].push_back({layer, k});
    forward_end[n.step] = std::max(forward_end[n.step], n.end);
    methods["forward"][call_seq[j]] = "order";
    ++counts.forward_order;
  }

  // The forward ops after a step's last layer (and before its backward) compute the loss.
  void mark_loss_ops() {
    for (auto& t : threads) {
      for (std::size_t i = 0; i < t.nodes.size(); ++i) {
        Node& n = t.nodes[i];
        const Node* parent = n.parent >= 0 ? &t.nodes[static_cast<std::size_t>(n.parent)] : nullptr;
        auto fe = forward_end.find(n.step);
        if (n.category != Category::forward || n.layer != 0 || fe == forward_end.end() || n.start < fe->second) continue;
        if (parent && parent->category != Category::step) continue;
        for (std::size_t j = i; j < subtree_end(t.nodes, i); ++j) t.nodes[j].category = Category::loss;
      }
    }
  }

  // Backward: the autograd nodes of every thread, in time order.
  void collect_evals() {
    for (std::size_t ti = 0; ti < threads.size(); ++ti) {
      auto& nodes = threads[ti].nodes;
      for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Node& n = nodes[i];
        if (!starts_with(names.text(n.name), kEvalPrefix)) continue;
        if (n.parent >= 0 && starts_with(names.text(nodes[static_cast<std::size_t>(n.parent)].name), kEvalPrefix)) continue;
        evals.push_back({ti, i});
      }
    }
    std::stable_sort(evals.begin(), evals.end(), [&](const Where& a, const Where& b) {
      return threads[a.thread].nodes[a.node].start < threads[b.thread].nodes[b.node].start;
    });
  }

  void map_backward() {
    loss_name = names.id("loss");
    for (const Where& w : evals) map_backward_node(w);
  }

  // An autograd node's layer: the loss's, its forward op's by sequence number, the next of its kind
  // in the step's forward layers taken backwards, else the layer of the node before.
  void map_backward_node(const Where& w) {
    auto& nodes = threads[w.thread].nodes;
    Node& n = nodes[w.node];
    std::string_view fn = std::string_view(names.text(n.name)).substr(kEvalPrefix.size());
    if (starts_with(fn, "torch::autograd::")) fn.remove_prefix(17);
    Kind k = kind_of_backward(fn);
    std::size_t end = subtree_end(nodes, w.node);
    std::int64_t seq = n.seq;
    for (std::size_t j = w.node + 1; seq < 0 && j < end; ++j)
      if (nodes[j].depth == n.depth + 1 && nodes[j].seq >= 0) seq = nodes[j].seq;

    std::uint32_t layer = 0;
    const char* method = nullptr;
    auto seq_layer = seq >= 0 ? layer_of_seq.find(seq) : layer_of_seq.end();
    // A step's backward starts at the loss: every node before the first one of a layer is the loss's
    // (the log_softmax, the mean, and a hand-written loss's mul, sum and neg).
    bool in_loss = !last_layer.count(n.step) || last_layer[n.step] == loss_name;
    if (in_loss && seq_layer == layer_of_seq.end() && k != Kind::conv && k != Kind::bn && k != Kind::relu &&
        k != Kind::maxpool && k != Kind::fc)
      k = Kind::loss;
    if (k == Kind::loss) {
      layer = loss_name;
      for (std::size_t j = w.node; j < end; ++j) nodes[j].category = store::Category::loss;
    } else if (seq_layer != layer_of_seq.end()) {
      layer = seq_layer->second;
      method = "sequence";
      ++counts.backward_sequence;
    } else if (k != Kind::none) {
      const auto& units = forward_units[n.step];
      std::size_t& pos = back_pos[n.step];
      std::size_t j = pos;
      while (j < units.size() && units[units.size() - 1 - j].kind != k) ++j;
      if (j < units.size()) {
        layer = units[units.size() - 1 - j].layer;
        pos = j + 1;
        method = "order";
        ++counts.backward_order;
      }
    }
    if (layer == 0 && k != Kind::loss) layer = follow_previous(n.step);
    n.layer = layer;
    if (layer != 0) {
      if (layer == loss_name) ++counts.backward_loss;
      last_layer[n.step] = layer;
      if (method && layer != loss_name) methods["backward"].try_emplace(names.text(layer), method);
    }
  }

  // The layer of the step's node before (not the loss), or 0 when there is none.
  std::uint32_t follow_previous(std::int32_t step) {
    auto it = last_layer.find(step);
    if (it != last_layer.end() && it->second != loss_name) {
      ++counts.backward_follow;
      return it->second;
    }
    ++counts.backward_unmatched;
    return 0;
  }

  // Consecutive autograd nodes of one layer on one thread become one backward range.
  void add_backward_ranges() {
    for (std::size_t a = 0; a < evals.size();) {
      const Node& first = threads[evals[a].thread].nodes[evals[a].node];
      std::size_t b = a + 1;
      std::int64_t end = first.end;
      while (b < evals.size() && evals[b].thread == evals[a].thread) {
        const Node& n = threads[evals[b].thread].nodes[evals[b].node];
        if (n.layer != first.layer || n.step != first.step) break;
        end = std::max(end, n.end);
        ++b;
      }
      if (first.layer != 0)
        added[evals[a].thread].push_back(
            wrap(first, end, first.layer, first.layer == loss_name ? Category::loss : Category::backward));
      a = b;
    }
  }

  // The loss's forward ops and the optimizer's calls get the names wb-train gives them.
  void add_loss_and_optimizer_ranges() {
    const std::uint32_t optimizer_name = names.id("optimizer");
    for (std::size_t ti = 0; ti < threads.size(); ++ti) {
      for (const Node& n : threads[ti].nodes) {
        const Node* parent = n.parent >= 0 ? &threads[ti].nodes[static_cast<std::size_t>(n.parent)] : nullptr;
        const std::string& text = names.text(n.name);
        if (n.category == Category::loss && (!parent || parent->category != Category::loss) && !starts_with(text, kEvalPrefix))
          added[ti].push_back(wrap(n, n.end, loss_name, Category::loss));
        if (n.category == Category::optimizer && (!parent || parent->category != Category::optimizer))
          added[ti].push_back(wrap(n, n.end, optimizer_name, Category::optimizer));
      }
    }
  }

  // Block ranges around the layers of each block where the trace has none.
  void add_block_ranges() {
    for (std::size_t ti = 0; ti < threads.size(); ++ti) {
      std::vector<Node> blocks = block_ranges(ti);
      added[ti].insert(added[ti].end(), blocks.begin(), blocks.end());
    }
  }

  // One thread's missing block ranges: consecutive layer ranges (added ones, and module ranges with a
  // kind) of one block, direction and step.
  std::vector<Node> block_ranges(std::size_t ti) {
    std::vector<std::pair<std::int64_t, const Node*>> layer_ranges;  // added and module ranges with a kind
    for (const Node& n : threads[ti].nodes)
      if (by_module && n.layer == n.name && n.category == Category::forward && kind_of_module(names.text(n.name)) != Kind::none)
        layer_ranges.push_back({n.start, &n});
    for (const Node& n : added[ti])
      if (kind_of_module(names.text(n.name)) != Kind::none) layer_ranges.push_back({n.start, &n});
    std::sort(layer_ranges.begin(), layer_ranges.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Node> blocks;
    for (std::size_t a = 0; a < layer_ranges.size();) {
      const Node& first = *layer_ranges[a].second;
      std::string block(block_of(names.text(first.name)));
      std::size_t b = a + 1;
      std::int64_t end = first.end;
      while (b < layer_ranges.size()) {
        const Node& n = *layer_ranges[b].second;
        if (n.category != first.category || n.step != first.step || block_of(names.text(n.name)) != block) break;
        end = std::max(end, n.end);
        ++b;
      }
      bool have = first.category == Category::forward && existing_blocks.count({block, first.step}) > 0;
      if (!block.empty() && !have) blocks.push_back(wrap(first, end, names.id(block), first.category));
      a = b;
    }
    return blocks;
  }

  void insert_added() {
    for (std::size_t ti = 0; ti < threads.size(); ++ti)
      threads[ti].nodes.insert(threads[ti].nodes.end(), added[ti].begin(), added[ti].end());
  }

  std::vector<Thread>& threads;
  Names& names;
  std::map<std::string, std::map<std::string, std::string>>& methods;
  LayerMatchCounts counts;
  const std::vector<std::string>& call_seq;
  std::vector<Kind> call_kinds;
  bool by_module = false;
  std::map<std::int32_t, std::vector<Unit>> forward_units;  // per step, in execution order
  std::map<std::int32_t, std::int64_t> forward_end;         // per step, the end of its last layer
  std::unordered_map<std::int64_t, std::uint32_t> layer_of_seq;
  std::vector<std::vector<Node>> added;
  std::set<std::pair<std::string, std::int32_t>> existing_blocks;  // (block, step) forward ranges in the trace
  std::vector<Where> evals;
  std::map<std::int32_t, std::size_t> back_pos;       // per step: next position in the reversed units
  std::map<std::int32_t, std::uint32_t> last_layer;   // per step: the layer of the node before
  std::uint32_t loss_name = 0;
};

}  // namespace

LayerMatchCounts map_layers(std::vector<Thread>& threads, Names& names,
                            std::map<std::string, std::map<std::string, std::string>>& methods) {
  LayerMapper mapper(threads, names, methods);
  mapper.map_forward();
  mapper.mark_loss_ops();
  mapper.collect_evals();
  mapper.map_backward();
  mapper.add_backward_ranges();
  mapper.add_loss_and_optimizer_ranges();
  mapper.add_block_ranges();
  mapper.insert_added();
  return mapper.counts;
}

}  // namespace wb::ingest
