// The synchronised batch-norm ops of a backend that does not have them: a clear error naming it (the cpu
// and cuda backends override them).
#include <string>

#include "trainer/backend/backend.hpp"

namespace wb::backend {

namespace {
[[noreturn]] void missing(const Backend& b, const char* op) {
  throw BackendError(std::string(op) + ": the " + std::string(b.name()) +
                     " backend has no synchronised batch norm (--sync-bn runs on the cpu and cuda backends)");
}
}  // namespace

void Backend::batchnorm_sums(const Tensor&, std::span<double>) { missing(*this, "batchnorm_sums"); }

void Backend::batchnorm_forward_with_stats(const Tensor&, const Tensor&, const Tensor&, Tensor&, const Tensor&,
                                           const Tensor&, std::span<const double>, std::span<const double>,
                                           std::int64_t, BatchNormState&, const BatchNormParams&) {
  missing(*this, "batchnorm_forward_with_stats");
}

void Backend::batchnorm_backward_reduce(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const BatchNormState&, Tensor&, const Tensor&, const Tensor&,
                                        std::span<double>, const BatchNormParams&) {
  missing(*this, "batchnorm_backward_reduce");
}

void Backend::batchnorm_backward_elemt(const Tensor&, const Tensor&, const BatchNormState&, Tensor&,
                                       std::span<const double>, std::int64_t, const BatchNormParams&) {
  missing(*this, "batchnorm_backward_elemt");
}

}  // namespace wb::backend
