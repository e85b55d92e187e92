// Fused momentum-SGD over the contiguous parameter, gradient and momentum buffers (torch.optim.SGD).
#include "trainer/backend/cpu/cpu_backend.hpp"

namespace wb::backend::cpu {

void CpuBackend::sgd_update(const Tensor& params, const Tensor& grads, const Tensor& momentum,
                            std::span<const ParamSegment> segments, const SgdParams& p) {
  apply_threads();
  check_sgd_segments(segments, check_sgd_buffers(params, grads, momentum, nullptr));
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
