// CUPTI's Activity API into kernel rows (cupti_tracer.hpp): activity records converted and linked to
// the host range that launched them through an external correlation id, buffers handed over on CUPTI's
// threads, and the tracer's start, pause, resume and flush. CUPTI itself is loaded by cupti_api.cpp.
#include "profiler/record/cuda/cupti_tracer.hpp"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/check.hpp"
#include "profiler/record/cuda/cupti_api.hpp"
#include "store/writer.hpp"

namespace wb::profiler::cuda {

namespace {

// The newest record layouts of this toolkit; the fields used here sit in every version.
#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
#else
using KernelRecord = CUpti_ActivityKernel9;
using MemcpyRecord = CUpti_ActivityMemcpy5;
#endif
using MemsetRecord = CUpti_ActivityMemset4;

constexpr std::uint32_t kReleaseDistance = 100'000;  // a launch this far behind the newest id is never correlated
constexpr std::uint32_t kKeepDistance = 1'000'000;   // correlation entries kept behind the newest id

const char* memcpy_name(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

}  // namespace

void cupti_check(int result, const char* what, const char* file, int line) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = "unknown CUPTI error";
  if (const CuptiApi* api = cupti_if_loaded()) api->get_result_string(static_cast<CUptiResult>(result), &message);
  throw ProfilerError(std::string("CUPTI: ") + what + " failed at " + file + ":" + std::to_string(line) + ": " +
                      message);
}

bool device_present() { return ::wb::cuda::device_count() > 0; }

ActivityConverter::ActivityConverter(InternFn intern, StreamTrackFn stream_track)
    : intern_(std::move(intern)), stream_track_(std::move(stream_track)) {}

void ActivityConverter::fill_launch(std::uint32_t correlation, store::KernelRow& row) const {
  auto it = calls_.find(correlation);
  if (it == calls_.end() || row.launch_ns >= 0) return;
  row.launch_ns = it->second.first;
  row.launch_end_ns = it->second.second;
}

void ActivityConverter::emit(std::uint32_t correlation, store::KernelRow row) {
  // start == end == 0: CUPTI collected no timestamp (cupti_activity.h), as in a record a forced flush
  // handed over before its work ran. A row at time 0 would be a lie on the timeline: drop and count it.
  if (row.start_ns == 0 || row.end_ns == 0) {
    ++untimed_;
    return;
  }
  fill_launch(correlation, row);
  auto it = external_.find(correlation);
  if (it != external_.end()) {
    row.corr_id = it->second;
    ready_.push_back(row);
  } else {
    waiting_.push_back({correlation, row});
  }
}

void ActivityConverter::add(const void* raw) {
  const auto* record = static_cast<const CUpti_Activity*>(raw);
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const KernelRecord*>(record);
      store::KernelRow row;
      row.track = stream_track_(k->deviceId, k->streamId);
      row.name = intern_(k->name != nullptr ? k->name : "kernel");
      row.start_ns = static_cast<std::int64_t>(k->start);
      row.end_ns = static_cast<std::int64_t>(k->end);
      row.kind = static_cast<std::uint8_t>(store::KernelKind::kernel);
      row.grid[0] = k->gridX;
      row.grid[1] = k->gridY;
      row.grid[2] = k->gridZ;
      row.block[0] = k->blockX;
      row.block[1] = k->blockY;
      row.block[2] = k->blockZ;
      emit(k->correlationId, row);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const MemcpyRecord*>(record);
      store::KernelRow row;
      row.track = stream_track_(m->deviceId, m->streamId);
      row.name = intern_(memcpy_name(m->copyKind));
      row.start_ns = static_cast<std::int64_t>(m->start);
      row.end_ns = static_cast<std::int64_t>(m->end);
      row.kind = static_cast<std::uint8_t>(store::KernelKind::memcpy);
      row.bytes = static_cast<std::int64_t>(m->bytes);
      emit(m->correlationId, row);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const MemsetRecord*>(record);
      store::KernelRow row;
      row.track = stream_track_(m->deviceId, m->streamId);
      row.name = intern_("memset");
      row.start_ns = static_cast<std::int64_t>(m->start);
      row.end_ns = static_cast<std::int64_t>(m->end);
      row.kind = static_cast<std::uint8_t>(store::KernelKind::memset);
      row.bytes = static_cast<std::int64_t>(m->bytes);
      emit(m->correlationId, row);
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      // The API call that launched work (HTA's launch delay and queue length read its span).
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      if (a->start == 0 || a->end == 0) break;
      calls_[a->correlationId] = {static_cast<std::int64_t>(a->start), static_cast<std::int64_t>(a->end)};
      if (a->correlationId > kKeepDistance && calls_.begin()->first < a->correlationId - kKeepDistance)
        calls_.erase(calls_.begin(), calls_.lower_bound(a->correlationId - kKeepDistance));
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (e->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) break;
      external_[e->correlationId] = e->externalId;
      max_correlation_ = std::max(max_correlation_, e->correlationId);
      // Settle the launches that were waiting for this id, and give up on those far behind the newest.
      std::vector<Waiting> still;
      for (Waiting& w : waiting_) {
        auto it = external_.find(w.correlation);
        fill_launch(w.correlation, w.row);
        if (it != external_.end()) {
          w.row.corr_id = it->second;
          ready_.push_back(w.row);
        } else if (w.correlation + kReleaseDistance < max_correlation_) {
          ready_.push_back(w.row);
        } else {
          still.push_back(w);
        }
      }
      waiting_.swap(still);
      if (max_correlation_ > kKeepDistance) external_.erase(external_.begin(), external_.lower_bound(max_correlation_ - kKeepDistance));
      break;
    }
    default:
      break;
  }
}

