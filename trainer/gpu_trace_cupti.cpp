// GpuTrace over CUPTI (builds with the CUDA backend and CUPTI).
#include <exception>
#include <iostream>
#include <string>

#include "profiler/record/cuda/cupti_tracer.hpp"
#include "store/writer.hpp"
#include "trainer/gpu_trace.hpp"

namespace wb::trainer {
namespace {

class CuptiTrace final : public GpuTrace {
 public:
  CuptiTrace(profiler::Recorder& recorder, profiler::cuda::CuptiOptions options, int rank)
      : tracer_(recorder, options), rank_(rank) {}
  void flush() override {
    try {
      tracer_.flush();
    } catch (const std::exception& e) {
      std::cerr << "wb-train: rank " << rank_ << ": CUPTI flush failed (" << e.what() << "); kernel rows may be missing\n";
    }
  }

 private:
  profiler::cuda::CuptiTracer tracer_;
  int rank_;
};

}  // namespace

std::unique_ptr<GpuTrace> start_gpu_trace(profiler::Recorder& recorder, store::Writer& writer, bool nvtx, int rank) {
  profiler::cuda::CuptiOptions options;
  options.nvtx = nvtx;
  try {
    auto trace = std::make_unique<CuptiTrace>(recorder, options, rank);
    writer.set_meta("gpu_trace", nvtx ? "cupti+nvtx" : "cupti");
    return trace;
  } catch (const std::exception& e) {
    std::cerr << "wb-train: rank " << rank << ": GPU kernel tracing is off: " << e.what() << "\n";
    writer.set_meta("gpu_trace", std::string("off: ") + e.what());
    return nullptr;
  }
}

}  // namespace wb::trainer
