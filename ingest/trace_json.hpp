// Reading the Chrome traces torch.profiler writes, in one streaming pass over the file's bytes.
//
// Two formats exist in practice:
//  - Kineto's (PyTorch 2.x, and 1.x builds with Kineto): an object with "traceEvents", "cat" on every
//    event ("cpu_op", "user_annotation", "python_function", "kernel", "gpu_memcpy", "gpu_memset",
//    "cuda_runtime", ...), "deviceProperties" and "distributedInfo"; timestamps in microseconds with
//    three decimals; kernels carry "correlation" (their runtime call's) and "External id" (their
//    launching op's).
//  - The legacy exporter's (PyTorch builds without Kineto, such as Debian's 1.13): a bare JSON list of
//    "ph": "X" events with "pid": "CPU functions", integer microseconds, no categories and empty args.
//
// A hand-written scanner instead of a DOM: a trace of a few hundred MB holds millions of events whose
// names repeat, so names are interned as they are read and each event becomes one small struct.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/huge_pages.hpp"

namespace wb::ingest {

// A file that is not a readable trace. The message names the file and what was expected, on one line.
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The event categories torch.profiler writes; `none` is the legacy exporter's (no "cat" field).
enum class EventCat : std::uint8_t {
  none,
  cpu_op,
  user_annotation,
  python_function,
  kernel,
  gpu_memcpy,
  gpu_memset,
  cuda_runtime,   // also "cuda_driver" and ROCm's HIP runtime calls (which Kineto files as cuda_runtime)
  gpu_user_annotation,
  other,          // any other category (flows, instants, memory events, ...)
};
inline constexpr int kEventCats = 10;
std::string_view event_cat_name(EventCat c);

// One trace event. Strings are ids into ParsedTrace::strings; -1 marks an absent number. Millions of them
// are held at once: what only memory and metadata events carry is read beside it (TraceMemoryEvent).
struct TraceEvent {
  std::int64_t ts_ns = 0;
  std::int64_t dur_ns = 0;
  std::int64_t external_id = -1;  // args["External id"] (older Kineto: "external id")
  std::int64_t correlation = -1;  // args["correlation"]
  std::int64_t sequence = -1;     // args["Sequence number"]
  std::int64_t fwd_tid = -1;      // args["Fwd thread id"]
  std::int64_t bytes = 0;         // args["bytes"] of memcpys and memsets
  float blocks_per_sm = -1.0f;    // args["blocks per SM"] of kernels, -1 absent
  float occupancy = -1.0f;        // args["est. achieved occupancy %"] of kernels (percent), -1 absent
  std::int32_t grid[3] = {0, 0, 0};
  std::int32_t block[3] = {0, 0, 0};
  std::uint32_t name = 0;
  std::uint32_t pid = 0;  // the pid and tid fields as text ("CPU functions", "1234", "stream 7")
  std::uint32_t tid = 0;
  std::int32_t device = -1;  // args["device"] of GPU events
  std::int32_t stream = -1;  // args["stream"] of GPU events
  EventCat cat = EventCat::none;
  char ph = 0;
};

// One memory event: Kineto's "[memory]" instants (profile_memory=True), or the ones torch_step.py
// --profile adds to a legacy trace from each op's self_cpu_memory_usage.
struct TraceMemoryEvent {
  std::int64_t ts_ns = 0;
  std::int64_t bytes = 0;            // args["Bytes"]: > 0 allocated, < 0 freed
  std::int64_t total = -1;           // args["Total Allocated"]: the allocator's total after it, -1 absent
  std::int32_t device_type = 0;      // args["Device Type"]: 0 CPU, 1 CUDA
  std::uint32_t pid = 0, tid = 0;
};

enum class TraceFormat { legacy, kineto };

// Huge pages for the vectors an import fills once (hundreds of MB): a fault per 4 KiB page cost a fifth of
// its time.
using store::advise_huge_pages;
using store::reserve_huge;

// The parsed events in file order, in blocks of 2^18 (28 MiB each: over the mmap threshold that
// tune_allocator_for_import sets, so a freed block goes back to the system, not to the heap): a consumer
// that turns them into something else frees each block as it passes it (consume), so that the events and
// what they become are never both whole in memory.
class EventList {
 public:
  static constexpr std::size_t kBlockShift = 18;
  static constexpr std::size_t kBlock = std::size_t{1} << kBlockShift;

  void push_back(const TraceEvent& e) {
    if (blocks_.empty() || blocks_.back().size() == kBlock) {
      blocks_.emplace_back();
      reserve_huge(blocks_.back(), kBlock);
    }
    blocks_.back().push_back(e);
    ++size_;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const TraceEvent& operator[](std::size_t i) const { return blocks_[i >> kBlockShift][i & (kBlock - 1)]; }
  template <class F>
  void for_each(F&& f) const {
    for (const auto& b : blocks_)
      for (const TraceEvent& e : b) f(e);
  }
  // f(event) for each event in order, each block freed once passed; the list is empty after.
  template <class F>
  void consume(F&& f) {
    for (auto& b : blocks_) {
      for (const TraceEvent& e : b) f(e);
      std::vector<TraceEvent>().swap(b);
    }
    blocks_.clear();
    size_ = 0;
  }

 private:
  std::vector<std::vector<TraceEvent>> blocks_;
  std::size_t size_ = 0;
};

struct ParsedTrace {
  TraceFormat format = TraceFormat::legacy;
  std::vector<std::string> strings;     // interned texts; id 0 is ""
  EventList events;                     // every event of the file, in file order
  std::int64_t events_by_cat[kEventCats] = {};
  nlohmann::json device_properties = nlohmann::json::array();  // Kineto's "deviceProperties"
  nlohmann::json distributed_info = nlohmann::json::object();  // Kineto's "distributedInfo"
  // thread_name / process_name metadata events: (pid, tid) text ids -> name
  std::unordered_map<std::uint64_t, std::string> thread_names;
  std::unordered_map<std::uint32_t, std::string> process_names;
  std::vector<TraceMemoryEvent> memory;  // in file order
  // Events of categories this reader does not place ("ac2g" flows, "cuda_sync", "cuda_profiler_range",
  // ...), by category: what a trace holds instead of kernels, when it has none (at most 64 names).
  std::map<std::string, std::int64_t> other_categories;
  // The "wb_memory" metadata event torch_step.py --profile adds on CUDA: torch.cuda.max_memory_allocated
  // over the profiled steps; -1 when absent.
  std::int64_t max_memory_allocated = -1;
  // How many readers parsed the file at once: 2 when read_trace split a large plain file in halves.
  int readers = 1;
};

// Parses a trace held in memory; `file` only names it in errors. Throws TraceError: not JSON, JSON that
// is no trace (with what was found), a truncated file (with the byte offset where it ends).
ParsedTrace parse_trace(std::string_view text, const std::string& file);
// Reads and parses a file (.json, or gzip-compressed .json.gz as tensorboard_trace_handler writes) as
// it is read: in chunks of a few MB (inflated chunk by chunk), so that the memory it takes is that of the
// events, not of the text (a window of the text grows only for an event longer than half of it). A plain
// file of 32 MB or more is parsed by two threads at once, from its start and from an event of
// traceEvents near its middle, and the halves joined: the result is the one reader's, string ids
// included. Throws as parse_trace does, and for a truncated or corrupt .json.gz.
ParsedTrace read_trace(const std::filesystem::path& path);

}  // namespace wb::ingest
