// Shared helpers of the store and view tests: catching an error's message (and TempDir, from tests/support).
#pragma once

#include <string>

#include "support/temp_dir.hpp"

namespace wb::test {

// The message of the exception of type E that f throws, or "" when it throws nothing.
template <typename E, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace wb::test
