#pragma once
// Sums of small vectors of doubles over a group of the job's ranks (SyncBatchNorm's statistics), on an
// MPI communicator of their own: the model calls them from the training thread while GradientSync's
// communication thread may be inside a gradient allreduce on the job's communicator, and collectives on
// two communicators never match each other.
//
// Scopes, as AIACC's PerseusSyncBatchNorm comm_scope: global = every rank of the job; local = the ranks
// of this host (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED).

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
};

// The group of this rank within `job` (self or MPI). A single process is a group of one. Throws
// DistError for another kind of communicator (NCCL: pass the host one) or a build without MPI.
std::unique_ptr<GroupComm> make_group_comm(Communicator& job, GroupScope scope);

}  // namespace wb::parallel
