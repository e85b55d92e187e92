// The device-side prefetch queue of a GPU rank: a copy thread takes the host pipeline's batches in
// order and copies each one, through a page-locked staging buffer of its slot (staging_pool.hpp), on
// its own copy stream into the next free
// slot of a ring of device batch buffers (--device-prefetch N slots). The training loop pops device
// batches; the compute stream waits on the slot's copy event, so kernels never read a half-copied batch,
// and a slot is refilled only after the compute stream has finished with it (an event recorded when the
// batch is released).
//
//   DeviceQueue queue(pipe, backend, {device, 2}, &device_observer);
//   while (DeviceBatchRef b = queue.pop()) { model.forward(b.images(), b.labels()); ...; b.release(); }
//
// What it records, through the same data::Observer hooks as the host queue: the depth of ready device
// batches at every push and pop (its own counter track), the training loop's waits on an empty queue,
// and, on the copy thread, one "h2d" range (category h2d) per batch around its copy, so CUPTI's memcpy
// rows link to it. The copy thread is also the host pipeline's consumer, so the host queue's waits are
// the copy thread's.
//
// No CUDA type appears here: the header is included from host-only code of CUDA builds. The
// implementation is compiled only when the CUDA backend is (WB_BACKEND_CUDA).
#pragma once

#include <cstdint>
#include <memory>

#include "trainer/backend/backend.hpp"
#include "trainer/data/observer.hpp"
#include "trainer/data/pipeline.hpp"

namespace wb::gpu {

struct DeviceQueueOptions {
  int device = 0;  // the CUDA device of the backend
  int slots = 2;   // --device-prefetch: device batch buffers (>= 1)
};

struct DeviceQueueStats {
  std::int64_t copies = 0;     // batches copied to the device
  std::int64_t stage_ns = 0;   // total host time copying batches into the page-locked staging buffers
  std::int64_t copy_ns = 0;    // total time of the device copies, enqueue to completion
  std::int64_t pops = 0;
  std::int64_t waits = 0;      // pops that found no ready device batch
  std::int64_t wait_ns = 0;
  int max_depth = 0;           // the most device batches ready at once (<= slots)
  std::int64_t staging_bytes = 0;  // page-locked staging memory (cudaHostAlloc), all slots
};

class DeviceQueue;

// A device batch on loan to the training loop; move-only. release() (or destruction) records on the
// compute stream that the slot may be refilled once the work queued so far has run: release it after
// the last kernel reading the batch was queued (after backward, since conv1's weight gradient reads
// the images).
class DeviceBatchRef {
 public:
  DeviceBatchRef() = default;
  DeviceBatchRef(DeviceBatchRef&& other) noexcept;
  DeviceBatchRef& operator=(DeviceBatchRef&& other) noexcept;
  DeviceBatchRef(const DeviceBatchRef&) = delete;
  DeviceBatchRef& operator=(const DeviceBatchRef&) = delete;
  ~DeviceBatchRef() { release(); }

  explicit operator bool() const { return queue_ != nullptr; }
  const backend::Tensor& images() const;  // f32 (N, 3, S, S), plain, device memory
  const backend::Tensor& labels() const;  // i32 (N), device memory
  std::int64_t step() const;              // the host batch's step (data::Batch::step)
  void release() noexcept;

 private:
  friend class DeviceQueue;
  DeviceBatchRef(DeviceQueue* queue, int slot) : queue_(queue), slot_(slot) {}
  DeviceQueue* queue_ = nullptr;
  int slot_ = -1;
};

class DeviceQueue {
 public:
  // Starts the copy thread. `host` (whose only consumer this queue becomes), `backend` (a CUDA
  // backend) and `observer` (may be null) must outlive the queue. A failed CUDA call throws
  // cuda::CudaError naming the statement, file:line and device (WB_CUDA_CHECK).
  DeviceQueue(data::Pipeline& host, backend::Backend& backend, const DeviceQueueOptions& options,
              data::Observer* observer = nullptr);
  // Stops the host pipeline and the copy thread, waits for the copies in flight, frees the slots and
  // unpins the host buffers. Every DeviceBatchRef must have been released.
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  // The next device batch in order, blocking while none is ready; the compute stream is already
  // ordered after its copy. Empty once the host pipeline has ended, or after stop(). Rethrows what
  // failed on the copy thread (a data::DataError from the pipeline, a backend::BackendError).
  DeviceBatchRef pop();
  // Stops the host pipeline (waking the copy thread if it waits there) and wakes a blocked pop().
  void stop();
  DeviceQueueStats stats() const;

  struct Impl;

 private:
  friend class DeviceBatchRef;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wb::gpu
