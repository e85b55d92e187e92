#pragma once
// The input pipeline: N worker threads assemble whole batches (batch b goes to whichever worker claims
// it next), and hand them to the training loop through a bounded queue of ready batches, strictly in
// batch order, so the consumer sees batch 0, 1, 2, ... whatever the worker count or timing.
//
// Batches live in buffers allocated once (prefetch + workers + 1 of them) and recycled through a free
// list: the BatchRef the consumer gets returns its buffer when it goes out of scope. Augmentation is
// drawn from (seed, epoch, dataset index), so a run is reproducible bit for bit.
//
//   Pipeline pipe(train_set, config, &observer);
//   while (BatchRef batch = pipe.pop()) { train_step(batch->images, batch->labels); }

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainer/data/dataset.hpp"
#include "trainer/data/image_folder.hpp"
#include "trainer/data/observer.hpp"
#include "trainer/data/sampler.hpp"
#include "trainer/data/transforms.hpp"

namespace wb::data {

struct PipelineConfig {
  int batch_size = 32;       // --batch-size (per rank)
  int workers = 2;           // --data-workers
  int prefetch = 2;          // --prefetch: capacity of the ready queue, in batches
  int num_shards = 1;        // world size
  int shard_id = 0;          // rank
  uint64_t seed = 1;         // --seed: epoch order and augmentation
  bool shuffle = true;       // a fresh permutation per epoch (train); false keeps file order (eval)
  int64_t delay_us = 0;      // artificial per-sample delay, slept in decode (starvation experiments)
  int64_t total_steps = 0;   // batches to produce before pop() returns empty; 0 = until stop()
  TransformConfig transform; // transform.train = false gives the eval transforms
  // Image folders: the recipe (transform.image_size is the crop side there too), and whether a bad
  // image is counted and replaced by the next readable one in dataset order instead of ending the run.
  ImageTransformConfig image;
  bool skip_bad_images = false;
};

struct Batch {
  std::vector<float> images;    // (N, 3, H, W)
  std::vector<int32_t> labels;  // (N)
  int64_t step = 0;             // batches since the pipeline started: epoch * steps_per_epoch + b
  int epoch = 0;
  // Image folders: each sample's dataset index (after any bad-image replacement) and geometry.
  std::vector<int64_t> indices;
  std::vector<ImageAug> augs;
};

struct PipelineStats {
  int64_t pushes = 0;
  int64_t pops = 0;
  int64_t waits = 0;    // pops that found the queue empty and blocked
  int64_t wait_ns = 0;  // total time blocked in those pops
  int max_depth = 0;    // the most batches ever ready at once (<= prefetch)
  int64_t bad_images = 0;        // --skip-bad-images: distinct bad images found (each skipped from then on)
  std::string first_bad_image;   // the first one's one-line error
};

class Pipeline;

// A batch on loan to the consumer; move-only. Its buffer goes back to the pipeline when the ref is
// destroyed or release()d, and must be given back before the pipeline is destroyed. Holding more than
// one at a time is allowed but leaves the workers fewer buffers to fill.
class BatchRef {
 public:
  BatchRef() = default;
  BatchRef(BatchRef&& other) noexcept : owner_(other.owner_), batch_(other.batch_) {
    other.owner_ = nullptr;
    other.batch_ = nullptr;
  }
  BatchRef& operator=(BatchRef&& other) noexcept;
  BatchRef(const BatchRef&) = delete;
  BatchRef& operator=(const BatchRef&) = delete;
  ~BatchRef() { release(); }

  explicit operator bool() const { return batch_ != nullptr; }
  const Batch& operator*() const { return *batch_; }
  const Batch* operator->() const { return batch_; }
  void release();

 private:
  friend class Pipeline;
  BatchRef(Pipeline* owner, Batch* batch) : owner_(owner), batch_(batch) {}
  Pipeline* owner_ = nullptr;
  Batch* batch_ = nullptr;
};

class Pipeline {
 public:
  // Starts the workers. `data` and `observer` must outlive the pipeline. Throws DataError for bad
  // settings (including a batch larger than the shard, see ShardSampler).
  Pipeline(const Dataset& data, const PipelineConfig& config, Observer* observer = nullptr);
  // Stops and joins the workers.
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // The next batch in order, blocking while none is ready. Empty once total_steps batches were popped
  // or after stop(). Rethrows an exception raised in a worker.
  BatchRef pop();
  // Wakes every blocked thread (workers and consumer); later pops return empty. Idempotent.
  void stop();

  int64_t steps_per_epoch() const { return sampler_.steps_per_epoch(); }
  const ShardSampler& sampler() const { return sampler_; }
  const PipelineConfig& config() const { return config_; }
  int image_size() const { return config_.transform.image_size; }
  PipelineStats stats() const;

 private:
  friend class BatchRef;
  void recycle(Batch* batch);
  void worker_main(int worker);
  void assemble(int worker, int64_t step, Batch& batch, SampleTransform* transform, ImageSampleLoader* loader,
                std::vector<int64_t>& perm, int64_t& perm_epoch);
  // One image-folder sample into `out`; with skip_bad_images, a bad file is counted and the next index
  // (wrapping) is tried. Returns the index used.
  int64_t load_image(int worker, ImageSampleLoader& loader, int64_t index, int64_t epoch, float* out, ImageAug& aug);
  bool sleep_interrupted(int64_t us);
  // A queue timestamp: strictly increasing under mutex_, so events sort into their true order.
  int64_t stamp_locked();

  const Dataset& data_;
  const PipelineConfig config_;
  Observer* observer_;
  ShardSampler sampler_;

  std::vector<Batch> buffers_;
  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;  // consumer: a batch became ready (or stop / error)
  std::condition_variable turn_cv_;   // workers: the queue moved (their turn to push, or space)
  std::condition_variable free_cv_;   // workers: a buffer was recycled
  std::vector<Batch*> free_;          // capacity reserved up front: push/pop never allocate
  std::vector<Batch*> ring_;          // ready queue, capacity prefetch
  size_t ring_head_ = 0;
  int depth_ = 0;
  int64_t next_claim_ = 0;  // next batch index a worker will take
  int64_t next_push_ = 0;   // the only batch index allowed into the queue now
  int64_t next_pop_ = 0;
  int64_t last_stamp_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  PipelineStats stats_;

  // The delay sleep waits on its own lock so stop() can cut it short without contending the queue.
  std::mutex sleep_mutex_;
  std::condition_variable sleep_cv_;
  bool sleep_stop_ = false;  // guarded by sleep_mutex_

  // --skip-bad-images: which dataset indices failed, so each is tried and counted once.
  std::unique_ptr<std::atomic<bool>[]> bad_;

  std::vector<std::thread> threads_;
};

}  // namespace wb::data
