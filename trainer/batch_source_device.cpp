// The device batch source (builds with the CUDA backend): the device prefetch queue's copies of the
// host pipeline's batches, which the model reads from device memory.
#include <stdexcept>
#include <string>

#include "store/writer.hpp"
#include "trainer/batch_source.hpp"
#include "trainer/gpu/device_queue.hpp"
#include "trainer/observers.hpp"

namespace wb::trainer {
namespace {

class DeviceBatch final : public Batch {
 public:
  explicit DeviceBatch(backend::Backend& backend) : backend_(backend) {}
  gpu::DeviceBatchRef ref;

  float forward(model::ResNet50& model) override { return model.forward(ref.images(), ref.labels()); }
  // Exactly the bytes the model reads: the device copy, brought back.
  void to_host(std::vector<float>& images, std::vector<std::int32_t>& labels) override {
    images.resize(static_cast<std::size_t>(ref.images().numel()));
    labels.resize(static_cast<std::size_t>(ref.labels().numel()));
    backend_.to_host(ref.images(), images);
    backend_.to_host(ref.labels(), labels);
  }
  void step_done() override { ref.release(); }

 private:
  backend::Backend& backend_;
};

class DeviceBatchSource final : public BatchSource {
 public:
  DeviceBatchSource(data::Pipeline& pipeline, backend::Backend& backend, int device, int slots,
                    profiler::Recorder* recorder)
      : observer_(recorder, "device_queue", "data_wait"),
        queue_(pipeline, backend, gpu::DeviceQueueOptions{device, slots}, &observer_),
        batch_(backend) {}

  Batch& pop(std::int64_t step) override {
    batch_.ref = queue_.pop();
    if (!batch_.ref) throw std::runtime_error("the device queue ended before step " + std::to_string(step));
    return batch_;
  }
  std::int64_t take_wait_ns() override { return observer_.take_wait_ns(); }
  void finish(store::Writer& writer) override {
    batch_.ref.release();
    // Every batch reaches the device through the slots' page-locked staging buffers: the copies are
    // asynchronous DMA from pinned memory. What the host paid for staging is recorded next to it.
    const gpu::DeviceQueueStats st = queue_.stats();
    writer.set_meta("device_queue_pinned", "1");
    writer.set_meta("device_queue_staging_bytes", std::to_string(st.staging_bytes));
    writer.set_meta("device_queue_stage_ms", std::to_string(static_cast<double>(st.stage_ns) / 1e6));
    writer.set_meta("device_queue_copy_ms", std::to_string(static_cast<double>(st.copy_ns) / 1e6));
    queue_.stop();  // stops the host pipeline too
  }

 private:
  DataObserver observer_;
  gpu::DeviceQueue queue_;  // destroyed before the observer it reports to; frees its staging buffers
  DeviceBatch batch_;
};

}  // namespace

std::unique_ptr<BatchSource> make_device_batch_source(data::Pipeline& pipeline, backend::Backend& backend, int device,
                                                      int slots, profiler::Recorder* recorder) {
  return std::make_unique<DeviceBatchSource>(pipeline, backend, device, slots, recorder);
}

}  // namespace wb::trainer
