#include "trainer/backend/conv_algo_choice.hpp"

#include <cstdio>

namespace wb::backend {

namespace {

const char* math_name(FoundMath m) {
  switch (m) {
    case FoundMath::fma: return "FMA";
    case FoundMath::default_math: return "DEFAULT";
    case FoundMath::tensor_op: return "TENSOR_OP";
    case FoundMath::tensor_op_conversion: return "TENSOR_OP_ALLOW_CONVERSION";
    case FoundMath::other: return "other";
  }
  return "other";
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

}  // namespace

FoundMath run_math(Precision precision, FoundMath found) {
  return precision == Precision::fp32 ? FoundMath::fma : found;
}

std::string rejection(Precision precision, const FoundAlgorithm& r, std::size_t max_workspace) {
  if (!r.ok) return "failed";
  if (r.memory > max_workspace) return "workspace over the limit";
  if (precision != Precision::fp32) return "";
  if (r.math == FoundMath::tensor_op || r.math == FoundMath::tensor_op_conversion || r.math == FoundMath::other) {
    return std::string(math_name(r.math)) + " math in fp32";
  }
  if (r.transform) return "FFT/Winograd in fp32";
  return "";
}

int pick_algorithm(Precision precision, std::span<const FoundAlgorithm> found, std::size_t max_workspace) {
  for (std::size_t i = 0; i < found.size(); ++i) {
    if (rejection(precision, found[i], max_workspace).empty()) return static_cast<int>(i);
  }
  return -1;
}

std::string find_table(Precision precision, std::span<const FoundAlgorithm> found, std::size_t max_workspace) {
  std::string out = "cuDNN's Find returned " + std::to_string(found.size()) + " result(s) for " +
                    precision_name(precision) + ":";
  if (found.empty()) return out + " none";
  for (const FoundAlgorithm& r : found) {
    char line[256];
    const std::string why = rejection(precision, r, max_workspace);
    std::snprintf(line, sizeof line, "\n  algo %d %-24s %-8s %9.3f ms %12zu B  %-26s %s", r.algo, r.name.c_str(),
                  r.ok ? "ok" : "failed", static_cast<double>(r.time_ms), r.memory, math_name(r.math),
                  why.empty() ? "usable" : ("rejected: " + why).c_str());
    out += line;
  }
  return out;
}

}  // namespace wb::backend
