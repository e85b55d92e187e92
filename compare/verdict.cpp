// Profile thresholds and the per-tensor judgement.
//
// migration-fp32 thresholds come from bench/compare_thresholds.py: one ResNet-50 step (batch 32,
// 32x32, SGD lr 0.1 momentum 0.9 weight decay 1e-4, random init) computed by two correct fp32
// implementations (torch with and without oneDNN convolutions) and in float64, seeds 0 and 1. Worst
// case over all tensors of a kind; "noise" is correct against correct, faults are planted:
//
//   kind                 noise (fp32 vs fp32 / fp64)        BN eps 1e-5 -> 1e-4    no weight decay
//   act                  relL2 1.3e-4, cos >= 0.99999999    relL2 1.2e-2           -
//   loss                 |d| 1.8e-5                         |d| 1.4e-3             -
//   grad                 relL2 4.3e-2, cos >= 0.99907       relL2 0.25, cos 0.967  -
//   momentum             as grad                            as grad                relL2 5.7e-2, cos 0.9984
//   momentum - grad      relL2 9.4e-2, cos >= 0.9956        -                      relL2 1 (A is 0)
//   param_after          relL2 4.3e-2 (zero-init biases)    as grad                value relL2 1e-5
//   buffer_after         relL2 1.6e-5                       relL2 1.5e-3           -
//
// The limits first asked for (activations relL2 <= 1e-4, gradients and updated parameters
// relL2 <= 1e-3, |d loss| <= 1e-5) would fail a correct port: the deepest BatchNorm outputs, and
// every gradient (BatchNorm backward sums over the batch with heavy cancellation at 1x1 and 2x2
// spatial sizes), are noisier than that in fp32. The limits used sit between noise and faults:
//   activations        cos >= 0.9999 and relL2 <= 1e-3 (7x above the noise, 12x under BN eps)
//   loss               |d| <= 1e-4
//   gradients          cos >= 0.995 and relL2 <= 0.1 (cosine for direction, relL2 for scale errors)
//   updated params     the update (after - before) as gradients; the value relL2 <= 0.1. A missing
//                      weight decay moves the value by 1e-5 relative: only the update can show it
//   momentum           as gradients, and momentum - grad (what the optimizer adds: weight decay,
//                      earlier momentum) relL2 <= 0.5: the gradient noise cancels out of it, so a
//                      missing or wrong weight decay shows as relL2 ~1 while correct fp32 stays < 0.1
//   running stats      relL2 <= 1e-4
//   input, label, initial parameters and buffers: bit-exact.
// A momentum fault that hides in the gradient noise (no weight decay: 5.7e-2 against 4.3e-2) is
// therefore caught by the momentum - grad check, which makes it an optimizer-only divergence.
#include "compare/verdict.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace wb::compare {
namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// A floor under noise: the fixed one, or the flip floor when flipped ReLUs are measured and it is lower.
double floor_under_noise(double fixed, const std::optional<double>& flip_floor, bool flips) {
  return flips && flip_floor ? std::min(fixed, *flip_floor) : fixed;
}

// The rel-L2 floor of gradients, momentum and updates when the noise counts flipped ReLUs (verdict.hpp).
constexpr double kFlipFloor = 1e-3;

// Below this a systematic scale is rounding-level (see verdict.hpp), not a bug worth a failure.
constexpr double kScaleShiftMin = 1e-4;

Tolerance strict_tolerance(store::DType dtype) {
  switch (dtype) {
    case store::DType::F16: return {1e-3, 1e-5};
    case store::DType::BF16: return {1.6e-2, 1e-5};
    case store::DType::F32: return {1.3e-6, 1e-5};
    case store::DType::F64: return {1e-7, 1e-7};
    default: return {0.0, 0.0};  // integers and bool compare exactly
  }
}

void set_optional(std::optional<double>& field, const nlohmann::json& v, std::string_view origin, const std::string& key) {
  if (v.is_null()) {
    field.reset();
  } else if (v.is_number()) {
    field = v.get<double>();
  } else {
    throw CompareError(std::string(origin) + ": threshold '" + key + "' must be a number or null");
  }
}

void set_bool(bool& field, const nlohmann::json& v, std::string_view origin, const std::string& key) {
  if (!v.is_boolean()) throw CompareError(std::string(origin) + ": threshold '" + key + "' must be true or false");
  field = v.get<bool>();
}

}  // namespace

