// GPU kernel tracing for a run (CUPTI): kernels, copies and memsets, each linked to the host range that
// launched it. Profiling never takes training down: a CUPTI that refuses (no permission for the
// activity API, another profiler attached) leaves a note in the run file and a warning, and the run
// goes on with host ranges only.
#pragma once

#include <memory>

namespace wb::profiler {
class Recorder;
}
namespace wb::store {
class Writer;
}

namespace wb::trainer {

class GpuTrace {
 public:
  virtual ~GpuTrace() = default;  // hands over every remaining record
  // Hands over the records CUPTI holds so far; failures are warnings.
  virtual void flush() = 0;
};

// Starts tracing into `recorder`, and notes in `writer`'s meta what is traced ("cupti", "cupti+nvtx"
// or "off: why"). Null when tracing could not start, or in a build without CUPTI.
std::unique_ptr<GpuTrace> start_gpu_trace(profiler::Recorder& recorder, store::Writer& writer, bool nvtx, int rank);

}  // namespace wb::trainer
