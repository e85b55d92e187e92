// Named tensor sets (one side of a comparison) and the dump keys of docs/ARCHITECTURE.md:
// `input`, `label`, `loss`, `param.<name>`, `buffer.<name>`, `act.<module>`, `grad.<name>`,
// `param_after.<name>`, `buffer_after.<name>`, `momentum.<name>`. Keys without a known kind prefix
// (a TroubleShooter dump, say) are of kind `other`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "store/one_line.hpp"
#include "store/tensor_file.hpp"

namespace wb::compare {

// Bad input to a comparison (unknown format, bad mapping file, bad profile name, ...). what() names the
// file or flag and what was expected.
class CompareError : public std::runtime_error {
 public:
  explicit CompareError(const std::string& what) : std::runtime_error(store::one_line(what)) {}
};

// In the walk order of a training step (first divergence): inputs, initial state, forward, loss,
// backward, update.
enum class TensorKind { input, label, param, buffer, act, loss, grad, param_after, buffer_after, momentum, other };

std::string_view kind_name(TensorKind kind);
// The kind of a dump key; `other` when the key has no known prefix.
TensorKind kind_of_key(std::string_view key);
// The kind named by kind_name; std::nullopt for any other text.
std::optional<TensorKind> kind_from_name(std::string_view name);
// The key without its kind prefix ("param.conv1.weight" -> "conv1.weight"; "loss" -> "loss").
std::string_view base_name(std::string_view key);
// The dump key of a run file's (kind, name) pair: input/label/loss are the kind alone.
std::string make_key(std::string_view kind, std::string_view name);
// Position of a kind in the walk (input 0 ... momentum 9, other 10).
int walk_rank(TensorKind kind);

// Where a module or tensor name sits in torchvision's ResNet-50 forward order, from the name alone:
// conv1, bn1, relu, maxpool, layer1.0 ... layer4.2 (each block: conv1, bn1, relu.0, conv2, bn2, relu.1,
// conv3, bn3, downsample.0, downsample.1, relu.2 or relu, the block itself), avgpool, fc; a parameter or
// buffer follows its module (weight, bias, running_mean, running_var, num_batches_tracked). Accepts a
// base name ("layer1.0.conv1", "layer1.0.bn1.weight"); std::nullopt for a name of another network.
// The walk uses it when neither side of a comparison recorded an execution order.
std::optional<std::int64_t> resnet50_forward_rank(std::string_view name);

// Where a set's exec_order came from. `recorded`: the producer wrote it down (a run file's exec_order
// column, __metadata__["wb.exec_order"], TroubleShooter's file numbering, the order of msprobe's
// dump.json); `derived`: nothing was recorded, so it is the kind order and then resnet50_forward_rank
// (names it does not know keep their file order, after the known ones). A file's key order is never
// taken as an execution order.
enum class OrderSource { recorded, derived };

// What a producer recorded of a tensor it did not save (msprobe's task "statistics").
struct RecordedStats {
  double max = 0.0, min = 0.0, mean = 0.0, norm = 0.0;
};

struct NamedTensor {
  std::string key;
  std::int64_t exec_order = 0;  // execution order within the set (see load.hpp)
  store::HostTensor tensor;     // dtype and shape always; no data when `stats` is set
  std::optional<RecordedStats> stats = std::nullopt;

  bool stats_only() const { return stats.has_value(); }
};

// The reference's own float32 noise on one tensor: its distance to a float64 replay of the same step
// (safetensors __metadata__["wb.noise"], written by torch_step.py; see wbdump.py). `l2` is
// ||ref32 - ref64||, `max_abs` max |ref32 - ref64|, `ref_l2` ||ref64||. For param_after and momentum
// the same of their update (after - before; momentum - grad), when recorded.
// `flip_l2` (and `update_flip_l2`) is ||ref32 - ref64'|| for a float64 replay in which the ReLU inputs
// within rounding noise of zero went the other way: what a correct port's flipped ReLUs can do.
struct NoiseScale {
  double l2 = 0.0;
  double max_abs = 0.0;
  double ref_l2 = 0.0;
  std::optional<double> update_l2;
  std::optional<double> update_ref_l2;
  std::optional<double> flip_l2;
  std::optional<double> update_flip_l2;
  // The loss: how far its input's noise can move it (||d loss / d logits|| x the logits' noise).
  std::optional<double> input_l2;

  // The noise a tensor is judged against: rounding, or the flipped replay's distance, or what its input's
  // noise allows, whichever is largest.
  double value_l2() const { return std::max({l2, flip_l2.value_or(0.0), input_l2.value_or(0.0)}); }
  std::optional<double> update_value_l2() const {
    if (!update_l2) return std::nullopt;
    return std::max(*update_l2, update_flip_l2.value_or(0.0));
  }
};

// One side of a comparison.
class TensorSet {
 public:
  std::string source;  // file or directory it came from, for messages
  std::vector<NamedTensor> tensors;
  // Kinds the producer marked as not comparable (safetensors __metadata__["wb.not_comparable"], a JSON
  // list of kind names; e.g. gradients of a multi-rank step replayed from one rank's dump).
  std::set<TensorKind> not_comparable;
  OrderSource order_source = OrderSource::derived;
  std::string order_origin;  // what recorded the order ("the run file's exec_order", ...), or why none
  // Losses summed into the "loss" tensor: a pipeline step's micro-batches under --pipeline-loss sum
  // (run files: meta pipeline_json; safetensors: __metadata__["wb.pipeline"]). An absolute loss bound
  // made for one loss applies to each of them, so it grows with their number.
  int loss_terms = 1;
  // Per key, the set's own float32 noise when it recorded one (a reference with wb.noise); empty otherwise.
  std::map<std::string, NoiseScale> noise;
  std::string noise_method;  // how it was measured ("float64 replay of the same step"), empty when none

  // Rebuilds the key index; call after filling `tensors`. Throws CompareError on a duplicate key.
  void index();
  // The tensor with this key, or nullptr.
  const NamedTensor* find(std::string_view key) const;
  std::optional<std::size_t> position(std::string_view key) const;

  // Indices of `tensors` in walk order: by kind (walk_rank), then by exec_order, except gradients,
  // which are walked in reverse layer order: descending position of param.<name> in the set, or of
  // their own exec_order when the parameter is absent (a dumper writes gradients from a buffer in
  // forward order, so its order cannot be trusted to be the backward order).
  std::vector<std::size_t> walk_order() const;

 private:
  std::unordered_map<std::string, std::size_t> by_key_;
};

// What an optimizer output is measured against in one set: the starting value param.<name> for
// param_after.<name> (the update), the gradient grad.<name> for momentum.<name> (what the optimizer adds
// to the gradient: weight decay and the previous momentum); nullptr for other keys or when absent.
const NamedTensor* base_of(const TensorSet& set, const std::string& key);

}  // namespace wb::compare