std::string_view profile_name(Profile profile) {
  switch (profile) {
    case Profile::migration_fp32: return "migration-fp32";
    case Profile::strict: return "strict";
    case Profile::msprobe: return "msprobe";
  }
  return "?";
}

Profile profile_from_name(std::string_view name) {
  if (name == "migration-fp32") return Profile::migration_fp32;
  if (name == "strict") return Profile::strict;
  if (name == "msprobe") return Profile::msprobe;
  throw CompareError("--profile: unknown profile '" + std::string(name) +
                     "' (expected migration-fp32, strict or msprobe)");
}

Thresholds default_thresholds(Profile profile, TensorKind kind, store::DType reference_dtype) {
  Thresholds t;
  switch (profile) {
    case Profile::strict:
      t.tolerance = strict_tolerance(reference_dtype);
      t.all_close = true;
      t.dtype_must_match = true;
      t.nan_fails = true;
      return t;
    case Profile::msprobe:
      t.msprobe_rule = true;
      t.nonfinite_fails = true;
      return t;
    case Profile::migration_fp32:
      break;
  }
  switch (kind) {
    case TensorKind::input:
    case TensorKind::label:
    case TensorKind::param:
    case TensorKind::buffer:
      t.bit_exact = true;
      break;
    case TensorKind::act:
    case TensorKind::other:
      t.cosine_min = 0.9999;
      t.rel_l2_max = 1e-3;
      t.scale_shift_min = kScaleShiftMin;
      break;
    case TensorKind::loss:
      t.max_abs_max = 1e-4;
      break;
    case TensorKind::grad:
      t.cosine_min = 0.995;
      t.rel_l2_max = 0.1;
      t.scale_shift_min = kScaleShiftMin;
      break;
    case TensorKind::momentum:
      t.cosine_min = 0.995;
      t.rel_l2_max = 0.1;
      t.update_rel_l2_max = 0.5;
      t.scale_shift_min = kScaleShiftMin;
      break;
    case TensorKind::param_after:
      t.rel_l2_max = 0.1;
      t.update_cosine_min = 0.995;
      t.update_rel_l2_max = 0.1;
      t.scale_shift_min = kScaleShiftMin;
      break;
    case TensorKind::buffer_after:
      t.rel_l2_max = 1e-4;
      t.scale_shift_min = kScaleShiftMin;
      break;
  }
  // The fixed bounds stay the floors under noise (verdict.hpp), lower with flipped ReLUs measured.
  t.noise_floor = t.rel_l2_max;
  t.update_noise_floor = t.update_rel_l2_max;
  if (kind == TensorKind::grad || kind == TensorKind::momentum || kind == TensorKind::param_after) {
    t.flip_floor = t.update_flip_floor = kFlipFloor;
  }
  t.noise_k = kNoiseK;
  return t;
}

void apply_threshold_override(Thresholds& t, const nlohmann::json& fields, std::string_view origin) {
  if (!fields.is_object()) throw CompareError(std::string(origin) + ": thresholds must be a JSON object");
  for (const auto& [key, v] : fields.items()) {
    if (key == "match" || key == "pattern") continue;  // the selector of a rule, not a threshold
    if (key == "bit_exact") set_bool(t.bit_exact, v, origin, key);
    else if (key == "cosine_min") set_optional(t.cosine_min, v, origin, key);
    else if (key == "rel_l2_max") set_optional(t.rel_l2_max, v, origin, key);
    else if (key == "max_abs_max") set_optional(t.max_abs_max, v, origin, key);
    else if (key == "allclose_ratio_min") set_optional(t.allclose_ratio_min, v, origin, key);
    else if (key == "update_cosine_min") set_optional(t.update_cosine_min, v, origin, key);
    else if (key == "update_rel_l2_max") set_optional(t.update_rel_l2_max, v, origin, key);
    else if (key == "all_close") set_bool(t.all_close, v, origin, key);
    else if (key == "dtype_must_match") set_bool(t.dtype_must_match, v, origin, key);
    else if (key == "nan_fails") set_bool(t.nan_fails, v, origin, key);
    else if (key == "nonfinite_fails") set_bool(t.nonfinite_fails, v, origin, key);
    else if (key == "msprobe_rule") set_bool(t.msprobe_rule, v, origin, key);
    else if (key == "scale_shift_min") set_optional(t.scale_shift_min, v, origin, key);
    else if (key == "noise_k") set_optional(t.noise_k, v, origin, key);
    else if (key == "noise_floor") set_optional(t.noise_floor, v, origin, key);
    else if (key == "update_noise_floor") set_optional(t.update_noise_floor, v, origin, key);
    else if (key == "flip_floor") set_optional(t.flip_floor, v, origin, key);
    else if (key == "update_flip_floor") set_optional(t.update_flip_floor, v, origin, key);
    else if (key == "rtol" || key == "atol") {
      if (!v.is_number()) throw CompareError(std::string(origin) + ": threshold '" + key + "' must be a number");
      (key == "rtol" ? t.tolerance.rtol : t.tolerance.atol) = v.get<double>();
    } else {
      throw CompareError(std::string(origin) + ": unknown threshold '" + key +
                         "' (expected bit_exact, cosine_min, rel_l2_max, max_abs_max, allclose_ratio_min, "
                         "update_cosine_min, update_rel_l2_max, rtol, atol, all_close, dtype_must_match, "
                         "nan_fails, nonfinite_fails, msprobe_rule, scale_shift_min, noise_k, noise_floor, "
                         "update_noise_floor, flip_floor, update_flip_floor)");
    }
  }
}

