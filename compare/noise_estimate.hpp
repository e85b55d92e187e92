// Our own step's float32 noise, for references that record none (msprobe, TroubleShooter, torch.save,
// a user's dumper): the same step replayed with other summation orders (oneDNN's kernels of other ISAs),
// and per tensor the largest distance of a replay from the dump. `wb estimate-noise RUN` runs the replays
// and stores the result in the run file, where `wb compare` finds it.
//
// The stored form is the reference's own (load.hpp's wb.noise, version 1): {"version": 1, "method": ...,
// "tensors": {key: {"l2", "max_abs", "ref_l2"}}, "updates": {key: {"l2", "ref_l2"}}}, with
//   l2 = max over the replays of ||dump - replay||, max_abs = of max |dump - replay|, ref_l2 = ||dump||,
// and for param_after and momentum the same of their update (param_after - param, momentum - grad). A
// tensor every replay reproduced bit for bit measured no noise and is left out (it keeps the fixed bounds).
// It lives in the run file's meta under noise_estimate_key(step, rank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compare/tensor_set.hpp"

namespace wb::compare {

// meta key of the estimate of one dump: "noise_estimate.step<S>.rank<R>".
std::string noise_estimate_key(std::int32_t step, std::int32_t rank);

struct NoiseEstimate {
  nlohmann::json json;        // the stored form above
  std::int64_t tensors = 0;   // float tensors estimated
  std::int64_t moved = 0;     // of which a replay changed at least one element (those in json)
};

// The estimate from a dump and its replays: per tensor the largest distance of any replay (one replay
// is one draw of the noise, and a small draw would make a tight bound). Each replay must be the same
// step: its input, label, parameters and buffers must equal the dump's bit for bit; otherwise throws
// CompareError naming the first tensor that differs (a replay that is not the same step measures the
// step's difference, not its noise).
NoiseEstimate estimate_noise(const TensorSet& dump, const std::vector<const TensorSet*>& replays,
                             const std::string& method);

}  // namespace wb::compare
