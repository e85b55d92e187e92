#pragma once
// The one exception type of the input pipeline: bad dataset files or bad pipeline settings.
// The message is a single line naming the file or flag and what was expected.

#include <stdexcept>
#include <string>

namespace wb::data {

class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace wb::data
