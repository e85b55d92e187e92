// Our own step's float32 noise, for references that record none (msprobe, TroubleShooter, torch.save,
// a user's dumper): the same step replayed with another summation order (other kernels, another thread
// count), and per tensor how far the replay is from the dump. `wb estimate-noise RUN` runs the replay and
// stores the result in the run file, where `wb compare` finds it.
//
// The stored form is the reference's own (load.hpp's wb.noise, version 1): {"version": 1, "method": ...,
// "tensors": {key: {"l2", "max_abs", "ref_l2"}}, "updates": {key: {"l2", "ref_l2"}}}, with
//   l2 = ||dump - replay||, max_abs = max |dump - replay|, ref_l2 = ||dump||,
// and for param_after and momentum the same of their update (param_after - param, momentum - grad). A
// tensor the replay reproduced bit for bit measured no noise and is left out (it keeps the fixed bounds).
// It lives in the run file's meta under noise_estimate_key(step, rank).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "compare/tensor_set.hpp"

namespace wb::compare {

// meta key of the estimate of one dump: "noise_estimate.step<S>.rank<R>".
std::string noise_estimate_key(std::int32_t step, std::int32_t rank);

struct NoiseEstimate {
  nlohmann::json json;        // the stored form above
  std::int64_t tensors = 0;   // float tensors estimated
  std::int64_t moved = 0;     // of which the replay changed at least one element (those in json)
};

// The estimate from a dump and its replay. The replay must be the same step: its input, label,
// parameters and buffers must equal the dump's bit for bit; otherwise throws CompareError naming the
// first tensor that differs (a replay that is not the same step measures the step's difference, not its
// noise).
NoiseEstimate estimate_noise(const TensorSet& dump, const TensorSet& replay, const std::string& method);

}  // namespace wb::compare
