// GPU activity for the profiler through CUPTI's Activity API: concurrent kernels (NCCL's included),
// memcpy and memset, with timestamps on the host's now_ns() clock and each activity linked to the host
// range that launched it (an external correlation id pushed for every Range). Optionally NVTX ranges
// with the same names, so Nsight Systems shows our op names (--nvtx). CUDA builds only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "profiler/record/recorder.hpp"
#include "store/rows.hpp"

namespace wb::profiler::cuda {

// Reports a failed CUPTI call with its statement, file:line and CUPTI's message (WB_CUPTI_CHECK).
void cupti_check(int result, const char* what, const char* file, int line);
#define WB_CUPTI_CHECK(call) ::wb::profiler::cuda::cupti_check(static_cast<int>(call), #call, __FILE__, __LINE__)

// True when the CUDA runtime sees at least one device (false when no driver is installed).
bool device_present();

// Turns CUPTI activity records into kernel rows. Kept apart from the tracer so the conversion can be
// checked on hand-built records without a GPU. Kernels whose launch carried an external correlation id
// get it as corr_id (the launching Range's id); records may arrive before their correlation record, so
// those wait (take_rows(false)) until it shows up or until the end (take_rows(true): corr_id 0).
class ActivityConverter {
 public:
  using InternFn = std::function<std::uint32_t(std::string_view)>;
  using StreamTrackFn = std::function<std::uint32_t(std::uint32_t device, std::uint32_t stream)>;

  ActivityConverter(InternFn intern, StreamTrackFn stream_track);

  // record points to one CUpti_Activity (a typedef of an unnamed struct, so it cannot be declared here).
  void add(const void* record);
  // Rows ready to write; with final = true, also those still waiting for their correlation.
  std::vector<store::KernelRow> take_rows(bool final);
  std::size_t waiting() const { return waiting_.size(); }
  // Kernel, memcpy and memset records dropped because CUPTI collected no timestamp for them.
  std::uint64_t untimed() const { return untimed_; }

 private:
  struct Waiting {
    std::uint32_t correlation;
    store::KernelRow row;
  };
  void emit(std::uint32_t correlation, store::KernelRow row);
  // The runtime or driver call with this correlation, when its record came first: the row's launch_ns
  // and launch_end_ns.
  void fill_launch(std::uint32_t correlation, store::KernelRow& row) const;

  InternFn intern_;
  StreamTrackFn stream_track_;
  std::map<std::uint32_t, std::uint64_t> external_;  // CUPTI correlation id -> our range's id
  std::map<std::uint32_t, std::pair<std::int64_t, std::int64_t>> calls_;  // correlation id -> API call's span
  std::vector<Waiting> waiting_;
  std::vector<store::KernelRow> ready_;
  std::uint32_t max_correlation_ = 0;
  std::uint64_t untimed_ = 0;
};

struct CuptiOptions {
  std::size_t buffer_bytes = std::size_t{4} << 20;  // CUPTI recommends 1-10 MB per buffer
  bool nvtx = false;                                 // also push NVTX ranges with the op names
};

// Traces GPU activity into the running Recorder's Writer until destroyed. One per process.
class CuptiTracer {
 public:
  explicit CuptiTracer(Recorder& recorder, CuptiOptions options = {});
  // Forces CUPTI to hand over every remaining record: synchronize the device first, or the records of
  // work still queued arrive without timestamps (and are dropped and counted).
  ~CuptiTracer();
  CuptiTracer(const CuptiTracer&) = delete;
  CuptiTracer& operator=(const CuptiTracer&) = delete;

  // Asks CUPTI to hand over the buffers of completed records (not forced: a forced flush would hand
  // over records of work still queued, without timestamps) and writes the rows.
  void flush();
  // Activity records CUPTI reported as dropped so far.
  std::uint64_t dropped() const;

  // Stops collecting without unsubscribing (CUPTI does not promise that subscribing again in one process
  // works, so a program that traces in phases keeps one tracer and toggles it): takes the range hooks
  // off, hands over every record (synchronize the device first, as for the destructor) and disables the
  // activity kinds. resume() enables them again. Both are no-ops when already in that state.
  void pause();
  void resume();

  struct State;

 private:
  std::unique_ptr<State> state_;
  bool paused_ = false;
};

}  // namespace wb::profiler::cuda
