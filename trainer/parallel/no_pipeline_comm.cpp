// The pipeline's point-to-point messages in a build without MPI (WB_MPI=OFF): a clear error on request.
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/pipeline_comm.hpp"

namespace wb::parallel {

std::unique_ptr<PipelineComm> make_pipeline_comm(Communicator&, int, int, void*) {
  throw DistError("pipeline stages need MPI, and this build has none (configure with -DWB_MPI=ON and OpenMPI installed)");
}

}  // namespace wb::parallel
