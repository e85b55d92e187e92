#pragma once
// GradientSync: averages gradients across ranks bucket by bucket, overlapped with backward.
//
// The model calls on_grads_ready(first, last_exclusive) during backward as soon as those gradients
// are final. When the last gradient of a bucket arrives, the bucket is ready; a communication thread
// allreduces it in place in the gradient buffer while backward continues. Buckets are reduced in a
// fixed order, highest index first (the order backward produces them), so every rank issues the same
// collectives in the same order. The optimizer waits for what it needs: wait_bucket(b) or wait_all().
//
// Per step, each bucket's span is recorded: ready (its last gradient reported), start and end of its
// allreduce (CLOCK_MONOTONIC ns, rank-local; the profiler applies the clock offset). Every collective
// is watched by a Watchdog: after the timeout the job is aborted with a message naming the bucket
// and step instead of hanging, and, given this rank's Heartbeat, the peer whose heartbeat stopped.
//
// Typical step:
//   sync.begin_step(step);
//   model.backward(...);   // calls sync.on_grads_ready(...) from its observer hook
//   sync.wait_all();       // gradients in `grads` are now the mean over ranks
//   optimizer.update(...);

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "trainer/parallel/buckets.hpp"
#include "trainer/parallel/collective_order.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/heartbeat.hpp"
#include "trainer/parallel/watchdog.hpp"

namespace wb::parallel {

// One bucket's allreduce in one step; fields as the store's AllreduceRow.
struct BucketSpan {
  int rank = 0;
  int step = 0;
  int bucket = 0;
  int first_param = 0;
  int last_param = 0;  // inclusive
  std::int64_t bytes = 0;
  std::int64_t ready_ns = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

// Communication not hidden behind backward (the step's comm_exposed_ns): how long after backward
// ended the last bucket's allreduce finished; 0 when everything finished during backward.
std::int64_t exposed_comm_ns(const std::vector<BucketSpan>& spans, std::int64_t backward_end_ns);

struct SyncOptions {
  ReduceOp op = ReduceOp::mean;
  // The parameters whose gradients on_grads_ready reports (0: those of the buckets). Reports of
  // parameters past the last bucket are accepted and left alone (a sharded classifier's slices, which
  // their own rank groups reduce).
  int param_count = 0;
  // Collectives running longer than this abort the job (see watchdog.hpp); <= 0 disables the watchdog.
  double watchdog_timeout_s = kDefaultWatchdogSeconds;
  // This rank's heartbeat (optional; must outlive the GradientSync): it carries the step and the
  // collective in progress, and the watchdog's message names the peer whose heartbeat stopped.
  Heartbeat* heartbeat = nullptr;
  // Called on the communication thread after every bucket's allreduce (e.g. to record the span).
  std::function<void(const BucketSpan&)> on_span;
  // Called when a bucket becomes ready, on the thread that reported its last gradient, while the
  // communication thread cannot yet start that bucket's allreduce (it must not call back into
  // GradientSync). On a GPU the gradients' kernels are then queued but maybe not run: this is the
  // moment to mark the compute stream (NcclCommunicator::mark_ready), so the allreduce waits for
  // exactly those kernels rather than for whatever was queued by the time the thread got to it.
  std::function<void(const Bucket& bucket, float* data)> on_ready;
};

// Also a CollectiveOrder: run_in_order places another collective (a SyncBatchNorm or sharded-classifier
// exchange) among the buckets' allreduces on the communication thread, as collective_order.hpp explains.
class GradientSync final : public CollectiveOrder {
 public:
  // `grads` is the contiguous gradient buffer the buckets slice (memory the communicator's backend
  // uses: host for MPI, device for NCCL); it and `comm` must outlive this object. Buckets must be
  // contiguous ranges covering every parameter, numbered in forward order (as buckets.hpp makes them).
  GradientSync(Communicator& comm, std::vector<Bucket> buckets, float* grads, SyncOptions options = {});
  ~GradientSync() override;
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Starts a step: every gradient is pending again. The previous step must have finished (wait_all).
  void begin_step(int step);
  // Gradients of parameters [first_param, last_param_exclusive) are final. Any thread; a parameter
  // may be reported once per step.
  void on_grads_ready(int first_param, int last_param_exclusive);
  // Blocks until bucket `bucket` of this step is reduced. Rethrows a failed allreduce as DistError.
  void wait_bucket(int bucket);
  // Call after backward has returned: blocks until every bucket is reduced. Throws DistError naming the
  // bucket when some gradient was never reported (it would otherwise wait forever).
  void wait_all();

  // After every bucket reduced or ready to be (each bucket from the next one down whose gradients were
  // all reported before this call), before every other; blocks until `collective` has run on the
  // communication thread, under the watchdog. Outside a step it runs as soon as that thread is free.
  // Call from the thread that calls on_grads_ready; rethrows what `collective` threw, or a failed
  // bucket's error.
  void run_in_order(const std::string& what, const std::function<void()>& collective) override;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The spans of the current step's reduced buckets, in the order they were reduced.
  std::vector<BucketSpan> spans() const;

 private:
  void run();
  void rethrow_locked();
  bool job_due_locked() const;     // the queued collective may run now
  bool bucket_due_locked() const;  // bucket next_ may start now
  void run_job(std::unique_lock<std::mutex>& lock);
  void run_bucket(std::unique_lock<std::mutex>& lock);

  Communicator& comm_;
  std::vector<Bucket> buckets_;
  float* grads_;
  SyncOptions options_;
  std::vector<int> bucket_of_param_;
  std::unique_ptr<Watchdog> watchdog_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool active_ = false;  // a step has begun
  int step_ = 0;
  int next_ = -1;  // the next bucket to reduce (counts down); -1 when all are done
  std::vector<char> param_ready_;
  std::vector<int> pending_;  // per bucket: gradients not yet reported
  std::vector<std::int64_t> ready_ns_;
  std::vector<BucketSpan> spans_;
  std::exception_ptr error_;
  // run_in_order's collective (one at a time: its caller waits for it). It runs once next_ < after,
  // and bucket next_ waits while next_ < after.
  struct Job {
    const std::string* what = nullptr;
    const std::function<void()>* run = nullptr;
    int after = 0;  // the lowest bucket issued before it (buckets_.size(): none)
    bool done = false;
    std::exception_ptr error;
  };
  Job* job_ = nullptr;
  std::thread thread_;
};

}  // namespace wb::parallel
