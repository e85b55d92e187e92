#include "compare/tensor_set.hpp"

#include <algorithm>
#include <array>
#include <numeric>
#include <tuple>

#include "layout/resnet50.hpp"

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

const NamedTensor* base_of(const TensorSet& set, const std::string& key) {
  switch (kind_of_key(key)) {
    case TensorKind::param_after: return set.find(make_key("param", base_name(key)));
    case TensorKind::momentum: return set.find(make_key("grad", base_name(key)));
    default: return nullptr;
  }
}

int walk_rank(TensorKind kind) { return static_cast<int>(kind); }

std::optional<std::int64_t> resnet50_forward_rank(std::string_view name) { return layout::forward_rank(name); }

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