std::string describe(const Thresholds& t, bool noise_applied, bool flips) {
  std::string s;
  auto add = [&](const std::string& part) {
    if (!s.empty()) s += ' ';
    s += part;
  };
  noise_applied = noise_applied && t.noise_k.has_value();
  const std::string k = noise_applied ? fmt(*t.noise_k) + "x noise" : "";
  if (t.bit_exact) add("bit-exact");
  if (t.msprobe_rule) add("msprobe(cos>=0.99|abs<=1e-3, cos>=0.9, abs<=1)");
  if (noise_applied && t.noise_floor) {
    const double floor = floor_under_noise(*t.noise_floor, t.flip_floor, flips);
    if (t.cosine_min && floor >= *t.noise_floor) add("cos>=" + fmt(*t.cosine_min));
    add("relL2<=max(" + fmt(floor) + ", " + k + ")");
  } else {
    if (t.cosine_min) add("cos>=" + fmt(*t.cosine_min));
    if (t.rel_l2_max) add("relL2<=" + fmt(*t.rel_l2_max));
  }
  if (t.max_abs_max) add(noise_applied && !t.noise_floor ? "abs<=max(" + fmt(*t.max_abs_max) + ", " + k + ")"
                                                         : "abs<=" + fmt(*t.max_abs_max));
  if (t.allclose_ratio_min) add("allclose>=" + fmt(*t.allclose_ratio_min));
  if (t.all_close || t.allclose_ratio_min) add("(rtol=" + fmt(t.tolerance.rtol) + ",atol=" + fmt(t.tolerance.atol) + ")");
  if (noise_applied && t.update_noise_floor) {
    const double floor = floor_under_noise(*t.update_noise_floor, t.update_flip_floor, flips);
    if (t.update_cosine_min && floor >= *t.update_noise_floor) add("update cos>=" + fmt(*t.update_cosine_min));
    add("update relL2<=max(" + fmt(floor) + ", " + k + ")");
  } else {
    if (t.update_cosine_min) add("update cos>=" + fmt(*t.update_cosine_min));
    if (t.update_rel_l2_max) add("update relL2<=" + fmt(*t.update_rel_l2_max));
  }
  if (t.dtype_must_match) add("same dtype");
  if (t.nan_fails) add("no NaN");
  if (t.nonfinite_fails) add("no NaN/Inf");
  if (t.scale_shift_min) {
    add("no systematic scale >=" + (noise_applied ? "max(" + fmt(*t.scale_shift_min) + ", " + fmt(kScaleNoiseK) + "x noise)"
                                                  : fmt(*t.scale_shift_min)));
  }
  return s;
}

nlohmann::json to_json(const Thresholds& t) {
  nlohmann::json j = nlohmann::json::object();
  auto opt = [&](const char* k, const std::optional<double>& v) {
    if (v) j[k] = *v;
  };
  if (t.bit_exact) j["bit_exact"] = true;
  opt("cosine_min", t.cosine_min);
  opt("rel_l2_max", t.rel_l2_max);
  opt("max_abs_max", t.max_abs_max);
  opt("allclose_ratio_min", t.allclose_ratio_min);
  opt("update_cosine_min", t.update_cosine_min);
  opt("update_rel_l2_max", t.update_rel_l2_max);
  if (t.all_close) j["all_close"] = true;
  if (t.dtype_must_match) j["dtype_must_match"] = true;
  if (t.nan_fails) j["nan_fails"] = true;
  if (t.nonfinite_fails) j["nonfinite_fails"] = true;
  if (t.msprobe_rule) j["msprobe_rule"] = true;
  opt("scale_shift_min", t.scale_shift_min);
  opt("noise_k", t.noise_k);
  opt("noise_floor", t.noise_floor);
  opt("update_noise_floor", t.update_noise_floor);
  opt("flip_floor", t.flip_floor);
  opt("update_flip_floor", t.update_flip_floor);
  j["rtol"] = t.tolerance.rtol;
  j["atol"] = t.tolerance.atol;
  return j;
}

