#include "trainer/parallel/gradient_sync.hpp"

#include <algorithm>
#include <string>

#include "trainer/parallel/clock.hpp"
#include "trainer/parallel/error.hpp"

namespace wb::parallel {

GradientSync::GradientSync(Communicator& comm, std::vector<Bucket> buckets, float* grads, SyncOptions options)
    : comm_(comm), buckets_(std::move(buckets)), grads_(grads), options_(std::move(options)) {
  if (buckets_.empty()) throw DistError("GradientSync: no buckets");
  if (grads_ == nullptr) throw DistError("GradientSync: the gradient buffer is null");
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].index != static_cast<int>(b)) {
      throw DistError("GradientSync: bucket at position " + std::to_string(b) + " has index " +
                      std::to_string(buckets_[b].index) + "; expected buckets numbered in forward order");
    }
  }
  bucket_of_param_ = bucket_of_params(buckets_);  // also checks the ranges are contiguous from 0
  param_ready_.assign(bucket_of_param_.size(), 0);
  pending_.assign(buckets_.size(), 0);
  ready_ns_.assign(buckets_.size(), 0);
  if (options_.watchdog_timeout_s > 0.0) {
    Watchdog::Diagnose diagnose;
    if (Heartbeat* hb = options_.heartbeat) diagnose = [hb] { return hb->diagnose(); };
    watchdog_ = std::make_unique<Watchdog>(comm_, options_.watchdog_timeout_s, std::move(diagnose));
  }
  thread_ = std::thread([this] { run(); });
}

GradientSync::~GradientSync() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GradientSync::begin_step(int step) {
  std::lock_guard lock(mutex_);
  if (active_ && next_ >= 0 && !error_) {
    throw DistError("GradientSync::begin_step(" + std::to_string(step) + "): step " + std::to_string(step_) +
                    " still has buckets to reduce; call wait_all first");
  }
  active_ = true;
  step_ = step;
  error_ = nullptr;
  next_ = static_cast<int>(buckets_.size()) - 1;
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
  for (const auto& b : buckets_) pending_[static_cast<std::size_t>(b.index)] = b.tensors();
  std::fill(ready_ns_.begin(), ready_ns_.end(), 0);
  spans_.clear();
  if (options_.heartbeat) options_.heartbeat->set_step(step);
}

void GradientSync::on_grads_ready(int first_param, int last_param_exclusive) {
  const std::int64_t t = now_ns();
  const int count = static_cast<int>(param_ready_.size());
  bool became_ready = false;
  {
    std::lock_guard lock(mutex_);
    if (!active_) throw DistError("GradientSync::on_grads_ready called before begin_step");
    const int reported = std::max(count, options_.param_count);
    if (first_param < 0 || last_param_exclusive > reported || first_param >= last_param_exclusive) {
      throw DistError("GradientSync::on_grads_ready(" + std::to_string(first_param) + ", " +
                      std::to_string(last_param_exclusive) + "): expected 0 <= first < last <= " +
                      std::to_string(reported));
    }
    if (first_param >= count) return;  // past the buckets: reduced elsewhere
    last_param_exclusive = std::min(last_param_exclusive, count);
    for (int p = first_param; p < last_param_exclusive; ++p) {
      if (param_ready_[static_cast<std::size_t>(p)]) {
        throw DistError("GradientSync::on_grads_ready: the gradient of parameter " + std::to_string(p) +
                        " was reported twice in step " + std::to_string(step_));
      }
    }
    for (int p = first_param; p < last_param_exclusive; ++p) {
      param_ready_[static_cast<std::size_t>(p)] = 1;
      const auto b = static_cast<std::size_t>(bucket_of_param_[static_cast<std::size_t>(p)]);
      if (--pending_[b] == 0) {
        ready_ns_[b] = t;
        became_ready = true;
        // Under the lock: the communication thread sees the bucket ready only after the hook ran.
        if (options_.on_ready) options_.on_ready(buckets_[b], grads_ + buckets_[b].offset);
      }
    }
  }
  if (became_ready) cv_.notify_all();
}

bool GradientSync::job_due_locked() const {
  return job_ && !job_->done && (!active_ || error_ || next_ < job_->after);
}

bool GradientSync::bucket_due_locked() const {
  if (!active_ || next_ < 0 || error_ || pending_[static_cast<std::size_t>(next_)] != 0) return false;
  return !(job_ && !job_->done && next_ < job_->after);  // a collective queued before this bucket was ready
}

void GradientSync::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || job_due_locked() || bucket_due_locked(); });
    if (stop_) return;
    if (job_due_locked()) {
      run_job(lock);
    } else {
      run_bucket(lock);
    }
    cv_.notify_all();
  }
}

