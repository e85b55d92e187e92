#pragma once
// The sharded classifier's hook (wb-train --shard-fc N): where the model exchanges the classifier's
// partial results with the other members of its shard group. Each of the group's N ranks holds the rows
// [shard * K/N, (shard + 1) * K/N) of fc.weight and fc.bias (K classes), and all of them compute their
// slice of the logits for the whole group's batch (every member's features, gathered). The softmax
// cross-entropy with label smoothing then needs three sums over the group per row, never the logits
// themselves: the maximum, the sum of exp(z - max), and the target terms (the labelled class's logit,
// from the member that holds it, and the sum of all logits, which smoothing weighs). Backward gives each
// member the gradient of its slice over the group's batch, and the gradient of the group's features,
// whose sum over the members is reduce-scattered back to the rank each feature came from.

#include <span>

namespace wb::model {

// What an exchange carries (the trainer names its comm ranges after it).
enum class FcExchange {
  features,  // gather: every member's features and labels
  max,       // allreduce max: each row's largest logit
  sum,       // allreduce sum: each row's sum of exp(z - max)
  target,    // allreduce sum: each row's labelled logit and sum of logits
  grads,     // reduce-scatter: the feature gradients, summed over the members
  sync,      // the slice's gradients over the shard groups (ranks holding the same slice)
  logits,    // gather: the logits slices, when the full logits are wanted (a step dump)
  state,     // gather: parameter, gradient or momentum slices (checkpoints and dumps)
};

class FcShard {
 public:
  virtual ~FcShard() = default;
  virtual int shards() const = 0;  // N, the members of the group
  virtual int shard() const = 0;   // this member's index: the slice it holds and its rows in the group batch
  // The data-parallel ranks the gradients average over (the job's world).
  virtual int replicas() const = 0;
  // `all` (shards() * mine.size()) gets every member's `mine`, in member order.
  virtual void gather(FcExchange what, std::span<const float> mine, std::span<float> all) = 0;
  // In place over the group: the maximum for FcExchange::max, else the sum.
  virtual void allreduce(FcExchange what, std::span<double> values) = 0;
  // The sum over the group of `all`; this member's block into `mine`.
  virtual void reduce_scatter(FcExchange what, std::span<const float> all, std::span<float> mine) = 0;
  // In place: the sum over every rank that holds the same slice (one per shard group; nothing to do with
  // a single group).
  virtual void sync_grads(std::span<float> grads) = 0;
  // Whether this forward hands the observer the full logits of this rank's rows (a gather of the slices);
  // the same answer on every member.
  virtual bool full_logits() const = 0;
};

}  // namespace wb::model
