#pragma once
// The one exception type of the data-parallel layer: bad split points or bucket sizes, a bad launcher
// environment, a failed MPI/NCCL call. The message is one line naming the flag, variable or call.

#include <stdexcept>
#include <string>

namespace wb::parallel {

class DistError : public std::runtime_error {
 public:
  explicit DistError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace wb::parallel
