#include <mpi.h>

#include <climits>
#include <span>
#include <string_view>
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

class MpiPipelineComm final : public PipelineComm {
 public:
  MpiPipelineComm(MpiCommunicator& world, int stage, int replica) {
    WB_MPI_CHECK(MPI_Comm_dup(world.handle(), &p2p_));
    WB_MPI_CHECK(MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN));
    group_ = std::make_unique<MpiCommunicator>(world, stage, replica);
  }
  ~MpiPipelineComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&p2p_);
  }
  std::vector<std::unique_ptr<Transfer>> post(std::span<const Message> messages) override {
    std::vector<std::unique_ptr<Transfer>> out;
    for (const Message& m : messages) {
      check_count(m.count, m.send ? "send" : "recv");
      MPI_Request r = MPI_REQUEST_NULL;
      if (m.send) {
        WB_MPI_CHECK(MPI_Isend(m.data, static_cast<int>(m.count), MPI_FLOAT, m.peer, m.tag, p2p_, &r));
      } else {
        WB_MPI_CHECK(MPI_Irecv(m.data, static_cast<int>(m.count), MPI_FLOAT, m.peer, m.tag, p2p_, &r));
      }
      out.push_back(std::make_unique<MpiTransfer>(
          r, std::string(m.send ? "MPI_Isend to rank " : "MPI_Irecv from rank ") + std::to_string(m.peer)));
    }
    return out;
  }
  bool early_receives() const override { return true; }
  void send_host(const float* data, std::size_t count, int peer, int tag) override {
    check_count(count, "send");
    WB_MPI_CHECK(MPI_Send(data, static_cast<int>(count), MPI_FLOAT, peer, tag, p2p_));
  }
  void recv_host(float* data, std::size_t count, int peer, int tag) override {
    check_count(count, "recv");
    WB_MPI_CHECK(MPI_Recv(data, static_cast<int>(count), MPI_FLOAT, peer, tag, p2p_, MPI_STATUS_IGNORE));
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
  std::unique_ptr<MpiCommunicator> group_;
};

}  // namespace

std::unique_ptr<PipelineComm> make_pipeline_comm(Communicator& world, int stage, int replica, void* compute_stream) {
  if (std::string_view(world.backend()) == "nccl") return make_nccl_pipeline_comm(world, stage, replica, compute_stream);
  auto* mpi = dynamic_cast<MpiCommunicator*>(&world);
  if (!mpi) {
    throw DistError(std::string("pipeline stages need the MPI communicator; this job's is '") + world.backend() + "'");
  }
  return std::make_unique<MpiPipelineComm>(*mpi, stage, replica);
}

}  // namespace wb::parallel
