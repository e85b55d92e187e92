// `wb export chrome`: a run file as Chrome-trace / Perfetto JSON. One process per rank, one thread per
// track, host ranges and device activity as complete ("X") events, queue depths as counter ("C")
// events, allreduce buckets on a lane of their own, and a flow arrow from each host range to every
// kernel it launched (matching corr_id). Pipeline runs add a lane per rank with each micro-batch's
// forward and backward and each send and receive, and a flow arrow from every send to its receive.
#pragma once

#include <cstdint>
#include <filesystem>

namespace wb::store {
class Reader;
}

namespace wb::analysis {

struct ChromeExportStats {
  std::int64_t events = 0;  // every JSON event written, metadata included
  std::int64_t ranges = 0;
  std::int64_t kernels = 0;
  std::int64_t counters = 0;
  std::int64_t flows = 0;   // arrows (each is a start and a finish event)
  std::int64_t allreduces = 0;
  std::int64_t p2p = 0;     // pipeline micro-batch and message spans
  std::int64_t origin_ns = 0;  // subtracted from every time: the earliest time in the run
};

// Writes out (replacing it). Throws StoreError for a bad run file and std::runtime_error naming the
// output path when it cannot be written.
ChromeExportStats export_chrome(store::Reader& reader, const std::filesystem::path& out);

}  // namespace wb::analysis
