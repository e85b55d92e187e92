// Verdict profiles: which checks a tensor must pass, by kind and dtype, and the judgement itself.
//
//   migration-fp32 (default)  a port against its PyTorch fp32 reference: inputs and initial state
//                             bit-exact; activations cos >= 0.9999, relL2 <= 1e-3; loss |d| <= 1e-4;
//                             gradients cos >= 0.995, relL2 <= 0.1; updates likewise; momentum - grad
//                             relL2 <= 0.5; running statistics relL2 <= 1e-4. Measured on correct fp32
//                             implementations of one ResNet-50 step (verdict.cpp has the evidence,
//                             bench/compare_thresholds.py reproduces it)
//   strict                    torch.testing.assert_close's defaults: every element within
//                             atol + rtol |b| for the reference dtype, same dtype, NaN fails
//   msprobe                   Ascend msprobe's "Accuracy Reached or Not": fails when cosine < 0.99 and
//                             max abs > 1e-3, or cosine < 0.9, or max abs > 1, or any NaN/Inf
//
// Systematic scale (migration-fp32; compare/metrics.hpp has the scale s and its noise bound p): a is
// s b plus noise, with s clear of what noise can produce. Noise of rel-L2 r moves the projection
// <d,b>/<b,b> by at most r (Cauchy-Schwarz), and noise pointing in a random direction lines up with b
// as well as d does with a chance under p = (residual rel-L2 / r)^(n-1). So the scale is systematic
// when |s - 1| >= r / 2 (it explains at least a quarter of the error energy; the fp32 noise of a
// correct step reaches 0.37 r on 64-element tensors and under 0.17 r on large ones), p <= 1e-9, and
// |s - 1| >= scale_shift_min (1e-4: rounding-level effects such as approximate reciprocal square
// roots are no bug). A row with such a scale fails with "scaled by S (systematic)" even when its
// rel-L2 is within bounds: a 1% gradient scale passes rel-L2 and cosine, but not the projection,
// while the gradient's own fp32 noise is not several times the scale (a 1% scale is caught under 5e-3
// of noise and explains too little of 2.7e-2 to be called systematic).
//
// Noise-aware bounds (migration-fp32). When the reference recorded its own float32 noise on a tensor
// (torch_step.py replays the step in float64 as well: NoiseScale in tensor_set.hpp), the tensor passes
// when its rel-L2 is within max(fixed bound, k x the reference's own rel-L2 against float64), k =
// kNoiseK: a correct port is about as far from the exact result as PyTorch's float32 is, so an
// ill-conditioned tensor (a batch norm over 4 values per channel) gets the room its conditioning needs,
// and a well-conditioned one keeps the fixed bound above as its floor, so a 1% error in an activation
// still fails. The update's bound likewise; the loss's absolute bound becomes max(1e-4, k x |loss32 -
// loss64|). A cosine bound widens with its rel-L2 bound R (rel-L2 <= R implies cosine >= sqrt(1 - R^2)).
// A systematic scale (below) must also stand kScaleNoiseK times clear of the reference's noise: noise
// that happens to point along b (one channel of a batch norm over 4 values dominating a gradient) is a
// scale as well, and the noise of a correct port's tensors stays under 2x the reference's.
// A ReLU whose input is within float32 noise of 0 goes the other way in a correct port now and then,
// which moves gradient elements by a whole term: far more than rounding. torch_step.py measures that
// too (flip_l2: a float64 replay with the ReLU inputs within one standard deviation of their rounding
// noise of zero flipped), and the noise is the larger of the two. Only with that measure do the floors
// of gradients, momentum and updated parameters come down from 0.1 to 1e-3 (flip_floor); with rounding
// noise alone they keep the fixed 0.1 (docs/guide/compare.md). A reference without noise keeps the
// fixed bounds.
//
// Every profile fails a shape mismatch and non-finite values at different positions. Per-tensor
// thresholds come from the mapping file (match.hpp) and replace single fields.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "compare/metrics.hpp"
#include "compare/tensor_set.hpp"

