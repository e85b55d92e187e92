#include "trainer/parallel/communicator.hpp"

#include <string>

#include "trainer/parallel/error.hpp"

namespace wb::parallel {

void SelfCommunicator::broadcast(float*, std::size_t, int root) {
  if (root != 0) {
    throw DistError("broadcast: root " + std::to_string(root) + " is not a rank of a world of size 1");
  }
}

std::vector<std::int64_t> SelfCommunicator::allgather(std::span<const std::int64_t> values) {
  return {values.begin(), values.end()};
}

std::uint64_t fingerprint(const float* data, std::size_t count) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < count * sizeof(float); ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;
  }
  return h;
}

bool identical_across_ranks(Communicator& comm, const float* data, std::size_t count) {
  const auto all = comm.allgather(static_cast<std::int64_t>(fingerprint(data, count)));
  for (const auto h : all) {
    if (h != all.front()) return false;
  }
  return true;
}

}  // namespace wb::parallel
