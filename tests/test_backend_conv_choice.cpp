// Which of cuDNN's measured convolution algorithms a precision may run (trainer/backend/conv_algo_choice),
// fed synthetic Find tables: no GPU needed. The tables are shaped like what cuDNN 9's Find shim returns,
// where the FMA kernel it measured may come back labelled DEFAULT math.
#include <catch2/catch.hpp>

#include <vector>

#include "trainer/backend/conv_algo_choice.hpp"

using wb::backend::FoundAlgorithm;
using wb::backend::FoundMath;
using wb::backend::Precision;

namespace {

constexpr std::size_t kLimit = std::size_t{1} << 30;

FoundAlgorithm row(int algo, const char* name, FoundMath math, float ms, std::size_t mem = 0, bool ok = true,
                   bool transform = false) {
  return {algo, name, ok, ms, mem, math, transform};
}

}  // namespace

TEST_CASE("fp32 keeps a DEFAULT-math result (cuDNN 9's Find shim) and runs it with FMA", "[backend]") {
  const std::vector<FoundAlgorithm> t = {row(1, "IMPLICIT_PRECOMP_GEMM", FoundMath::default_math, 0.21f),
                                         row(0, "IMPLICIT_GEMM", FoundMath::fma, 0.35f)};
  CHECK(wb::backend::pick_algorithm(Precision::fp32, t, kLimit) == 0);
  CHECK(wb::backend::run_math(Precision::fp32, FoundMath::default_math) == FoundMath::fma);
  // tf32 and bf16 run a result with the math type it was measured with.
  CHECK(wb::backend::run_math(Precision::tf32, FoundMath::default_math) == FoundMath::default_math);
  CHECK(wb::backend::run_math(Precision::bf16, FoundMath::tensor_op) == FoundMath::tensor_op);
}

TEST_CASE("fp32 passes over tensor-op results; tf32 and bf16 take them", "[backend]") {
  const std::vector<FoundAlgorithm> t = {row(1, "IMPLICIT_PRECOMP_GEMM", FoundMath::tensor_op, 0.08f),
                                         row(1, "IMPLICIT_PRECOMP_GEMM", FoundMath::tensor_op_conversion, 0.09f),
                                         row(0, "IMPLICIT_GEMM", FoundMath::fma, 0.35f)};
  CHECK(wb::backend::pick_algorithm(Precision::fp32, t, kLimit) == 2);
  CHECK(wb::backend::pick_algorithm(Precision::tf32, t, kLimit) == 0);
  CHECK(wb::backend::pick_algorithm(Precision::bf16, t, kLimit) == 0);
}

TEST_CASE("fp32 passes over FFT and Winograd; failed and oversized results are passed over in every precision",
          "[backend]") {
  const std::vector<FoundAlgorithm> t = {row(6, "WINOGRAD", FoundMath::fma, 0.05f, 0, true, true),
                                         row(5, "FFT_TILING", FoundMath::fma, 0.06f, 1 << 20, true, true),
                                         row(2, "GEMM", FoundMath::fma, 0.07f, kLimit + 1),
                                         row(3, "DIRECT", FoundMath::fma, 0.08f, 0, false),
                                         row(1, "IMPLICIT_PRECOMP_GEMM", FoundMath::fma, 0.2f, 4096)};
  CHECK(wb::backend::pick_algorithm(Precision::fp32, t, kLimit) == 4);
  CHECK(wb::backend::pick_algorithm(Precision::tf32, t, kLimit) == 0);
  CHECK(wb::backend::rejection(Precision::tf32, t[2], kLimit) == "workspace over the limit");
  CHECK(wb::backend::rejection(Precision::bf16, t[3], kLimit) == "failed");
}

TEST_CASE("when nothing qualifies the table says why for each result", "[backend]") {
  const std::vector<FoundAlgorithm> t = {row(1, "IMPLICIT_PRECOMP_GEMM", FoundMath::tensor_op, 0.08f),
                                         row(4, "FFT", FoundMath::fma, 0.1f, 0, true, true),
                                         row(0, "IMPLICIT_GEMM", FoundMath::fma, 0.3f, 0, false)};
  CHECK(wb::backend::pick_algorithm(Precision::fp32, t, kLimit) == -1);
  const std::string table = wb::backend::find_table(Precision::fp32, t, kLimit);
  CAPTURE(table);
  CHECK(table.find("3 result(s) for fp32") != std::string::npos);
  CHECK(table.find("IMPLICIT_PRECOMP_GEMM") != std::string::npos);
  CHECK(table.find("rejected: TENSOR_OP math in fp32") != std::string::npos);
  CHECK(table.find("rejected: FFT/Winograd in fp32") != std::string::npos);
  CHECK(table.find("rejected: failed") != std::string::npos);
  CHECK(wb::backend::pick_algorithm(Precision::fp32, std::vector<FoundAlgorithm>{}, kLimit) == -1);
  CHECK(wb::backend::find_table(Precision::fp32, std::vector<FoundAlgorithm>{}, kLimit).find("none") !=
        std::string::npos);
}