namespace wb::compare {

enum class Profile { migration_fp32, strict, msprobe };

std::string_view profile_name(Profile profile);
// Throws CompareError naming the text and the valid names.
Profile profile_from_name(std::string_view name);

// The checks applied to one tensor; unset optionals are not checked.
struct Thresholds {
  bool bit_exact = false;                    // identical dtype and bytes
  std::optional<double> cosine_min;          // cosine >= this (a NaN cosine fails)
  std::optional<double> rel_l2_max;          // rel-L2 <= this
  std::optional<double> max_abs_max;         // max abs error <= this
  std::optional<double> allclose_ratio_min;  // fraction within atol + rtol |b| >= this
  // Limits on the update metrics (compare.hpp): after - before for param_after, momentum - grad for
  // momentum, when both sides hold the base tensor.
  std::optional<double> update_cosine_min;
  std::optional<double> update_rel_l2_max;
  bool all_close = false;          // strict: every element within tolerance
  bool dtype_must_match = false;   // strict
  bool nan_fails = false;          // strict: NaN fails even at matching positions (equal_nan = False)
  bool nonfinite_fails = false;    // msprobe: any NaN/Inf fails
  bool msprobe_rule = false;       // msprobe's cosine / max abs rule
  // Fail a systematic scale (see above) at least this far from 1; unset: no scale check. Applied to
  // the update metrics when the kind has them (param_after), else to the values.
  std::optional<double> scale_shift_min;
  // Noise-aware bounds (see above): k, and the rel-L2 floors of the value and of the update (the fixed
  // rel_l2_max and update_rel_l2_max by default). Unset noise_k: the fixed thresholds whatever the
  // reference recorded.
  std::optional<double> noise_k;
  std::optional<double> noise_floor;
  std::optional<double> update_noise_floor;
  // The floors when the noise also counts flipped ReLUs (NoiseScale::flip_l2), where they are lower.
  std::optional<double> flip_floor;
  std::optional<double> update_flip_floor;
  Tolerance tolerance;             // of the allclose count
};

// How many times the reference's own float32 noise a correct port may be from it (docs/guide/compare.md
// has the measurements behind it).
inline constexpr double kNoiseK = 5.0;
inline constexpr double kScaleNoiseK = 3.0;

// a / b for norms: 0 when a is 0, +inf when only b is (a rel-L2, or a distance in units of a noise).
double norm_ratio(double a, double b);

// The thresholds a tensor is judged by when the reference recorded its noise `noise` (see above):
// numeric bounds in place of the noise rule. `t` itself when it has no noise_k.
Thresholds with_noise(const Thresholds& t, const NoiseScale& noise, const Metrics& metrics, const Metrics* update);

// The thresholds a profile gives a tensor of this kind whose reference has this dtype.
Thresholds default_thresholds(Profile profile, TensorKind kind, store::DType reference_dtype);

// Replaces the fields named in a JSON object ({"cosine_min": 0.999, "rel_l2_max": 1e-3, ...}; a null
// value removes a check). Throws CompareError naming `origin` and the field for unknown fields or
// wrong types.
void apply_threshold_override(Thresholds& thresholds, const nlohmann::json& fields, std::string_view origin);

// Short human description ("cos>=0.9999 relL2<=0.001"); with `noise_applied`, the noise rule in place of
// the fixed bounds it replaces ("relL2<=max(0.001, 5x noise)").
// `flips`: the noise counts flipped ReLUs, so the flip floors apply.
std::string describe(const Thresholds& thresholds, bool noise_applied = false, bool flips = false);
nlohmann::json to_json(const Thresholds& thresholds);

// A systematic scale explains at least this share of rel-L2, with a noise chance at most this.
inline constexpr double kScaleExplainedMin = 0.5;
inline constexpr double kScaleNoisePMax = 1e-9;

// The scale s of `metrics` when it is systematic (see above) and |s - 1| >= shift_min.
std::optional<double> systematic_scale(const Metrics& metrics, double shift_min = 0.0);

// "scaled by 1.01 (systematic): |s-1| 0.01 is 0.71 of its rel-L2 0.014, noise chance < 1e-300".
std::string describe_scale(const Metrics& metrics);

struct Verdict {
  bool pass = true;
  std::string reason;  // the first failed check, empty when passing
};

// `update` holds the update metrics (compare.hpp) when they could be computed; `update_label` names
// them in the reason ("update", "momentum-grad").
Verdict judge(const Thresholds& thresholds, const Metrics& metrics, const Metrics* update, bool same_dtype,
              std::string_view update_label = "update");

}  // namespace wb::compare