double norm_ratio(double a, double b) {
  if (a == 0.0) return 0.0;
  return b > 0.0 ? a / b : std::numeric_limits<double>::infinity();
}

Thresholds with_noise(const Thresholds& t, const NoiseScale& n, const Metrics& m, const Metrics* update) {
  if (!t.noise_k) return t;
  Thresholds e = t;
  const double k = *t.noise_k;
  // rel-L2 <= R implies cosine >= sqrt(1 - R^2): a cosine bound widens with the rel-L2 bound it goes
  // with, once the noise takes that over the floor.
  auto widen_cosine = [](std::optional<double>& cosine_min, double rel_max) {
    if (!cosine_min) return;
    if (rel_max >= 1.0) cosine_min.reset();
    else cosine_min = std::min(*cosine_min, std::sqrt(1.0 - rel_max * rel_max));
  };
  const bool flips = n.flip_l2.has_value();
  // With flipped ReLUs measured, the cosine bound follows the rel-L2 bound alone.
  if (t.noise_floor) {
    const double floor = floor_under_noise(*t.noise_floor, t.flip_floor, flips);
    e.rel_l2_max = std::max(floor, k * norm_ratio(n.value_l2(), m.b.l2norm));
    if (*e.rel_l2_max > *t.noise_floor) widen_cosine(e.cosine_min, *e.rel_l2_max);
    if (flips && t.flip_floor && *e.rel_l2_max < *t.noise_floor) e.cosine_min.reset();
  } else if (t.max_abs_max) {
    e.max_abs_max = std::max(*t.max_abs_max, k * std::max(n.max_abs, n.value_l2()));
  }
  const std::optional<double> update_l2 = n.update_value_l2();
  if (t.update_noise_floor && update != nullptr && update_l2) {
    const double floor = floor_under_noise(*t.update_noise_floor, t.update_flip_floor, flips);
    e.update_rel_l2_max = std::max(floor, k * norm_ratio(*update_l2, update->b.l2norm));
    if (*e.update_rel_l2_max > *t.update_noise_floor) widen_cosine(e.update_cosine_min, *e.update_rel_l2_max);
    if (flips && t.update_flip_floor && *e.update_rel_l2_max < *t.update_noise_floor) e.update_cosine_min.reset();
  }
  // Noise pointing along b is a scale too: a scale is systematic only when it stands clear of that.
  if (t.scale_shift_min) {
    const bool of_update = update != nullptr && update_l2;
    const double scale_noise = of_update ? norm_ratio(*update_l2, update->b.l2norm) : norm_ratio(n.value_l2(), m.b.l2norm);
    e.scale_shift_min = std::max(*t.scale_shift_min, kScaleNoiseK * scale_noise);
  }
  return e;
}

