#pragma once
// Collectives over a group of the job's ranks (SyncBatchNorm's statistics, the sharded classifier's
// features and loss terms), on an MPI communicator of their own: the model calls them from the training
// thread while GradientSync's communication thread may be inside a gradient allreduce on the job's
// communicator, and collectives on two communicators never match each other.
//
// Scopes, as AIACC's PerseusSyncBatchNorm comm_scope: global = every rank of the job; local = the ranks
// of this host (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED). split_group_comm makes any partition
// (MPI_Comm_split by colour, members ordered by job rank).

#include <memory>
#include <span>
#include <string>

#include "trainer/parallel/communicator.hpp"

namespace wb::parallel {

enum class GroupScope { global, local };

class GroupComm {
 public:
  virtual ~GroupComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: on return every member holds the sum of `values` over the group.
  virtual void allreduce_sum(std::span<double> values) = 0;
  virtual void allreduce_sum(std::span<float> values) = 0;
  // In place: the element-wise maximum over the group.
  virtual void allreduce_max(std::span<double> values) = 0;
  // `all` (size() * mine.size()) gets every member's `mine`, in member order.
  virtual void allgather(std::span<const float> mine, std::span<float> all) = 0;
  // The sum over the group of `all` (size() * mine.size()); this member's part (its rank's block) into `mine`.
  virtual void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) = 0;
};

// The group of this rank within `job` (self or MPI). A single process is a group of one. Throws
// DistError for another kind of communicator (NCCL: pass the host one) or a build without MPI.
std::unique_ptr<GroupComm> make_group_comm(Communicator& job, GroupScope scope);
// The ranks of `job` that pass the same `color`, ordered by their job rank. Collective over `job`.
std::unique_ptr<GroupComm> split_group_comm(Communicator& job, int color);

}  // namespace wb::parallel
