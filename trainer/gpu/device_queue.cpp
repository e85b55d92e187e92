// The device prefetch queue (see device_queue.hpp). CUDA builds only: trainer/gpu/CMakeLists.txt builds
// it when the CUDA backend is built.
//
// A slot goes round: free -> (copy thread) filled on the copy stream, copy finished -> ready ->
// (training loop) popped, the compute stream waits on its `ready` event -> released, `consumed` recorded
// on the compute stream -> free. The copy thread waits on `consumed` on the host before overwriting the
// slot. Each slot has its own page-locked, page-aligned staging buffers (staging_pool.hpp): the copy
// thread copies the host batch into them, hands the host batch back to the pipeline at once, and the
// DMA reads the staging buffer. It waits on `ready` so the "h2d" range spans the copy itself.
#include "trainer/gpu/device_queue.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "trainer/backend/memory.hpp"
#include "trainer/backend/cuda/cuda_backend.hpp"
#include "trainer/data/clock.hpp"
#include "trainer/gpu/staging_pool.hpp"

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

void* cuda_host_alloc(std::size_t bytes, std::size_t /*alignment: cudaHostAlloc returns page-aligned memory*/) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void cuda_free_host(void* p) { cudaFreeHost(p); }

constexpr StagingAllocator kPinned{cuda_host_alloc, cuda_free_host, "cudaHostAlloc"};

}  // namespace

struct DeviceQueue::Impl {
  Impl(data::Pipeline& h, backend::Backend& b, const DeviceQueueOptions& o, data::Observer* obs)
      : host(h), be(b), options(o), observer(obs) {}

  void run();
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

  // Page-locked staging buffers, one per slot (written by the copy thread only).
  std::unique_ptr<StagingPool> image_staging;
  std::unique_ptr<StagingPool> label_staging;

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
      void* image_src = image_staging->buffer(slot);
      void* label_src = label_staging->buffer(slot);
      std::memcpy(image_src, batch->images.data(), image_bytes);
      std::memcpy(label_src, batch->labels.data(), label_bytes);
      s.step = batch->step;
      batch.release();  // the bytes are in the staging buffers: the pipeline may refill its buffer
      const std::int64_t t_staged = data::now_ns();
      {
        profiler::Range range(h2d_name, profiler::Category::h2d);  // CUPTI links the memcpy rows to it
        WB_CUDA_CHECK(cudaMemcpyAsync(s.images.data(), image_src, image_bytes, cudaMemcpyHostToDevice, copy));
        WB_CUDA_CHECK(cudaMemcpyAsync(s.labels.data(), label_src, label_bytes, cudaMemcpyHostToDevice, copy));
        WB_CUDA_CHECK(cudaEventRecord(s.ready, copy));
        WB_CUDA_CHECK(cudaEventSynchronize(s.ready));
      }
      const std::int64_t t1 = data::now_ns();

      std::int64_t t_push = 0;
      int depth_after = 0;
      {
        std::lock_guard lock(mutex);
        ring[(ring_head + static_cast<std::size_t>(depth)) % ring.size()] = slot;
        ++depth;
        ++stats.copies;
        stats.stage_ns += t_staged - t0;
        stats.copy_ns += t1 - t_staged;
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
    q.image_staging = std::make_unique<StagingPool>(q.image_bytes, options.slots, kPinned);
    q.label_staging = std::make_unique<StagingPool>(q.label_bytes, options.slots, kPinned);
    q.stats.staging_bytes = static_cast<std::int64_t>((q.image_staging->capacity() + q.label_staging->capacity()) *
                                                      static_cast<std::size_t>(options.slots));
    q.slots.resize(static_cast<std::size_t>(options.slots));
    backend::MemoryTagScope batch_tag(backend::MemoryRole::data);
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
    q.image_staging.reset();
    q.label_staging.reset();
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
  q.image_staging.reset();
  q.label_staging.reset();
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
