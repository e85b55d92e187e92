// Where the training loop's batches come from, whatever memory they live in. The loop pops one
// Batch per step, runs the model's forward on it, and tells it when the model is done reading:
//
//   Batch& batch = source.pop(step);        // waits for data
//   float loss = batch.forward(model);      // forward + loss
//   batch.forward_done();                   // host memory no longer read
//   ... backward, wait for gradients, update ...
//   batch.step_done();                      // every kernel that reads the batch is queued
//
// Two sources: the host pipeline's batches (CPU), and the device prefetch queue's copies of them
// (GPU, wb::gpu::DeviceQueue), made by make_device_batch_source in builds with the CUDA backend.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "trainer/backend/backend.hpp"
#include "trainer/data/pipeline.hpp"
#include "trainer/model/resnet50.hpp"

namespace wb::profiler {
class Recorder;
}
namespace wb::store {
class Writer;
}

namespace wb::trainer {

class DataObserver;

// One step's input batch.
class Batch {
 public:
  virtual ~Batch() = default;
  // The model's forward and loss on this batch; returns the loss.
  virtual float forward(model::ResNet50& model) = 0;
  // Exactly the images and labels the model reads, on the host (for step dumps).
  virtual void to_host(std::vector<float>& images, std::vector<std::int32_t>& labels) = 0;
  // After forward: the model keeps no pointer into the batch's host memory.
  virtual void forward_done() {}
  // After the update: every kernel that reads the batch has been queued (conv1's weight gradient
  // reads the images), so its memory may be refilled once they have run.
  virtual void step_done() {}
  // Testing aid (--poison-step): the next forward reads a NaN in place of the batch's first pixel.
  // False when this kind of batch cannot be poisoned.
  virtual bool poison() { return false; }
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The batch of `step`, waiting while none is ready. Throws when the source ends before it.
  virtual Batch& pop(std::int64_t step) = 0;
  // Nanoseconds the loop waited in pop() since the last call (the step row's data wait).
  virtual std::int64_t take_wait_ns() = 0;
  // Stops the workers and notes in the run file what the source measured. Call once, after the
  // last step.
  virtual void finish(store::Writer& writer) = 0;
};

// Host batches straight from `pipeline`, whose waits `observer` (the pipeline's own) counts.
std::unique_ptr<BatchSource> make_host_batch_source(data::Pipeline& pipeline, DataObserver& observer);

// Device copies of `pipeline`'s batches through a prefetch queue of `slots` device buffers on CUDA
// device `device` of `backend`; its queue depth and waits are recorded into `recorder` (may be null).
// Throws ConfigError in a build without the CUDA backend.
std::unique_ptr<BatchSource> make_device_batch_source(data::Pipeline& pipeline, backend::Backend& backend, int device,
                                                      int slots, profiler::Recorder* recorder);

}  // namespace wb::trainer
