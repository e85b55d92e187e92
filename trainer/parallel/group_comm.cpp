#include "trainer/parallel/group_comm.hpp"

#include <algorithm>
#include <climits>

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
    if (values.size() > static_cast<std::size_t>(INT_MAX)) throw DistError("allreduce_sum: more than INT_MAX values");
    WB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                               comm_));
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};
#endif

}  // namespace

std::unique_ptr<GroupComm> make_group_comm(Communicator& job, GroupScope scope) {
#if WB_PARALLEL_MPI
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(&job)) return std::make_unique<MpiGroup>(*mpi, scope);
#endif
  (void)scope;
  if (job.size() == 1) return std::make_unique<SelfGroup>();
  throw DistError(std::string("a rank group needs the job's MPI communicator, got ") + job.backend());
}

}  // namespace wb::parallel
