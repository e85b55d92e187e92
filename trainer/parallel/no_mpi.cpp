// The MPI entry points of a build without MPI (WB_MPI=OFF): a clear error on request.
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/world.hpp"

namespace wb::parallel {

bool have_mpi() { return false; }

std::unique_ptr<Communicator> make_mpi_communicator() {
  throw DistError("this build has no MPI communicator (configure with -DWB_MPI=ON and OpenMPI installed)");
}

std::optional<ClockOffset> offset_to_rank0(Communicator& comm, int round_trips) {
  (void)comm;
  (void)round_trips;
  return std::nullopt;
}

}  // namespace wb::parallel
