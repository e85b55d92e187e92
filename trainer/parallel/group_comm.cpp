#include "trainer/parallel/group_comm.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "trainer/parallel/error.hpp"
#if WB_PARALLEL_MPI
#include "trainer/parallel/mpi_communicator.hpp"
#endif

namespace wb::parallel {

namespace {

class SelfGroup final : public GroupComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(std::span<double>) override {}
  void allreduce_sum(std::span<float>) override {}
  void allreduce_max(std::span<double>) override {}
  void allgather(std::span<const float> mine, std::span<float> all) override { copy_block(mine, all); }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) override { copy_block(all, mine); }
  const char* backend() const override { return "self"; }

 private:
  static void copy_block(std::span<const float> from, std::span<float> to) {
    if (from.size() != to.size()) throw DistError("a group of one: the blocks differ in size");
    std::copy(from.begin(), from.end(), to.begin());
  }
};

#if WB_PARALLEL_MPI
class MpiGroup final : public GroupComm {
 public:
  MpiGroup(MpiCommunicator& job, GroupScope scope) {
    if (scope == GroupScope::global) {
      WB_MPI_CHECK(MPI_Comm_dup(job.handle(), &comm_));
    } else {
      WB_MPI_CHECK(MPI_Comm_split_type(job.handle(), MPI_COMM_TYPE_SHARED, job.rank(), MPI_INFO_NULL, &comm_));
    }
    init();
  }
  MpiGroup(MpiCommunicator& job, int color) {
    WB_MPI_CHECK(MPI_Comm_split(job.handle(), color, job.rank(), &comm_));
    init();
  }
  void init() {
    WB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    WB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    WB_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MpiGroup(const MpiGroup&) = delete;
  MpiGroup& operator=(const MpiGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(std::span<double> values) override {
    if (size_ == 1) return;
    WB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), count(values.size()), MPI_DOUBLE, MPI_SUM, comm_));
  }
  void allreduce_sum(std::span<float> values) override {
    if (size_ == 1) return;
    WB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), count(values.size()), MPI_FLOAT, MPI_SUM, comm_));
  }
  void allreduce_max(std::span<double> values) override {
    if (size_ == 1) return;
    WB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), count(values.size()), MPI_DOUBLE, MPI_MAX, comm_));
  }
  void allgather(std::span<const float> mine, std::span<float> all) override {
    check_group_blocks(mine.size(), all.size(), size_, "allgather");
    WB_MPI_CHECK(MPI_Allgather(mine.data(), count(mine.size()), MPI_FLOAT, all.data(), count(mine.size()), MPI_FLOAT,
                               comm_));
  }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) override {
    check_group_blocks(mine.size(), all.size(), size_, "reduce_scatter_sum");
    WB_MPI_CHECK(MPI_Reduce_scatter_block(all.data(), mine.data(), count(mine.size()), MPI_FLOAT, MPI_SUM, comm_));
  }
  const char* backend() const override { return "mpi"; }

 private:
  static int count(std::size_t n) {
    if (n > static_cast<std::size_t>(INT_MAX)) throw DistError("a rank group's collective: more than INT_MAX values");
    return static_cast<int>(n);
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};
#endif

// Without MPI: a single process is a group of one; anything else cannot be split.
std::unique_ptr<GroupComm> self_group(Communicator& job) {
  if (job.size() == 1) return std::make_unique<SelfGroup>();
  throw DistError(std::string("a rank group needs the job's MPI communicator, got ") + job.backend());
}

#if WB_PARALLEL_MPI
// The colour of this rank's host: the lowest job rank among the ranks that share its memory.
int host_color(MpiCommunicator& job) {
  MPI_Comm local = MPI_COMM_NULL;
  WB_MPI_CHECK(MPI_Comm_split_type(job.handle(), MPI_COMM_TYPE_SHARED, job.rank(), MPI_INFO_NULL, &local));
  int mine = job.rank(), lowest = 0;
  const int rc = MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, local);
  MPI_Comm_free(&local);
  WB_MPI_CHECK(rc);
  return lowest;
}
#endif

// A NCCL group needs the job's MPI communicator beside the NCCL one.
void check_device(Communicator& job, Communicator* device) {
  if (device == nullptr) return;
  if (std::string(device->backend()) != "nccl") {
    throw DistError(std::string("a rank group on the device needs the job's NCCL communicator, got ") + device->backend());
  }
  if (device->size() != job.size() || device->rank() != job.rank()) {
    throw DistError("a rank group: the NCCL and MPI communicators do not cover the same ranks");
  }
}

}  // namespace

void check_group_blocks(std::size_t mine, std::size_t all, int size, const char* op) {
  if (all != mine * static_cast<std::size_t>(size)) {
    throw DistError(std::string(op) + ": " + std::to_string(all) + " values for " + std::to_string(size) +
                    " blocks of " + std::to_string(mine));
  }
}

std::unique_ptr<GroupComm> make_group_comm(Communicator& job, GroupScope scope, Communicator* device) {
  check_device(job, device);
#if WB_PARALLEL_MPI
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(&job)) {
    if (device) return make_nccl_group(*device, scope == GroupScope::global ? 0 : host_color(*mpi));
    return std::make_unique<MpiGroup>(*mpi, scope);
  }
#endif
  (void)scope;
  return self_group(job);
}

std::unique_ptr<GroupComm> split_group_comm(Communicator& job, int color, Communicator* device) {
  check_device(job, device);
#if WB_PARALLEL_MPI
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(&job)) {
    if (device) return make_nccl_group(*device, color);
    return std::make_unique<MpiGroup>(*mpi, color);
  }
#endif
  (void)color;
  return self_group(job);
}

}  // namespace wb::parallel
