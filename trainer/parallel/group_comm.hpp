#pragma once
// Collectives over a group of the job's ranks (SyncBatchNorm's statistics, the sharded classifier's
// features and loss terms), on a communicator of their own, called from the training thread:
//   - on the CPU an MPI communicator: GradientSync's communication thread may be inside a gradient
//     allreduce on the job's communicator meanwhile, and collectives on two MPI communicators never
//     match each other;
//   - on GPUs a NCCL communicator split from the job's (ncclCommSplit). Values stay host spans: each
//     collective stages them through device memory on a stream of its own. NCCL collectives of two
//     communicators must be issued in one order on every rank, so a NCCL group runs each collective
//     through the CollectiveOrder given to order_with (GradientSync), among the gradient buckets.
//
// Scopes, as AIACC's PerseusSyncBatchNorm comm_scope: global = every rank of the job; local = the ranks
// of this host (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED). split_group_comm makes any partition
// (MPI_Comm_split by colour, members ordered by job rank).

#include <memory>
#include <span>
#include <string>

#include "trainer/parallel/collective_order.hpp"
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
  // "mpi", "nccl" or "self".
  virtual const char* backend() const = 0;
  // Issue every later collective through `order` (null: directly, as MPI groups always do).
  virtual void order_with(CollectiveOrder* order) { (void)order; }
};

// The group of this rank within `job` (self or MPI). A single process is a group of one. Throws
// DistError for another kind of communicator (NCCL: pass the host one as `job` and the NCCL one as
// `device`) or a build without MPI. With `device` (a NCCL communicator over the same ranks), the group
// is a NCCL one; collective over `job` and `device`.
std::unique_ptr<GroupComm> make_group_comm(Communicator& job, GroupScope scope, Communicator* device = nullptr);
// The ranks of `job` that pass the same `color`, ordered by their job rank. Collective over `job` (and
// `device`, as above).
std::unique_ptr<GroupComm> split_group_comm(Communicator& job, int color, Communicator* device = nullptr);

// Throws DistError unless `all` holds `size` blocks of `mine` values (allgather, reduce_scatter_sum).
void check_group_blocks(std::size_t mine, std::size_t all, int size, const char* op);

// The NCCL group of the ranks of `device` (a NCCL communicator) that pass the same `color`, ordered by
// rank (cuda/nccl_group.cpp; a build without NCCL throws DistError).
std::unique_ptr<GroupComm> make_nccl_group(Communicator& device, int color);

}  // namespace wb::parallel
