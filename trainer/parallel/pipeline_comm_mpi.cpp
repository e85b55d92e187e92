#include <mpi.h>

#include <climits>
#include <string>
#include <vector>

#include "trainer/parallel/error.hpp"
#include "trainer/parallel/mpi_communicator.hpp"
#include "trainer/parallel/pipeline_comm.hpp"

namespace wb::parallel {
namespace {

class MpiTransfer final : public Transfer {
 public:
  MpiTransfer(MPI_Request request, std::string what) : request_(request), what_(std::move(what)) {}
  ~MpiTransfer() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Request_free(&request_);  // abandoned while unwinding
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    MPI_Status status;
    const int rc = MPI_Wait(&request_, &status);
    if (rc != MPI_SUCCESS) check_mpi(rc, what_.c_str(), __FILE__, __LINE__);
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_Status status;
    const int rc = MPI_Test(&request_, &done, &status);
    if (rc != MPI_SUCCESS) check_mpi(rc, what_.c_str(), __FILE__, __LINE__);
    return done != 0;
  }

 private:
  MPI_Request request_;
  std::string what_;
};

// A communicator over an MPI_Comm made by MPI_Comm_split (the stage's replicas).
class MpiGroup final : public Communicator {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) {
    WB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    WB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    WB_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  void allreduce(float* data, std::size_t count, ReduceOp op) override {
    constexpr std::size_t kChunk = static_cast<std::size_t>(INT_MAX) / 2;
    for (std::size_t done = 0; done < count; done += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, count - done));
      WB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, comm_));
    }
    if (op == ReduceOp::mean && size_ > 1) {
      const float inv = 1.0f / static_cast<float>(size_);
      for (std::size_t i = 0; i < count; ++i) data[i] *= inv;
    }
  }
  void broadcast(float* data, std::size_t count, int root) override {
    constexpr std::size_t kChunk = static_cast<std::size_t>(INT_MAX) / 2;
    for (std::size_t done = 0; done < count; done += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, count - done));
      WB_MPI_CHECK(MPI_Bcast(data + done, n, MPI_FLOAT, root, comm_));
    }
  }
  void barrier() override { WB_MPI_CHECK(MPI_Barrier(comm_)); }
  std::vector<std::int64_t> allgather(std::span<const std::int64_t> values) override {
    std::vector<std::int64_t> out(values.size() * static_cast<std::size_t>(size_));
    WB_MPI_CHECK(MPI_Allgather(values.data(), static_cast<int>(values.size()), MPI_INT64_T, out.data(),
                               static_cast<int>(values.size()), MPI_INT64_T, comm_));
    return out;
  }
  using Communicator::allgather;
  void abort_job(int exit_code) noexcept override { MPI_Abort(MPI_COMM_WORLD, exit_code); }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

class MpiPipelineComm final : public PipelineComm {
 public:
  MpiPipelineComm(MpiCommunicator& world, int stage, int replica) {
    WB_MPI_CHECK(MPI_Comm_dup(world.handle(), &p2p_));
    WB_MPI_CHECK(MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN));
    MPI_Comm group = MPI_COMM_NULL;
    WB_MPI_CHECK(MPI_Comm_split(world.handle(), stage, replica, &group));
    group_ = std::make_unique<MpiGroup>(group);
  }
  ~MpiPipelineComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&p2p_);
  }
  std::unique_ptr<Transfer> send(const float* data, std::size_t count, int peer, int tag) override {
    check_count(count, "send");
    MPI_Request r = MPI_REQUEST_NULL;
    WB_MPI_CHECK(MPI_Isend(data, static_cast<int>(count), MPI_FLOAT, peer, tag, p2p_, &r));
    return std::make_unique<MpiTransfer>(r, "MPI_Isend to rank " + std::to_string(peer));
  }
  std::unique_ptr<Transfer> recv(float* data, std::size_t count, int peer, int tag) override {
    check_count(count, "recv");
    MPI_Request r = MPI_REQUEST_NULL;
    WB_MPI_CHECK(MPI_Irecv(data, static_cast<int>(count), MPI_FLOAT, peer, tag, p2p_, &r));
    return std::make_unique<MpiTransfer>(r, "MPI_Irecv from rank " + std::to_string(peer));
  }
  Communicator& stage_group() override { return *group_; }

 private:
  static void check_count(std::size_t count, const char* what) {
    if (count > static_cast<std::size_t>(INT_MAX)) {
      throw DistError(std::string("pipeline ") + what + ": " + std::to_string(count) +
                      " floats exceed one MPI message (a smaller micro-batch helps)");
    }
  }
  MPI_Comm p2p_ = MPI_COMM_NULL;
  std::unique_ptr<MpiGroup> group_;
};

}  // namespace

std::unique_ptr<PipelineComm> make_pipeline_comm(Communicator& world, int stage, int replica) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&world);
  if (!mpi) {
    throw DistError(std::string("pipeline stages need the MPI communicator; this job's is '") + world.backend() + "'");
  }
  return std::make_unique<MpiPipelineComm>(*mpi, stage, replica);
}

}  // namespace wb::parallel
