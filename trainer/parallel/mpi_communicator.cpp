#include "trainer/parallel/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <limits>
#include <string>

#include "trainer/parallel/clock.hpp"
#include "trainer/parallel/error.hpp"

namespace wb::parallel {

void check_mpi(int rc, const char* statement, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw DistError(std::string(statement) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  std::string(text, static_cast<std::size_t>(len)));
}

MpiCommunicator::MpiCommunicator() {
  int initialized = 0;
  WB_MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    WB_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    owns_mpi_ = true;
  } else {
    WB_MPI_CHECK(MPI_Query_thread(&provided));
  }
  // SERIALIZED is enough for the collectives themselves (see the header); below that the
  // communication thread may not call MPI at all.
  if (provided < MPI_THREAD_SERIALIZED) {
    if (owns_mpi_) MPI_Finalize();
    throw DistError("MPI provides thread level " + std::to_string(provided) +
                    "; the communication thread needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE");
  }
  WB_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  WB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  WB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  WB_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::MpiCommunicator(const MpiCommunicator& parent, int color, int key) {
  WB_MPI_CHECK(MPI_Comm_split(parent.comm_, color, key, &comm_));
  WB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  WB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  WB_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  if (owns_mpi_) MPI_Finalize();
}

namespace {
// MPI counts are int: larger buffers go in chunks.
constexpr std::size_t kMaxChunk = static_cast<std::size_t>(INT_MAX) / 2;
}  // namespace

void MpiCommunicator::allreduce(float* data, std::size_t count, ReduceOp op) {
  for (std::size_t done = 0; done < count; done += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, count - done));
    WB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, comm_));
  }
  if (op == ReduceOp::mean && size_ > 1) {
    const float n = static_cast<float>(size_);
    for (std::size_t i = 0; i < count; ++i) data[i] /= n;
  }
}

void MpiCommunicator::broadcast(float* data, std::size_t count, int root) {
  if (root < 0 || root >= size_) {
    throw DistError("broadcast: root " + std::to_string(root) + " is not a rank of a world of size " +
                    std::to_string(size_));
  }
  for (std::size_t done = 0; done < count; done += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, count - done));
    WB_MPI_CHECK(MPI_Bcast(data + done, n, MPI_FLOAT, root, comm_));
  }
}

void MpiCommunicator::broadcast_bytes(void* data, std::size_t bytes, int root) {
  if (bytes > kMaxChunk) throw DistError("broadcast_bytes: " + std::to_string(bytes) + " bytes is too large");
  WB_MPI_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_));
}

void MpiCommunicator::barrier() { WB_MPI_CHECK(MPI_Barrier(comm_)); }

std::vector<std::int64_t> MpiCommunicator::allgather(std::span<const std::int64_t> values) {
  std::vector<std::int64_t> all(values.size() * static_cast<std::size_t>(size_));
  const int n = static_cast<int>(values.size());
  WB_MPI_CHECK(MPI_Allgather(values.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm_));
  return all;
}

void MpiCommunicator::abort_job(int exit_code) noexcept {
  MPI_Abort(MPI_COMM_WORLD, exit_code);  // the whole job, a stage group's communicator included
}

std::vector<ClockOffset> measure_clock_offsets(MpiCommunicator& comm, int round_trips,
                                               const std::function<std::int64_t()>& clock) {
  if (round_trips < 1) {
    throw DistError("measure_clock_offsets: round_trips must be >= 1, got " + std::to_string(round_trips));
  }
  const auto time = [&]() { return clock ? clock() : now_ns(); };
  constexpr int kTag = 7301;
  const MPI_Comm c = comm.handle();
  // Rank 0 fills every entry as [offset, round_trip] pairs, then broadcasts them.
  std::vector<std::int64_t> table(2 * static_cast<std::size_t>(comm.size()), 0);
  if (comm.rank() == 0) {
    for (int peer = 1; peer < comm.size(); ++peer) {
      std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max();
      std::int64_t best_offset = 0;
      for (int k = 0; k < round_trips; ++k) {
        const std::int64_t t0 = time();
        WB_MPI_CHECK(MPI_Send(&t0, 1, MPI_INT64_T, peer, kTag, c));
        std::int64_t t1 = 0;
        WB_MPI_CHECK(MPI_Recv(&t1, 1, MPI_INT64_T, peer, kTag, c, MPI_STATUS_IGNORE));
        const std::int64_t t2 = time();
        if (t2 - t0 < best_rtt) {
          best_rtt = t2 - t0;
          // (t0 + t2) / 2 without overflowing.
          best_offset = t1 - (t0 + (t2 - t0) / 2);
        }
      }
      table[2 * peer] = best_offset;
      table[2 * peer + 1] = best_rtt;
    }
  } else {
    for (int k = 0; k < round_trips; ++k) {
      std::int64_t t0 = 0;
      WB_MPI_CHECK(MPI_Recv(&t0, 1, MPI_INT64_T, 0, kTag, c, MPI_STATUS_IGNORE));
      const std::int64_t t1 = time();
      WB_MPI_CHECK(MPI_Send(&t1, 1, MPI_INT64_T, 0, kTag, c));
    }
  }
  WB_MPI_CHECK(MPI_Bcast(table.data(), static_cast<int>(table.size()), MPI_INT64_T, 0, c));
  std::vector<ClockOffset> out(static_cast<std::size_t>(comm.size()));
  for (std::size_t r = 0; r < out.size(); ++r) out[r] = {table[2 * r], table[2 * r + 1]};
  return out;
}

bool have_mpi() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

std::optional<ClockOffset> offset_to_rank0(Communicator& comm, int round_trips) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
  if (!mpi || mpi->size() == 1) return std::nullopt;
  return measure_clock_offsets(*mpi, round_trips)[static_cast<std::size_t>(mpi->rank())];
}

}  // namespace wb::parallel
