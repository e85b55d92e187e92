#pragma once
// Which of cuDNN's measured convolution algorithms (the cudnnFind* table, fastest first) a precision may
// run. Plain C++, no cuDNN: the CUDA backend (cuda/conv.cpp) maps each cudnn*AlgoPerf_t onto a
// FoundAlgorithm, and tests feed synthetic tables on any machine.
//
// The rule for fp32 (compared with the CPU backend at 1e-5, so no TF32 and no lossy transforms):
//   - a result whose math type is a tensor-op one (TENSOR_OP, or TENSOR_OP with down-conversion) may have
//     run on TF32 or fp16 tensor cores: rejected;
//   - FMA and DEFAULT results are kept. The search ran with FMA set on the descriptor, and cuDNN 9's Find
//     (a shim over its graph API) may report DEFAULT for the very FMA kernel it measured;
//   - FFT and Winograd are rejected (their transforms cost accuracy);
//   - the chosen algorithm then runs with FMA set on the descriptor, and its workspace is asked again
//     under that math type.
// tf32 and bf16 take the fastest successful result with the math type it was measured with.
// Every precision rejects failed results and those that need more than the workspace limit.

#include <cstddef>
#include <span>
#include <string>

#include "trainer/backend/backend.hpp"

namespace wb::backend {

enum class FoundMath { fma, default_math, tensor_op, tensor_op_conversion, other };

struct FoundAlgorithm {
  int algo = 0;
  std::string name;        // e.g. "IMPLICIT_PRECOMP_GEMM"
  bool ok = true;          // status == CUDNN_STATUS_SUCCESS
  float time_ms = 0.0f;
  std::size_t memory = 0;  // workspace bytes
  FoundMath math = FoundMath::fma;
  bool transform = false;  // an FFT or Winograd algorithm
};

// The math type a chosen result runs with: FMA in fp32, else the one it was measured with.
FoundMath run_math(Precision precision, FoundMath found);

// Why `precision` may not run `r` ("" when it may).
std::string rejection(Precision precision, const FoundAlgorithm& r, std::size_t max_workspace);

// The index of the first result in `found` that `precision` may run, or -1.
int pick_algorithm(Precision precision, std::span<const FoundAlgorithm> found, std::size_t max_workspace);

// The table as text, one line per result with the reason it was rejected: for the error when none
// qualifies.
std::string find_table(Precision precision, std::span<const FoundAlgorithm> found, std::size_t max_workspace);

}  // namespace wb::backend
