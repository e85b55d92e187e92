// Shared helpers of the store and view tests: catching an error's message, ranges on two interleaved
// tracks and how full range_data's pages are (and TempDir, from tests/support).
#pragma once

#include <filesystem>
#include <string>

#include "store/db.hpp"
#include "store/writer.hpp"
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

// `per_track` ranges on each of two tracks, recorded as two threads would: interleaved in time.
inline void write_two_tracks(store::Writer& w, int per_track) {
  const std::uint32_t a = w.add_track(store::TrackKind::thread, "main");
  const std::uint32_t b = w.add_track(store::TrackKind::thread, "worker");
  const std::uint32_t op = w.intern("op");
  for (int i = 0; i < per_track; ++i) {
    w.add(store::RangeRow{a, op, i * 1000LL, i * 1000LL + 700, 1, 0, i / 100, 0});
    w.add(store::RangeRow{b, op, i * 1000LL + 300, i * 1000LL + 900, 0, 1, i / 100, 0});
    if (i % 20'000 == 0) w.flush();
  }
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
