// The device prefetch queue (see device_queue.hpp). CUDA builds only: trainer/gpu/CMakeLists.txt builds
// it when the CUDA backend is built.
//
// A slot goes round: free -> (copy thread) filled on the copy stream, copy finished -> ready ->
// (training loop) popped, the compute stream waits on its `ready` event -> released, `consumed` recorded
// on the compute stream -> free. The copy thread waits on `consumed` on the host before overwriting the
// slot, and on `ready` before handing the host batch back to the pipeline, so one pinned staging buffer
// (when one is needed at all) serves every copy and the "h2d" range spans the copy itself.
#include "trainer/gpu/device_queue.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "trainer/backend/cuda/cuda_backend.hpp"
#include "trainer/data/clock.hpp"

namespace wb::gpu {

namespace {

struct Slot {
  backend::Tensor images;  // (N, 3, S, S) f32, plain
  backend::Tensor labels;  // (N) i32
  cudaEvent_t ready = nullptr;     // recorded on the copy stream after the batch's copies
  cudaEvent_t consumed = nullptr;  // recorded on the compute stream when the batch was released
  bool consumed_pending = false;   // `consumed` was recorded and the copy thread has not waited on it yet
  std::int64_t step = -1;
};

}  // namespace

struct DeviceQueue::Impl {
  Impl(data::Pipeline& h, backend::Backend& b, const DeviceQueueOptions& o, data::Observer* obs)
      : host(h), be(b), options(o), observer(obs) {}

  void run();
  const void* pinned_images(const std::vector<float>& images);
  void release(int slot) noexcept;
  void fail(std::exception_ptr e) noexcept;
  std::int64_t stamp_locked() {
    last_stamp = std::max(data::now_ns(), last_stamp + 1);
    return last_stamp;
  }

  data::Pipeline& host;
  backend::Backend& be;
  const DeviceQueueOptions options;
  data::Observer* observer;
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  std::vector<Slot> slots;
  std::size_t image_bytes = 0;
  std::size_t label_bytes = 0;
  profiler::NameId h2d_name = 0;

  // Copy thread only (and the destructor, after it joined).
  std::unordered_set<const void*> registered;  // host image buffers page-locked in place by us
  bool pin_in_place = true;                    // false once cudaHostRegister was refused
  void* image_staging = nullptr;               // pinned; only when pin_in_place is false
  void* label_staging = nullptr;               // pinned; labels are small, always staged

  mutable std::mutex mutex;
  std::condition_variable ready_cv;  // the training loop: a slot became ready (or end / stop / error)
  std::condition_variable free_cv;   // the copy thread: a slot was released (or stop / error)
  std::vector<int> ring;             // ready slots in batch order (capacity = slots)
  std::size_t ring_head = 0;
  int depth = 0;
  std::vector<int> free_slots;
  bool done = false;      // the host pipeline ended
  bool stopping = false;
  std::exception_ptr error;
  DeviceQueueStats stats;
  std::int64_t last_stamp = 0;

