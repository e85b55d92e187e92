// Shared helpers of the store and view tests: catching an error's message, how full range_data's pages are
// (and TempDir, from tests/support).
#pragma once

#include <filesystem>
#include <string>

#include "store/db.hpp"
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

// The share of range_data's page bytes left unused, from SQLite's dbstat; 0 for a file without ranges.
inline double range_pages_unused(const std::filesystem::path& file) {
  store::Db db(file, store::OpenMode::read_only);
  auto& st = db.prepare("SELECT sum(unused), sum(pgsize) FROM dbstat WHERE name = 'range_data'");
  const bool got = st.step() && !st.column_is_null(1);
  const double unused = got ? static_cast<double>(st.column_int64(0)) / static_cast<double>(st.column_int64(1)) : 0.0;
  st.reset();
  return unused;
}

}  // namespace wb::test