std::vector<store::KernelRow> ActivityConverter::take_rows(bool final) {
  if (final) {
    for (Waiting& w : waiting_) ready_.push_back(w.row);
    waiting_.clear();
  }
  std::vector<store::KernelRow> out;
  out.swap(ready_);
  return out;
}

struct CuptiTracer::State {
  State(Recorder& r, CuptiOptions o)
      : api(cupti()),
        recorder(r),
        options(o),
        converter([this](std::string_view name) { return recorder.intern(name); },
                  [this](std::uint32_t device, std::uint32_t stream) { return stream_track(device, stream); }) {}

  std::uint32_t stream_track(std::uint32_t device, std::uint32_t stream) {
    auto key = std::make_pair(device, stream);
    auto it = tracks.find(key);
    if (it != tracks.end()) return it->second;
    std::uint32_t id = recorder.writer().add_track(store::TrackKind::stream,
                                                   "cuda:" + std::to_string(device) + " stream " + std::to_string(stream));
    tracks.emplace(key, id);
    return id;
  }

  const CuptiApi& api;  // loaded before anything else: without CUPTI no tracer is made
  Recorder& recorder;
  CuptiOptions options;
  std::mutex mutex;  // CUPTI may complete buffers on several threads
  ActivityConverter converter;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> tracks;
  std::atomic<std::uint64_t> dropped{0};
};

namespace {

std::atomic<CuptiTracer::State*> g_state{nullptr};
std::atomic<std::uint32_t> g_next_corr{1};
std::atomic<bool> g_nvtx{false};
std::atomic<const CuptiApi*> g_api{nullptr};  // set while a tracer runs (the range hooks use it)

std::uint64_t CUPTIAPI host_timestamp() { return static_cast<std::uint64_t>(now_ns()); }

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  CuptiTracer::State* s = g_state.load();
  std::size_t bytes = s != nullptr ? s->options.buffer_bytes : std::size_t{4} << 20;
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, bytes));
  *size = *buffer != nullptr ? bytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  CuptiTracer::State* s = g_state.load();
  if (s != nullptr && buffer != nullptr) {
    const CuptiApi& api = s->api;
    try {
      std::lock_guard lk(s->mutex);
      CUpti_Activity* record = nullptr;
      const std::uint64_t untimed_before = s->converter.untimed();
      while (api.get_next_record(buffer, valid, &record) == CUPTI_SUCCESS) s->converter.add(record);
      if (const std::uint64_t untimed = s->converter.untimed() - untimed_before; untimed > 0) {
        s->dropped += untimed;
        s->recorder.writer().count_dropped(untimed);
      }
      std::size_t dropped = 0;
      if (api.get_num_dropped_records(context, stream, &dropped) == CUPTI_SUCCESS && dropped > 0) {
        s->dropped += dropped;
        s->recorder.writer().count_dropped(dropped);
      }
      auto rows = s->converter.take_rows(false);
      if (!rows.empty()) s->recorder.add(std::span<const store::KernelRow>(rows));
    } catch (...) {
      // A callback from CUPTI's thread must not throw; the Writer counts its own failures.
    }
  }
  std::free(buffer);
}