namespace {

// Runs a collective with the heartbeat saying what it is and the watchdog watching it; the lock is
// released meanwhile. Returns what it threw.
template <typename F>
std::exception_ptr watched(std::unique_lock<std::mutex>& lock, Watchdog* watchdog, Heartbeat* heartbeat,
                           const std::string& what, F&& collective) {
  lock.unlock();
  std::exception_ptr error;
  if (heartbeat) heartbeat->set_doing(what);
  try {
    std::unique_ptr<Watchdog::Guard> guard;
    if (watchdog) guard = std::make_unique<Watchdog::Guard>(watchdog->watch(what));
    collective();
  } catch (...) {
    error = std::current_exception();
  }
  if (heartbeat) heartbeat->set_doing({});
  lock.lock();
  return error;
}

}  // namespace

void GradientSync::run_job(std::unique_lock<std::mutex>& lock) {
  Job* job = job_;
  if (active_ && error_) {  // a bucket failed: its peers may be gone, so nothing more is issued
    job->error = error_;
    job->done = true;
    return;
  }
  job->error = watched(lock, watchdog_.get(), options_.heartbeat, *job->what, *job->run);
  job->done = true;
}

void GradientSync::run_bucket(std::unique_lock<std::mutex>& lock) {
  const Bucket bucket = buckets_[static_cast<std::size_t>(next_)];
  BucketSpan span;
  span.rank = comm_.rank();
  span.step = step_;
  span.bucket = bucket.index;
  span.first_param = bucket.first_param;
  span.last_param = bucket.last_param();
  span.bytes = bucket.bytes();
  span.ready_ns = ready_ns_[static_cast<std::size_t>(bucket.index)];
  const std::string what =
      "allreduce of bucket " + std::to_string(bucket.index) + " (step " + std::to_string(span.step) + ")";
  span.start_ns = now_ns();
  std::exception_ptr error = watched(lock, watchdog_.get(), options_.heartbeat, what, [&] {
    comm_.allreduce(grads_ + bucket.offset, static_cast<std::size_t>(bucket.numel), options_.op);
  });
  span.end_ns = now_ns();
  if (!error && options_.on_span) {
    lock.unlock();
    try {
      options_.on_span(span);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
  }
  if (error) {
    error_ = error;
  } else {
    spans_.push_back(span);
    --next_;
  }
}

void GradientSync::run_in_order(const std::string& what, const std::function<void()>& collective) {
  Job job;
  job.what = &what;
  job.run = &collective;
  std::unique_lock lock(mutex_);
  if (job_) throw DistError("GradientSync::run_in_order: another collective is already waiting (" + *job_->what + ")");
  if (active_ && error_) rethrow_locked();
  // The buckets the communication thread will reduce before it: from next_ down, while fully reported.
  int k = active_ ? next_ : -1;
  while (k >= 0 && pending_[static_cast<std::size_t>(k)] == 0) --k;
  job.after = k + 1;
  job_ = &job;
  cv_.notify_all();
  cv_.wait(lock, [&] { return job.done; });
  job_ = nullptr;
  cv_.notify_all();  // a bucket may have been held back by it
  if (job.error) std::rethrow_exception(job.error);
}

void GradientSync::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);
}

void GradientSync::wait_bucket(int bucket) {
  std::unique_lock lock(mutex_);
  if (bucket < 0 || bucket >= static_cast<int>(buckets_.size())) {
    throw DistError("GradientSync::wait_bucket(" + std::to_string(bucket) + "): expected a bucket index below " +
                    std::to_string(buckets_.size()));
  }
  if (!active_) throw DistError("GradientSync::wait_bucket called before begin_step");
  cv_.wait(lock, [&] { return next_ < bucket || error_; });
  rethrow_locked();
}

void GradientSync::wait_all() {
  std::unique_lock lock(mutex_);
  if (!active_) throw DistError("GradientSync::wait_all called before begin_step");
  for (const auto& b : buckets_) {
    const int missing = pending_[static_cast<std::size_t>(b.index)];
    if (missing > 0) {
      throw DistError("GradientSync::wait_all (step " + std::to_string(step_) + "): bucket " + std::to_string(b.index) +
                      " [" + std::to_string(b.first_param) + ", " + std::to_string(b.end_param) + ") has " +
                      std::to_string(missing) + " gradient(s) never reported by on_grads_ready");
    }
  }
  cv_.wait(lock, [&] { return next_ < 0 || error_; });
  rethrow_locked();
}

std::int64_t exposed_comm_ns(const std::vector<BucketSpan>& spans, std::int64_t backward_end_ns) {
  std::int64_t last_end = backward_end_ns;
  for (const auto& s : spans) last_end = std::max(last_end, s.end_ns);
  return last_end - backward_end_ns;
}

std::vector<BucketSpan> GradientSync::spans() const {
  std::lock_guard lock(mutex_);
  return spans_;
}

}  // namespace wb::parallel
