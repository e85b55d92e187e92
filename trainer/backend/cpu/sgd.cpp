// Fused momentum-SGD over the contiguous parameter, gradient and momentum buffers (torch.optim.SGD).
#include <string>

#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::backend::cpu {

void CpuBackend::sgd_update(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                            std::span<const ParamSegment> segments, const SgdParams& p) {
  apply_threads();
  for (const Tensor* t : {&params, &grads, &momentum}) {
    check_f32(*t, 0, "sgd_update", "buffer");
    if (!t->is_plain()) throw BackendError("sgd_update: buffers must be plain");
  }
  const std::size_t total = static_cast<std::size_t>(params.numel());
  if (static_cast<std::size_t>(grads.numel()) != total || static_cast<std::size_t>(momentum.numel()) != total) {
    throw BackendError("sgd_update: params, grads and momentum differ in size (" + std::to_string(total) + ", " +
                       std::to_string(grads.numel()) + ", " + std::to_string(momentum.numel()) + ")");
  }
  for (const auto& s : segments) {
    if (s.offset + s.numel > total) {
      throw BackendError("sgd_update: segment [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.numel) +
                         ") is outside the " + std::to_string(total) + "-element buffers");
    }
  }
  bump_param_generation();
  float* w = params.data_as<float>();
  const float* g = grads.data_as<float>();
  float* buf = momentum.data_as<float>();
  const float lr = p.lr, m = p.momentum;
  const bool first = p.first_step, nesterov = p.nesterov, use_momentum = p.momentum != 0.0f;
  const std::size_t nseg = segments.size();
  const ParamSegment* seg = segments.data();
#pragma omp parallel
  for (std::size_t k = 0; k < nseg; ++k) {
    const float wd = seg[k].decay ? p.weight_decay : 0.0f;
    const std::int64_t begin = static_cast<std::int64_t>(seg[k].offset);
    const std::int64_t end = begin + static_cast<std::int64_t>(seg[k].numel);
#pragma omp for simd schedule(static) nowait
    for (std::int64_t i = begin; i < end; ++i) {
      float d = g[i] + wd * w[i];
      if (use_momentum) {
        float b = first ? d : m * buf[i] + d;
        buf[i] = b;
        d = nesterov ? d + m * b : b;
      }
      w[i] -= lr * d;
    }
  }
}

}  // namespace wb::backend::cpu