std::uint32_t hook_begin(NameId name) {
  std::uint32_t id = g_next_corr.fetch_add(1, std::memory_order_relaxed);
  g_api.load(std::memory_order_relaxed)->push_external_correlation_id(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id);
  if (g_nvtx.load(std::memory_order_relaxed)) {
    CuptiTracer::State* s = g_state.load(std::memory_order_relaxed);
    nvtxRangePushA(s != nullptr ? s->recorder.name_text(name) : "");
  }
  return id;
}

void hook_end() {
  std::uint64_t id = 0;
  g_api.load(std::memory_order_relaxed)->pop_external_correlation_id(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id);
  if (g_nvtx.load(std::memory_order_relaxed)) nvtxRangePop();
}

constexpr RangeHooks kHooks{&hook_begin, &hook_end};

// An external-correlation record precedes the *API* record of the launch it tags (cupti_activity.h),
// so without RUNTIME and DRIVER records no correlation arrives and no kernel is linked to its op.
// cuDNN and cuBLAS launch through the driver API, hence both.
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
                                         CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

CuptiTracer::CuptiTracer(Recorder& recorder, CuptiOptions options)
    : state_(std::make_unique<State>(recorder, options)) {
  State* expected = nullptr;
  if (!g_state.compare_exchange_strong(expected, state_.get())) {
    throw ProfilerError("profiler: a CuptiTracer is already running (one per process)");
  }
  const CuptiApi& api = state_->api;
  try {
    WB_CUPTI_CHECK(api.register_timestamp_callback(&host_timestamp));
    WB_CUPTI_CHECK(api.register_callbacks(&buffer_requested, &buffer_completed));
    for (CUpti_ActivityKind kind : kKinds) WB_CUPTI_CHECK(api.enable(kind));
  } catch (...) {
    for (CUpti_ActivityKind kind : kKinds) api.disable(kind);
    g_state.store(nullptr);
    throw;
  }
  g_api.store(&api);
  g_nvtx.store(options.nvtx);
  recorder.set_range_hooks(&kHooks);
}

CuptiTracer::~CuptiTracer() {
  state_->recorder.set_range_hooks(nullptr);
  g_nvtx.store(false);
  const CuptiApi& api = state_->api;
  api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (!paused_) {
    for (CUpti_ActivityKind kind : kKinds) api.disable(kind);
  }
  try {
    std::lock_guard lk(state_->mutex);
    auto rows = state_->converter.take_rows(true);
    if (!rows.empty()) state_->recorder.add(std::span<const store::KernelRow>(rows));
  } catch (...) {
    // Destructors do not throw; the Writer has counted the failure.
  }
  g_state.store(nullptr);
}

// Not forced: a forced flush hands over records whose work is still queued, without timestamps.
// Only the destructor forces, after the caller has synchronized the device.
void CuptiTracer::flush() { WB_CUPTI_CHECK(state_->api.flush_all(0)); }

std::uint64_t CuptiTracer::dropped() const { return state_->dropped.load(); }

void CuptiTracer::pause() {
  if (paused_) return;
  state_->recorder.set_range_hooks(nullptr);
  const CuptiApi& api = state_->api;
  WB_CUPTI_CHECK(api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  for (CUpti_ActivityKind kind : kKinds) WB_CUPTI_CHECK(api.disable(kind));
  paused_ = true;
}

void CuptiTracer::resume() {
  if (!paused_) return;
  const CuptiApi& api = state_->api;
  for (CUpti_ActivityKind kind : kKinds) WB_CUPTI_CHECK(api.enable(kind));
  state_->recorder.set_range_hooks(&kHooks);
  paused_ = false;
}

}  // namespace wb::profiler::cuda