Verdict judge(const Thresholds& t, const Metrics& m, const Metrics* update, bool same_dtype, std::string_view update_label) {
  auto fail = [](std::string reason) { return Verdict{false, std::move(reason)}; };
  if (t.dtype_must_match && !same_dtype) return fail("dtypes differ");
  if (m.nonfinite_mismatch > 0) {
    return fail("NaN/Inf at different positions (" + std::to_string(m.nonfinite_mismatch) +
                " element(s), first at index " + std::to_string(m.first_nonfinite_mismatch) + ")");
  }
  if (t.nan_fails && m.a.nan_count + m.b.nan_count > 0) {
    return fail("NaN present (A " + std::to_string(m.a.nan_count) + ", B " + std::to_string(m.b.nan_count) + ")");
  }
  if (t.nonfinite_fails && m.has_nonfinite()) {
    return fail("NaN/Inf present (A " + std::to_string(m.a.nan_count) + " NaN " + std::to_string(m.a.inf_count) +
                " Inf, B " + std::to_string(m.b.nan_count) + " NaN " + std::to_string(m.b.inf_count) + " Inf)");
  }
  if (t.bit_exact && !m.bit_exact) {
    return fail("not bit-exact (max abs " + fmt(m.max_abs) + " at index " + std::to_string(m.max_abs_index) + ")");
  }
  if (t.msprobe_rule) {
    // msprobe reports cosine as unsupported for 0-d and length-1 tensors; only max abs judges them.
    const bool has_cos = m.numel > 1;
    const double cos = m.cosine;
    if (has_cos && std::isnan(cos)) return fail("cosine undefined (one side is all zeros)");
    if (has_cos && cos < 0.99 && m.max_abs > 1e-3) {
      return fail("cosine " + fmt(cos) + " < 0.99 and max abs " + fmt(m.max_abs) + " > 0.001");
    }
    if (has_cos && cos < 0.9) return fail("cosine " + fmt(cos) + " < 0.9");
    if (m.max_abs > 1.0) return fail("max abs " + fmt(m.max_abs) + " > 1");
  }
  auto check_similarity = [&](const Metrics& x, const std::optional<double>& cos_min,
                              const std::optional<double>& rel_max, const std::string& what) -> Verdict {
    if (cos_min) {
      if (std::isnan(x.cosine)) return fail(what + "cosine undefined (one side is all zeros)");
      if (x.cosine < *cos_min) return fail(what + "cosine " + fmt(x.cosine) + " < " + fmt(*cos_min));
    }
    if (rel_max && !(x.rel_l2 <= *rel_max)) return fail(what + "rel-L2 " + fmt(x.rel_l2) + " > " + fmt(*rel_max));
    return {};
  };
  if (Verdict v = check_similarity(m, t.cosine_min, t.rel_l2_max, ""); !v.pass) return v;
  if (t.max_abs_max && m.max_abs > *t.max_abs_max) {
    return fail("max abs " + fmt(m.max_abs) + " > " + fmt(*t.max_abs_max) + " at index " + std::to_string(m.max_abs_index));
  }
  if (t.allclose_ratio_min && m.allclose_ratio < *t.allclose_ratio_min) {
    return fail("allclose ratio " + fmt(m.allclose_ratio) + " < " + fmt(*t.allclose_ratio_min));
  }
  if (t.all_close && m.allclose_count < m.compared) {
    const std::int64_t bad = m.compared - m.allclose_count;
    return fail("mismatched elements " + std::to_string(bad) + "/" + std::to_string(m.compared) + " (" +
                fmt(100.0 * static_cast<double>(bad) / static_cast<double>(m.compared)) +
                "%), greatest abs diff " + fmt(m.max_abs) + " at index " + std::to_string(m.max_abs_index) +
                " (rtol " + fmt(t.tolerance.rtol) + ", atol " + fmt(t.tolerance.atol) + ")");
  }
  if (update != nullptr) {
    if (Verdict v = check_similarity(*update, t.update_cosine_min, t.update_rel_l2_max, std::string(update_label) + " "); !v.pass) return v;
  }
  if (t.scale_shift_min) {
    const Metrics& scaled = update != nullptr ? *update : m;
    if (systematic_scale(scaled, *t.scale_shift_min)) {
      return fail((update != nullptr ? std::string(update_label) + " " : std::string()) + describe_scale(scaled));
    }
  }
  return {};
}

std::optional<double> systematic_scale(const Metrics& m, double shift_min) {
  if (m.compared < 2 || !std::isfinite(m.scale) || !std::isfinite(m.rel_l2) || m.rel_l2 == 0.0) return std::nullopt;
  const double shift = std::fabs(m.scale - 1.0);
  if (shift < shift_min || shift < kScaleExplainedMin * m.rel_l2 || !(m.scale_noise_p <= kScaleNoisePMax)) {
    return std::nullopt;
  }
  return m.scale;
}

std::string describe_scale(const Metrics& m) {
  char s[32];
  std::snprintf(s, sizeof s, "%.4g", m.scale);
  const double shift = std::fabs(m.scale - 1.0);
  return std::string("scaled by ") + s + " (systematic): |s-1| " + fmt(shift) + " is " +
         fmt(m.rel_l2 > 0 ? shift / m.rel_l2 : 0.0) + " of its rel-L2 " + fmt(m.rel_l2) +
         (m.scale_noise_p > 0 ? ", chance from noise " + fmt(m.scale_noise_p) : std::string(", chance from noise < 1e-300"));
}

}  // namespace wb::compare
