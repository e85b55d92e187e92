#include "trainer/data/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "trainer/data/clock.hpp"

namespace wb::data {

BatchRef& BatchRef::operator=(BatchRef&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = other.owner_;
    batch_ = other.batch_;
    other.owner_ = nullptr;
    other.batch_ = nullptr;
  }
  return *this;
}

void BatchRef::release() {
  if (owner_ != nullptr && batch_ != nullptr) owner_->recycle(batch_);
  owner_ = nullptr;
  batch_ = nullptr;
}

namespace {

const PipelineConfig& validated(const PipelineConfig& c, const Dataset& data) {
  if (c.workers < 1) throw DataError("--data-workers is " + std::to_string(c.workers) + ", expected >= 1");
  if (c.prefetch < 1) throw DataError("--prefetch is " + std::to_string(c.prefetch) + ", expected >= 1");
  if (c.delay_us < 0) throw DataError("data delay_us is " + std::to_string(c.delay_us) + ", expected >= 0");
  if (c.total_steps < 0) {
    throw DataError("data total_steps is " + std::to_string(c.total_steps) + ", expected >= 0 (0 = endless)");
  }
  if (data.size() == 0 || data.channels != 3) {
    throw DataError("input pipeline: dataset has " + std::to_string(data.size()) + " images of " +
                    std::to_string(data.channels) + " channels, expected a non-empty 3-channel dataset");
  }
  return c;
}

}  // namespace

Pipeline::Pipeline(const Dataset& data, const PipelineConfig& config, Observer* observer)
    : data_(data),
      config_(validated(config, data)),
      observer_(observer),
      sampler_(data.size(), config.num_shards, config.shard_id, config.batch_size, config.seed, config.shuffle) {
  // Validates the transform settings before any thread starts.
  if (data_.kind == DatasetKind::kImageFolder) {
    ImageSampleLoader probe(config_.image);
  } else {
    SampleTransform probe(config_.transform, data_.height, data_.width);
  }

  if (data_.kind == DatasetKind::kImageFolder && config_.skip_bad_images) {
    bad_ = std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(data_.size()));
  }
  const size_t n_buffers = static_cast<size_t>(config_.prefetch + config_.workers + 1);
  const size_t side = static_cast<size_t>(config_.transform.image_size);
  buffers_.resize(n_buffers);
  free_.reserve(n_buffers);
  for (Batch& b : buffers_) {
    b.images.resize(static_cast<size_t>(config_.batch_size) * 3 * side * side);
    b.labels.resize(static_cast<size_t>(config_.batch_size));
    if (data_.kind == DatasetKind::kImageFolder) {
      b.indices.resize(static_cast<size_t>(config_.batch_size));
      b.augs.resize(static_cast<size_t>(config_.batch_size));
    }
    free_.push_back(&b);
  }
  ring_.assign(static_cast<size_t>(config_.prefetch), nullptr);

  threads_.reserve(static_cast<size_t>(config_.workers));
  try {
    for (int w = 0; w < config_.workers; ++w) threads_.emplace_back(&Pipeline::worker_main, this, w);
  } catch (...) {
    stop();
    for (auto& t : threads_) t.join();
    throw;
  }
}

Pipeline::~Pipeline() {
  stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void Pipeline::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  {
    std::lock_guard lock(sleep_mutex_);
    sleep_stop_ = true;
  }
  ready_cv_.notify_all();
  turn_cv_.notify_all();
  free_cv_.notify_all();
  sleep_cv_.notify_all();
}

PipelineStats Pipeline::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

int64_t Pipeline::stamp_locked() {
  last_stamp_ = std::max(now_ns(), last_stamp_ + 1);
  return last_stamp_;
}

void Pipeline::recycle(Batch* batch) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(batch);
  }
  free_cv_.notify_one();
}

bool Pipeline::sleep_interrupted(int64_t us) {
  std::unique_lock lock(sleep_mutex_);
  return sleep_cv_.wait_for(lock, std::chrono::microseconds(us), [&] { return sleep_stop_; });
}

BatchRef Pipeline::pop() {
  int64_t wait_begin = 0;
  int64_t wait_end = 0;
  int64_t t_pop = 0;
  int depth_after = 0;
  Batch* batch = nullptr;
  {
    std::unique_lock lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    if (stopping_ || (config_.total_steps > 0 && next_pop_ >= config_.total_steps)) return {};
    if (depth_ == 0) {
      wait_begin = now_ns();
      ready_cv_.wait(lock, [&] { return stopping_ || depth_ > 0 || error_; });
      wait_end = now_ns();
      ++stats_.waits;
      stats_.wait_ns += wait_end - wait_begin;
    }
    if (error_) std::rethrow_exception(error_);
    if (stopping_) return {};
    batch = ring_[ring_head_];
    ring_head_ = (ring_head_ + 1) % ring_.size();
    --depth_;
    ++next_pop_;
    ++stats_.pops;
    t_pop = stamp_locked();
    depth_after = depth_;
  }
  turn_cv_.notify_all();
  if (observer_ != nullptr) {
    if (wait_begin != 0) observer_->on_wait(wait_begin, wait_end);
    observer_->on_pop(t_pop, depth_after);
  }
  return BatchRef(this, batch);
}