  std::thread thread;
};

void DeviceQueue::Impl::fail(std::exception_ptr e) noexcept {
  {
    std::lock_guard lock(mutex);
    if (!error) error = e;
    stopping = true;
  }
  ready_cv.notify_all();
  free_cv.notify_all();
}

// The host buffer to copy the images from: the pipeline's own buffer, page-locked in place the first
// time it is seen (the pipeline recycles a fixed set of buffers, so this happens a few times per run),
// else a pinned staging copy. Pageable memory would make the copy synchronous and slow.
const void* DeviceQueue::Impl::pinned_images(const std::vector<float>& images) {
  const void* src = images.data();
  if (pin_in_place && !registered.count(src)) {
    const cudaError_t rc = cudaHostRegister(const_cast<float*>(images.data()), image_bytes, cudaHostRegisterDefault);
    if (rc == cudaSuccess) {
      registered.insert(src);
    } else {
      cudaGetLastError();  // not sticky, but leave no error behind for the next check
      if (rc != cudaErrorHostMemoryAlreadyRegistered) {
        pin_in_place = false;
        WB_CUDA_CHECK(cudaMallocHost(&image_staging, image_bytes));
        std::lock_guard lock(mutex);
        stats.pinned = false;
      }
    }
  }
  if (pin_in_place) return src;
  std::memcpy(image_staging, src, image_bytes);
  return image_staging;
}

void DeviceQueue::Impl::run() {
  try {
    WB_CUDA_CHECK(cudaSetDevice(options.device));  // the current device is per host thread
    profiler::set_thread_name("h2d-copy");
    for (;;) {
      int slot = -1;
      {
        std::unique_lock lock(mutex);
        free_cv.wait(lock, [&] { return stopping || !free_slots.empty(); });
        if (stopping) return;
        slot = free_slots.back();
        free_slots.pop_back();
      }
      data::BatchRef batch = host.pop();  // blocks while the workers are behind; empty at the end
      if (!batch) {
        {
          std::lock_guard lock(mutex);
          done = true;
          free_slots.push_back(slot);
        }
        ready_cv.notify_all();
        return;
      }
      Slot& s = slots[static_cast<std::size_t>(slot)];
      if (s.consumed_pending) {
        // The compute stream must be done with the batch this slot held before it is overwritten.
        WB_CUDA_CHECK(cudaEventSynchronize(s.consumed));
        s.consumed_pending = false;
      }
      const std::int64_t t0 = data::now_ns();
      {
        profiler::Range range(h2d_name, profiler::Category::h2d);  // CUPTI links the memcpy rows to it
        const void* src = pinned_images(batch->images);
        WB_CUDA_CHECK(cudaMemcpyAsync(s.images.data(), src, image_bytes, cudaMemcpyHostToDevice, copy));
        std::memcpy(label_staging, batch->labels.data(), label_bytes);
        WB_CUDA_CHECK(cudaMemcpyAsync(s.labels.data(), label_staging, label_bytes, cudaMemcpyHostToDevice, copy));
        WB_CUDA_CHECK(cudaEventRecord(s.ready, copy));
        WB_CUDA_CHECK(cudaEventSynchronize(s.ready));
      }
      const std::int64_t t1 = data::now_ns();
      s.step = batch->step;
      batch.release();  // the bytes are on the device: the pipeline may refill its buffer

      std::int64_t t_push = 0;
      int depth_after = 0;
      {
        std::lock_guard lock(mutex);
        ring[(ring_head + static_cast<std::size_t>(depth)) % ring.size()] = slot;
        ++depth;
        ++stats.copies;
        stats.copy_ns += t1 - t0;
        stats.max_depth = std::max(stats.max_depth, depth);
        t_push = stamp_locked();
        depth_after = depth;
      }
      ready_cv.notify_one();
      if (observer != nullptr) observer->on_push(t_push, depth_after);
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void DeviceQueue::Impl::release(int slot) noexcept {
  Slot& s = slots[static_cast<std::size_t>(slot)];
  bool recorded = false;
  try {
    WB_CUDA_CHECK(cudaEventRecord(s.consumed, compute));
    recorded = true;
  } catch (...) {
    fail(std::current_exception());  // the slot is not safe to refill: stop the copy thread
  }
  {
    std::lock_guard lock(mutex);
    s.consumed_pending = recorded;
    if (recorded) free_slots.push_back(slot);
  }
  free_cv.notify_one();
}

DeviceQueue::DeviceQueue(data::Pipeline& host, backend::Backend& be, const DeviceQueueOptions& options,
                         data::Observer* observer)
    : impl_(std::make_unique<Impl>(host, be, options, observer)) {
  Impl& q = *impl_;
  if (options.slots < 1) {
    throw backend::BackendError("device queue: --device-prefetch is " + std::to_string(options.slots) +
                                ", expected at least 1 device batch buffer");
  }
  q.compute = backend::cuda::compute_stream(be);
  const data::PipelineConfig& pc = host.config();
  const std::int64_t n = pc.batch_size, side = pc.transform.image_size;
  q.image_bytes = static_cast<std::size_t>(n * 3 * side * side) * sizeof(float);
  q.label_bytes = static_cast<std::size_t>(n) * sizeof(std::int32_t);
  q.h2d_name = profiler::intern("h2d");
  try {
    WB_CUDA_CHECK(cudaSetDevice(options.device));
    WB_CUDA_CHECK(cudaStreamCreateWithFlags(&q.copy, cudaStreamNonBlocking));
    WB_CUDA_CHECK(cudaMallocHost(&q.label_staging, q.label_bytes));
    q.slots.resize(static_cast<std::size_t>(options.slots));
    for (Slot& s : q.slots) {
      s.images = be.empty(backend::Shape{n, 3, side, side}, backend::DType::f32);
      s.labels = be.empty(backend::Shape{n}, backend::DType::i32);
      WB_CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
      WB_CUDA_CHECK(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming));
    }
    // The slots were allocated in compute-stream order; finish that before the copy stream writes them.
    be.synchronize();
    q.ring.assign(q.slots.size(), -1);
    for (int i = static_cast<int>(q.slots.size()); i-- > 0;) q.free_slots.push_back(i);  // slot 0 first
    q.thread = std::thread([&q] { q.run(); });
  } catch (...) {
    for (Slot& s : q.slots) {
      if (s.ready) cudaEventDestroy(s.ready);
      if (s.consumed) cudaEventDestroy(s.consumed);
    }
    if (q.label_staging) cudaFreeHost(q.label_staging);
    if (q.copy) cudaStreamDestroy(q.copy);
    throw;
  }
}

DeviceQueue::~DeviceQueue() {
  Impl& q = *impl_;
  stop();
  if (q.thread.joinable()) q.thread.join();
  // Destructors report nothing: the run is over, and a failed call here cannot be acted on.
  cudaStreamSynchronize(q.copy);
  for (Slot& s : q.slots) {
    if (s.consumed_pending) cudaEventSynchronize(s.consumed);
    cudaEventDestroy(s.ready);
    cudaEventDestroy(s.consumed);
  }
  for (const void* p : q.registered) cudaHostUnregister(const_cast<void*>(p));
  if (q.image_staging) cudaFreeHost(q.image_staging);
  if (q.label_staging) cudaFreeHost(q.label_staging);
  cudaStreamDestroy(q.copy);
  cudaGetLastError();
}

void DeviceQueue::stop() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->ready_cv.notify_all();
  impl_->free_cv.notify_all();
  impl_->host.stop();  // the copy thread may be blocked in the pipeline's pop()
}

DeviceBatchRef DeviceQueue::pop() {
  Impl& q = *impl_;
  std::int64_t wait_begin = 0, wait_end = 0, t_pop = 0;
  int depth_after = 0;
  int slot = -1;
  {
    std::unique_lock lock(q.mutex);
    if (q.error) std::rethrow_exception(q.error);
    if (q.depth == 0 && !q.done && !q.stopping) {
      wait_begin = data::now_ns();
      q.ready_cv.wait(lock, [&] { return q.depth > 0 || q.done || q.stopping || q.error; });
      wait_end = data::now_ns();
      ++q.stats.waits;
      q.stats.wait_ns += wait_end - wait_begin;
    }
    if (q.error) std::rethrow_exception(q.error);
    if (q.depth == 0 || q.stopping) return {};
    slot = q.ring[q.ring_head];
    q.ring_head = (q.ring_head + 1) % q.ring.size();
    --q.depth;
    ++q.stats.pops;
    t_pop = q.stamp_locked();
    depth_after = q.depth;
  }
  DeviceBatchRef ref(this, slot);
  if (q.observer != nullptr) {
    if (wait_begin != 0) q.observer->on_wait(wait_begin, wait_end);
    q.observer->on_pop(t_pop, depth_after);
  }
  // The copy has finished already (the copy thread waited for it); the wait still orders the compute
  // stream after it in CUDA's own terms, which is what the memory model promises on.
  WB_CUDA_CHECK(cudaStreamWaitEvent(q.compute, q.slots[static_cast<std::size_t>(slot)].ready, 0));
  return ref;
}

DeviceQueueStats DeviceQueue::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

// ---- DeviceBatchRef --------------------------------------------------------------------------------

DeviceBatchRef::DeviceBatchRef(DeviceBatchRef&& other) noexcept : queue_(other.queue_), slot_(other.slot_) {
  other.queue_ = nullptr;
  other.slot_ = -1;
}

DeviceBatchRef& DeviceBatchRef::operator=(DeviceBatchRef&& other) noexcept {
  if (this != &other) {
    release();
    queue_ = other.queue_;
    slot_ = other.slot_;
    other.queue_ = nullptr;
    other.slot_ = -1;
  }
  return *this;
}

const backend::Tensor& DeviceBatchRef::images() const {
  return queue_->impl_->slots[static_cast<std::size_t>(slot_)].images;
}

const backend::Tensor& DeviceBatchRef::labels() const {
  return queue_->impl_->slots[static_cast<std::size_t>(slot_)].labels;
}

std::int64_t DeviceBatchRef::step() const { return queue_->impl_->slots[static_cast<std::size_t>(slot_)].step; }

void DeviceBatchRef::release() noexcept {
  if (queue_ != nullptr) queue_->impl_->release(slot_);
  queue_ = nullptr;
  slot_ = -1;
}

}  // namespace wb::gpu
