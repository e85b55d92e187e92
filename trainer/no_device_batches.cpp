// make_device_batch_source in a build without the CUDA backend: a clear error on request.
#include "trainer/batch_source.hpp"
#include "trainer/config.hpp"

namespace wb::trainer {

std::unique_ptr<BatchSource> make_device_batch_source(data::Pipeline&, backend::Backend&, int, int,
                                                      profiler::Recorder*) {
  throw ConfigError("--device cuda: this wb-train was built without the CUDA backend");
}

}  // namespace wb::trainer
