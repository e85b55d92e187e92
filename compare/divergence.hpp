// The first divergence: the first failing tensor in walk order (inputs, initial state, forward
// activations, loss, gradients in reverse layer order, updated parameters, buffers, momentum), with
// its worst elements and whether its error is local or inherited.
//
// Local or inherited: the error (rel-L2) of the failing tensor is compared with the error of its input
// - the previous activation for an activation (or the last activation for the loss), the previous
// gradient in the backward walk for a gradient (the loss for the first), the gradient of the same
// parameter for an updated parameter or a momentum buffer. A jump of 10x or more, an input without
// error, a new NaN/Inf or no input at all make it local: this operation is the likely cause.
// Otherwise the error was inherited and grew past the threshold here. When both rows carry the
// reference's own float32 noise (compare.hpp), the jump is measured in units of that noise: an error
// that grows no faster than the reference's noise grows through the operation is inherited noise, and
// only a jump of 10x or more over the input's ratio to its noise makes the operation the cause.
//
// Optimizer-only: every activation, the loss and every gradient pass but an updated parameter or a
// momentum buffer fails: the update rule (learning rate, momentum, weight decay) is the suspect.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/metrics.hpp"
#include "compare/tensor_set.hpp"

namespace wb::compare {

struct Comparison;

inline constexpr double kLocalJump = 10.0;

struct FirstDivergence {
  std::size_t row = 0;  // index into Comparison::rows
  std::string name;
  TensorKind kind = TensorKind::other;
  std::string reason;                 // the failed check
  std::vector<WorstElement> worst;    // the worst elements, largest error first
  std::string input_name;             // the input it was compared with ("" when none)
  std::optional<double> input_rel_l2;
  std::optional<double> rel_l2;
  std::optional<double> jump;         // rel_l2 / input_rel_l2 (+inf when the input had no error), or
                                      // noise_ratio / input_noise_ratio when both are known
  std::optional<double> noise_ratio;        // the row's error in units of the reference's noise
  std::optional<double> input_noise_ratio;  // the input's
  bool local = true;
  bool optimizer_only = false;
  std::string summary;                // one paragraph for the console
};

// The row whose error feeds row `r` of a comparison in walk order (see above), if any.
std::optional<std::size_t> input_row(const Comparison& comparison, std::size_t r);

// Fills in the first divergence of a comparison whose rows are in walk order; std::nullopt when no
// row failed. `a` and `b` are the sets the comparison was made from (for the worst elements).
std::optional<FirstDivergence> find_first_divergence(const Comparison& comparison, const TensorSet& a,
                                                     const TensorSet& b, std::size_t worst_count = 5);

nlohmann::json to_json(const FirstDivergence& divergence);

}  // namespace wb::compare
