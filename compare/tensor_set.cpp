#include "compare/tensor_set.hpp"

#include <algorithm>
#include <array>
#include <numeric>
#include <tuple>

namespace wb::compare {
namespace {

struct KindPrefix {
  TensorKind kind;
  std::string_view name;
};

// Longest prefixes first so "param_after." is not read as "param".
constexpr std::array<KindPrefix, 7> kPrefixed = {{{TensorKind::param_after, "param_after"},
                                                  {TensorKind::buffer_after, "buffer_after"},
                                                  {TensorKind::momentum, "momentum"},
                                                  {TensorKind::param, "param"},
                                                  {TensorKind::buffer, "buffer"},
                                                  {TensorKind::act, "act"},
                                                  {TensorKind::grad, "grad"}}};

}  // namespace

std::string_view kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::input: return "input";
    case TensorKind::label: return "label";
    case TensorKind::param: return "param";
    case TensorKind::buffer: return "buffer";
    case TensorKind::act: return "act";
    case TensorKind::loss: return "loss";
    case TensorKind::grad: return "grad";
    case TensorKind::param_after: return "param_after";
    case TensorKind::buffer_after: return "buffer_after";
    case TensorKind::momentum: return "momentum";
    case TensorKind::other: return "other";
  }
  return "other";
}

std::optional<TensorKind> kind_from_name(std::string_view name) {
  for (int k = 0; k <= static_cast<int>(TensorKind::other); ++k) {
    if (kind_name(static_cast<TensorKind>(k)) == name) return static_cast<TensorKind>(k);
  }
  return std::nullopt;
}

TensorKind kind_of_key(std::string_view key) {
  if (key == "input") return TensorKind::input;
  if (key == "label") return TensorKind::label;
  if (key == "loss") return TensorKind::loss;
  for (const auto& p : kPrefixed) {
    if (key.size() > p.name.size() + 1 && key.substr(0, p.name.size()) == p.name && key[p.name.size()] == '.') {
      return p.kind;
    }
  }
  return TensorKind::other;
}

std::string_view base_name(std::string_view key) {
  const TensorKind kind = kind_of_key(key);
  if (kind == TensorKind::other || kind == TensorKind::input || kind == TensorKind::label ||
      kind == TensorKind::loss) {
    return key;
  }
  return key.substr(kind_name(kind).size() + 1);
}

std::string make_key(std::string_view kind, std::string_view name) {
  if (kind == "input" || kind == "label" || kind == "loss" || name.empty()) return std::string(kind);
  if (kind.empty()) return std::string(name);
  std::string key;
  key.reserve(kind.size() + 1 + name.size());
  key.append(kind).append(".").append(name);
  return key;
}

int walk_rank(TensorKind kind) { return static_cast<int>(kind); }

namespace {

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

std::optional<std::int64_t> resnet50_forward_rank(std::string_view name) {
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

void TensorSet::index() {
  by_key_.clear();
  by_key_.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!by_key_.emplace(tensors[i].key, i).second) {
      throw CompareError(source + ": tensor '" + tensors[i].key + "' appears twice (expected unique names)");
    }
  }
}

const NamedTensor* TensorSet::find(std::string_view key) const {
  const auto pos = position(key);
  return pos ? &tensors[*pos] : nullptr;
}

std::optional<std::size_t> TensorSet::position(std::string_view key) const {
  const auto it = by_key_.find(std::string(key));
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::size_t> TensorSet::walk_order() const {
  // Forward position of each parameter, for the gradient rule.
  std::vector<std::size_t> params;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (kind_of_key(tensors[i].key) == TensorKind::param) params.push_back(i);
  }
  std::stable_sort(params.begin(), params.end(),
                   [&](std::size_t x, std::size_t y) { return tensors[x].exec_order < tensors[y].exec_order; });
  std::unordered_map<std::string_view, std::int64_t> param_pos;
  for (std::size_t p = 0; p < params.size(); ++p) {
    param_pos.emplace(base_name(tensors[params[p]].key), static_cast<std::int64_t>(p));
  }
  // Sort key: (kind rank, group, order). Gradients with a parameter come first in their kind, by
  // descending parameter position; the rest follow by descending own order.
  std::vector<std::tuple<int, int, std::int64_t>> keys(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorKind kind = kind_of_key(tensors[i].key);
    if (kind == TensorKind::grad) {
      const auto it = param_pos.find(base_name(tensors[i].key));
      keys[i] = it != param_pos.end() ? std::tuple{walk_rank(kind), 0, -it->second}
                                       : std::tuple{walk_rank(kind), 1, -tensors[i].exec_order};
    } else {
      keys[i] = {walk_rank(kind), 0, tensors[i].exec_order};
    }
  }
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return keys[x] < keys[y]; });
  return order;
}

}  // namespace wb::compare