void Pipeline::worker_main(int worker) {
  std::unique_ptr<SampleTransform> transform;
  std::unique_ptr<ImageSampleLoader> loader;
  std::vector<int64_t> perm;
  perm.reserve(static_cast<size_t>(data_.size()));
  int64_t perm_epoch = -1;
  const auto capacity = static_cast<int>(ring_.size());
  try {
    if (data_.kind == DatasetKind::kImageFolder) loader = std::make_unique<ImageSampleLoader>(config_.image);
    else transform = std::make_unique<SampleTransform>(config_.transform, data_.height, data_.width);
    for (;;) {
      Batch* batch = nullptr;
      int64_t step = 0;
      {
        // Take a buffer before claiming an index: the worker holding the next index to push then
        // always has its buffer, so the in-order hand-off cannot run out of buffers.
        std::unique_lock lock(mutex_);
        auto exhausted = [&] { return config_.total_steps > 0 && next_claim_ >= config_.total_steps; };
        free_cv_.wait(lock, [&] { return stopping_ || exhausted() || !free_.empty(); });
        if (stopping_ || exhausted()) return;
        batch = free_.back();
        free_.pop_back();
        step = next_claim_++;
        if (exhausted()) free_cv_.notify_all();  // idle workers can leave now
      }

      const int64_t t_begin = observer_ != nullptr ? now_ns() : 0;
      assemble(worker, step, *batch, transform.get(), loader.get(), perm, perm_epoch);
      if (observer_ != nullptr) observer_->on_batch(worker, step, t_begin, now_ns());

      int64_t t_push = 0;
      int depth_after = 0;
      {
        std::unique_lock lock(mutex_);
        turn_cv_.wait(lock, [&] { return stopping_ || (next_push_ == step && depth_ < capacity); });
        if (stopping_) return;
        ring_[(ring_head_ + static_cast<size_t>(depth_)) % ring_.size()] = batch;
        ++depth_;
        ++next_push_;
        ++stats_.pushes;
        stats_.max_depth = std::max(stats_.max_depth, depth_);
        t_push = stamp_locked();
        depth_after = depth_;
      }
      ready_cv_.notify_one();
      turn_cv_.notify_all();  // the worker holding step + 1 may be waiting for its turn
      if (observer_ != nullptr) observer_->on_push(t_push, depth_after);
    }
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      stopping_ = true;
    }
    ready_cv_.notify_all();
    turn_cv_.notify_all();
    free_cv_.notify_all();
  }
}

int64_t Pipeline::load_image(int worker, ImageSampleLoader& loader, int64_t index, int64_t epoch, float* out,
                             ImageAug& aug) {
  const int64_t n = data_.size();
  for (int64_t tries = 0;; ++tries) {
    if (tries >= n) throw DataError(data_.root.string() + ": no readable image at all (first: " + stats().first_bad_image + ")");
    if (bad_ && bad_[static_cast<size_t>(index)].load(std::memory_order_relaxed)) {
      index = (index + 1) % n;
      continue;
    }
    const std::string& rel = data_.files[static_cast<size_t>(index)];
    try {
      aug = loader.load(data_.root / rel, (data_.root / rel).string(), config_.seed, epoch, index, out, observer_, worker);
      return index;
    } catch (const DataError& e) {
      if (!bad_) throw;
      // Another worker may have found the same file bad at the same moment: count it once.
      if (!bad_[static_cast<size_t>(index)].exchange(true)) {
        std::lock_guard lock(mutex_);
        if (stats_.bad_images++ == 0) stats_.first_bad_image = e.what();
      }
      index = (index + 1) % n;
    }
  }
}

void Pipeline::assemble(int worker, int64_t step, Batch& batch, SampleTransform* transform, ImageSampleLoader* loader,
                        std::vector<int64_t>& perm, int64_t& perm_epoch) {
  const int64_t epoch = step / sampler_.steps_per_epoch();
  const int64_t b = step % sampler_.steps_per_epoch();
  if (epoch != perm_epoch) {
    sampler_.fill_epoch_order(epoch, perm);
    perm_epoch = epoch;
  }
  batch.step = step;
  batch.epoch = static_cast<int>(epoch);
  const size_t stride = static_cast<size_t>(3) * image_size() * image_size();
  for (int j = 0; j < config_.batch_size; ++j) {
    const int64_t index = sampler_.sample_index(perm, b, j);
    if (loader != nullptr) {
      const auto js = static_cast<size_t>(j);
      const int64_t used = load_image(worker, *loader, index, epoch, batch.images.data() + stride * js, batch.augs[js]);
      batch.indices[js] = used;
      batch.labels[js] = data_.labels[static_cast<size_t>(used)];
      continue;
    }
    const AugmentParams aug = draw_augment(config_.transform, config_.seed, epoch, index);
    int64_t decode_begin = 0;
    if (config_.delay_us > 0) {
      if (observer_ != nullptr) decode_begin = now_ns();
      if (sleep_interrupted(config_.delay_us)) return;  // stopping: the batch is never pushed
    }
    transform->apply(data_.image(index), aug, batch.images.data() + stride * static_cast<size_t>(j), observer_,
                    worker, decode_begin);
    batch.labels[static_cast<size_t>(j)] = data_.labels[static_cast<size_t>(index)];
  }
}

}  // namespace wb::data
