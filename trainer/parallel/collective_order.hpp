#pragma once
// One issuing order for every collective of a rank on the GPU.
//
// NCCL collectives block the device until every member has joined, so two communicators' collectives
// queued in different orders on different ranks can wait on each other for good (NCCL's documented
// cross-communicator deadlock). The gradient buckets' allreduces are issued by GradientSync's
// communication thread, while SyncBatchNorm and the sharded classifier need their exchanges from the
// training thread. A CollectiveOrder makes them one sequence: the exchange runs on the thread that
// issues the buckets, after every bucket whose last gradient was reported before the call and before
// every bucket reported after it. The training thread reports gradients and asks for exchanges in the
// same program order on every rank, so every rank issues the same collectives in the same order, and the
// issuing thread waits for each to finish before the next, so no two are ever queued on the device at
// once.
//
// MPI groups need none of this (collectives on different MPI communicators never match each other, and
// a host thread blocked in one does not stop another's), so they ignore the order (GroupComm::order_with).

#include <functional>
#include <string>

namespace wb::parallel {

class CollectiveOrder {
 public:
  virtual ~CollectiveOrder() = default;
  // Runs `collective` in this rank's issuing order (see above) and returns when it has finished;
  // rethrows what it threw. `what` names it in the heartbeat and in the watchdog's message. Call from the
  // thread that reports the gradients.
  virtual void run_in_order(const std::string& what, const std::function<void()>& collective) = 0;
};

}  // namespace wb::parallel
