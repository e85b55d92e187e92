#pragma once
// Hooks through which the profiler watches the input pipeline. Every call comes from the thread that
// did the work, with CLOCK_MONOTONIC nanoseconds (wb::data::now_ns). The defaults do nothing; a
// pipeline without an observer does not even read the clock.
//
// Queue events (on_push, on_pop) are stamped under the queue lock and their timestamps are strictly
// increasing, so sorting them by time gives the order in which the depth changed; the call itself
// happens after the lock is released.

#include <cstdint>
#include <span>
#include <string_view>

namespace wb::data {

// Transform ids passed to Observer::on_transform; transform_names()[id] is the step's name.
enum TransformId : int {
  kDecode = 0,            // uint8 HWC sample -> float HWC (includes the per-sample delay_us sleep)
  kRandomCrop = 1,        // zero padding + crop at the input size (train only)
  kRandomFlip = 2,        // horizontal flip with probability p (train only)
  kResize = 3,            // bilinear to image_size (skipped when the size already matches)
  kRescaleNormalize = 4,  // x / 255, then (x - mean) / std per channel
  kHwc2Chw = 5,           // layout change into the batch buffer
  // Image folders (decode above is the JPEG/PNG decode there; random_flip and resize are shared):
  kRead = 6,       // the file's bytes from disk
  kCrop = 7,       // choosing the crop window (resize then computes only the pixels inside it)
  kNormalize = 8,  // ToTensor + Normalize into the batch's CHW float
  kTransformCount = 9,
};

// {"decode", "random_crop", "random_flip", "resize", "rescale_normalize", "hwc2chw", "read", "crop",
//  "normalize"}
std::span<const std::string_view> transform_names();

class Observer {
 public:
  virtual ~Observer() = default;
  // A batch entered the ready queue (worker thread); depth_after is the queue length after it.
  virtual void on_push(int64_t t_ns, int depth_after) {}
  // The training loop took a batch (consumer thread).
  virtual void on_pop(int64_t t_ns, int depth_after) {}
  // The consumer was blocked on an empty queue from begin_ns to end_ns.
  virtual void on_wait(int64_t begin_ns, int64_t end_ns) {}
  // One transform step of one sample on worker `worker` (0-based).
  virtual void on_transform(int worker, int transform_id, int64_t begin_ns, int64_t end_ns) {}
  // Assembly of a whole batch; batch_index counts batches since the pipeline started
  // (epoch * steps_per_epoch + batch of the epoch), the same number as Batch::step.
  virtual void on_batch(int worker, int64_t batch_index, int64_t begin_ns, int64_t end_ns) {}
};

}  // namespace wb::data
