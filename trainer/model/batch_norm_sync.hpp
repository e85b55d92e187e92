#pragma once
// SyncBatchNorm's hook: where the model sums each batch-norm layer's per-channel partial results over
// the processes that share one batch. With a BatchNormSync set, a training forward normalises every
// batch norm with the statistics of the whole batch (the sums of x, x^2 and the count, summed over the
// group), and the backward sums dy and dy * (x - mean) over the group before it completes dx, as
// PyTorch's SyncBatchNorm does; dgamma and dbeta stay this process's own (the data-parallel allreduce
// averages them). Without one, batch norm uses this process's batch alone.

#include <span>

namespace wb::model {

class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // In place: `values` becomes their sum over the group, on every member. bn_module is the layer's
  // module id (ResNet50::module_names()); forward is true for the statistics, false for the gradient
  // sums. Every member calls with the same layers in the same order.
  virtual void allreduce(int bn_module, bool forward, std::span<double> values) = 0;
};

}  // namespace wb::model
