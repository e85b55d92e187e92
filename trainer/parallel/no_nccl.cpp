// The NCCL entry points of a build without NCCL (no CUDA toolkit, or no MPI): a clear error on request.
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/group_comm.hpp"
#include "trainer/parallel/pipeline_comm.hpp"
#include "trainer/parallel/world.hpp"

namespace wb::parallel {

bool have_nccl() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& mpi, int device) {
  (void)mpi;
  (void)device;
  throw DistError("this build has no NCCL communicator (it needs the CUDA toolkit with NCCL, and MPI)");
}

std::unique_ptr<GroupComm> make_nccl_group(Communicator&, int) {
  throw DistError("a rank group on the GPU needs NCCL, and this build has none (it needs the CUDA toolkit with NCCL, and MPI)");
}

std::unique_ptr<PipelineComm> make_nccl_pipeline_comm(Communicator&, int, int, void*) {
  throw DistError("pipeline stages on the GPU need NCCL, and this build has none (it needs the CUDA toolkit with NCCL, and MPI)");
}

}  // namespace wb::parallel
