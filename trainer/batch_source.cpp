// The host batch source: the data pipeline's batches, read by the model straight from host memory.
#include "trainer/batch_source.hpp"

#include <limits>
#include <stdexcept>
#include <string>

#include "trainer/observers.hpp"

namespace wb::trainer {
namespace {

class HostBatch final : public Batch {
 public:
  data::BatchRef ref;

  float forward(model::ResNet50& model) override {
    if (!poisoned_) return model.forward(ref->images, ref->labels);
    poisoned_ = false;
    std::vector<float> images = ref->images;
    images.at(0) = std::numeric_limits<float>::quiet_NaN();
    return model.forward(images, ref->labels);
  }
  bool poison() override {
    poisoned_ = true;
    return true;
  }
  void to_host(std::vector<float>& images, std::vector<std::int32_t>& labels) override {
    images = ref->images;
    labels = ref->labels;
    if (poisoned_) images.at(0) = std::numeric_limits<float>::quiet_NaN();  // what forward will read
  }
  // The pipeline's slot goes back as soon as forward has read it.
  void forward_done() override { ref.release(); }

 private:
  bool poisoned_ = false;
};

class HostBatchSource final : public BatchSource {
 public:
  HostBatchSource(data::Pipeline& pipeline, DataObserver& observer) : pipeline_(pipeline), observer_(observer) {}

  Batch& pop(std::int64_t step) override {
    batch_.ref = pipeline_.pop();
    if (!batch_.ref) throw std::runtime_error("the data pipeline ended before step " + std::to_string(step));
    return batch_;
  }
  std::int64_t take_wait_ns() override { return observer_.take_wait_ns(); }
  void finish(store::Writer&) override {
    batch_.ref.release();
    pipeline_.stop();
  }

 private:
  data::Pipeline& pipeline_;
  DataObserver& observer_;
  HostBatch batch_;
};

}  // namespace

std::unique_ptr<BatchSource> make_host_batch_source(data::Pipeline& pipeline, DataObserver& observer) {
  return std::make_unique<HostBatchSource>(pipeline, observer);
}

}  // namespace wb::trainer
