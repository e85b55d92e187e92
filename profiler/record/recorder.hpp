// The recording side of the profiler: scoped host ranges, counters, explicit spans and passthrough rows.
//
// Hot path. A Range writes one 32-byte Record into its thread's current chunk: no lock, no allocation,
// two now_ticks() reads and a release store that publishes the record to the flusher. Chunks come from a
// recycled pool; a full chunk goes to the flusher through a briefly locked list. When the pool is empty
// the event is dropped and counted (Writer::count_dropped), never hidden.
//
// Flusher. One background thread per Recorder wakes every flush_interval (or when a chunk fills), reads
// every thread's published records, converts ticks to nanoseconds on rank 0's clock and hands rows to
// the store Writer. It also grows the pool ahead of demand, so producers never allocate.
//
// Compile-time switch: without WB_PROFILE (cmake -DWB_PROFILE=OFF) Range, counter() and record_range()
// are empty inline functions in another inline namespace, so they compile to nothing and the two
// variants never collide. Run-time switch: RecorderOptions::enabled / set_enabled(false) (--no-profile).
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>

#include "profiler/record/clock.hpp"
#include "profiler/record/clock_sync.hpp"
#include "store/rows.hpp"

namespace wb::store {
class Writer;
}

namespace wb::profiler {

class Capture;

using NameId = std::uint32_t;
using store::Category;

class ProfilerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A counter track (e.g. a batch queue's depth), created with Recorder::add_counter_track.
struct CounterTrack {
  std::uint32_t id = 0;
};

struct RecorderOptions {
  bool enabled = true;                     // false: ranges and counters record nothing (--no-profile)
  std::uint32_t chunk_records = 4096;      // records per chunk (32 B each: 128 KiB)
  std::uint32_t initial_chunks = 32;       // allocated up front
  std::uint32_t max_chunks = 1024;         // the pool never grows beyond this; then events drop
  std::chrono::milliseconds flush_interval{50};
  bool wake_on_full_chunk = true;          // a full chunk wakes the flusher at once
  ClockMap clock;                          // local -> rank-0 time (ClockMap{} = offset 0)
};

// Called around every range when set (CUPTI external correlation, NVTX). begin returns the correlation
// id pushed for the range (0 = none); end pops what begin pushed. Both run on the recording thread.
struct RangeHooks {
  std::uint32_t (*begin)(NameId name) = nullptr;
  void (*end)() = nullptr;
};

namespace detail {

enum RecordKind : std::uint8_t { kRangeTicks = 0, kRangeNs = 1, kCounter = 2 };

// One event in a thread's chunk. For a counter, name holds the track id, start the time and end the
// value's bits (its step places it for a triggered capture).
struct Record {
  std::int64_t start;
  std::int64_t end;
  std::uint32_t name;
  std::uint32_t corr;
  std::int32_t step;
  std::uint8_t category;
  std::uint8_t depth;
  std::uint8_t kind;
  std::uint8_t reserved;
};
static_assert(sizeof(Record) == 32, "a record must stay 32 bytes: it is the unit of the hot path and the pool");

// A fixed-capacity block of records. The producer publishes a prefix with a release store of
// `published`; the flusher reads records below it. Only the flusher recycles a chunk.
struct Chunk {
  std::atomic<std::uint32_t> published{0};
  std::uint32_t consumed = 0;  // flusher only
  std::uint32_t track = 0;     // set by the producer before the first publish
  std::uint32_t capacity = 0;
  Chunk* next = nullptr;
  Record* records = nullptr;
};

// Per recording thread. The producer owns the plain fields; the flusher reads chunk/dropped/retired.
struct ThreadState {
  Record* records = nullptr;  // current chunk's records
  std::uint32_t n = 0;        // records written into the current chunk
  std::uint32_t capacity = 0; // 0 when there is no current chunk
  std::int32_t depth = 0;
  std::uint32_t track = 0;
  std::uint64_t gen = 0;      // the recorder generation this state belongs to
  Chunk* own = nullptr;       // current chunk (producer's copy)
  std::atomic<Chunk*> chunk{nullptr};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<bool> retired{false};
  std::uint64_t dropped_reported = 0;  // flusher only
};

extern std::atomic<bool> g_active;
extern std::atomic<std::uint64_t> g_gen;
extern std::atomic<std::int32_t> g_step;
extern std::atomic<const RangeHooks*> g_hooks;
// initial-exec: the recorder is linked into executables, never dlopen'ed, so the thread pointer is one
// fs-relative load instead of a __tls_get_addr call on every range.
extern constinit thread_local ThreadState* t_state __attribute__((tls_model("initial-exec")));

ThreadState* attach_thread() noexcept;      // slow path: first event of a thread (may return nullptr)
void chunk_full(ThreadState* s) noexcept;    // slow path: hand the full chunk over, take the next one
bool refill(ThreadState* s) noexcept;        // slow path: take a chunk after the pool ran dry

inline ThreadState* state() noexcept {
  ThreadState* s = t_state;
  if (s != nullptr && s->gen == g_gen.load(std::memory_order_relaxed)) [[likely]] return s;
  return attach_thread();
}

inline void push(ThreadState* s, const Record& r) noexcept {
  if (s->n == s->capacity) [[unlikely]] {
    if (!refill(s)) {
      s->dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  s->records[s->n] = r;
  ++s->n;
  s->own->published.store(s->n, std::memory_order_release);
  if (s->n == s->capacity) [[unlikely]] chunk_full(s);
}

}  // namespace detail

// The recorder's own cost per event, measured: `n` ranges through the exact hot path of a Range (the
// activity flag, the thread state, the step, two clock reads, the record's store and its release
// publish) into a private chunk that no flusher reads, so nothing reaches the run file. Median of
// `rounds` rounds, in nanoseconds per event. Run on the recording thread, it measures that thread's
// cost on this machine under the current load; `wb report` multiplies it by the events per step.
double measure_ns_per_event(int n = 20000, int rounds = 5);

// The training step stamped on ranges that begin from now on (-1 outside a step).
inline void set_step(std::int32_t step) noexcept { detail::g_step.store(step, std::memory_order_relaxed); }
inline std::int32_t current_step() noexcept { return detail::g_step.load(std::memory_order_relaxed); }

// Names this thread's track ("main", "data-worker-0", "comm"). Best called before the thread's first
// event; a later call starts a new track with the new name. Stored for later when no recorder runs.
void set_thread_name(std::string_view name, store::TrackKind kind = store::TrackKind::thread);

#if defined(WB_PROFILE) && WB_PROFILE
inline namespace enabled_build {

// A host range for the lifetime of the object. Names are interned beforehand (Recorder::intern).
class Range {
 public:
  Range(NameId name, Category category) noexcept {
    if (!detail::g_active.load(std::memory_order_relaxed)) return;
    s_ = detail::state();
    if (s_ == nullptr) return;
    name_ = name;
    category_ = static_cast<std::uint8_t>(category);
    depth_ = static_cast<std::uint8_t>(s_->depth++);
    step_ = detail::g_step.load(std::memory_order_relaxed);
    hooks_ = detail::g_hooks.load(std::memory_order_relaxed);
    if (hooks_ != nullptr) [[unlikely]] corr_ = hooks_->begin(name);
    start_ = now_ticks();
  }
  ~Range() {
    if (s_ == nullptr) return;
    std::int64_t end = now_ticks();
    if (hooks_ != nullptr) [[unlikely]] hooks_->end();
    --s_->depth;
    detail::push(s_, detail::Record{start_, end, name_, corr_, step_, category_, depth_, detail::kRangeTicks, 0});
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  detail::ThreadState* s_ = nullptr;
  const RangeHooks* hooks_ = nullptr;
  std::int64_t start_ = 0;
  NameId name_ = 0;
  std::uint32_t corr_ = 0;
  std::int32_t step_ = 0;
  std::uint8_t category_ = 0;
  std::uint8_t depth_ = 0;
};

// A sample of a counter track at t_ns (now_ns() clock), e.g. queue depth at a push or pop.
inline void counter(CounterTrack track, double value, std::int64_t t_ns) noexcept {
  if (!detail::g_active.load(std::memory_order_relaxed)) return;
  detail::ThreadState* s = detail::state();
  if (s == nullptr) return;
  detail::push(s, detail::Record{t_ns, std::bit_cast<std::int64_t>(value), track.id, 0,
                                 detail::g_step.load(std::memory_order_relaxed), 0, 0, detail::kCounter, 0});
}
inline void counter(CounterTrack track, double value) noexcept { counter(track, value, now_ns()); }

// A range measured elsewhere (start/end on the now_ns() clock), recorded on this thread's track at the
// current nesting depth plus `extra_depth`: a range recorded after the fact that lies inside another
// one recorded later (a transform inside its batch) passes 1, so the timeline nests it.
inline void record_range(NameId name, Category category, std::int64_t start_ns, std::int64_t end_ns,
                         std::int32_t step, int extra_depth = 0) noexcept {
  if (!detail::g_active.load(std::memory_order_relaxed)) return;
  detail::ThreadState* s = detail::state();
  if (s == nullptr) return;
  detail::push(s, detail::Record{start_ns, end_ns, name, 0, step, static_cast<std::uint8_t>(category),
                                 static_cast<std::uint8_t>(s->depth + extra_depth), detail::kRangeNs, 0});
}
inline void record_range(NameId name, Category category, std::int64_t start_ns, std::int64_t end_ns) noexcept {
  record_range(name, category, start_ns, end_ns, current_step());
}

}  // namespace enabled_build
#else
inline namespace disabled_build {

class Range {
 public:
  Range(NameId, Category) noexcept {}
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};
inline void counter(CounterTrack, double, std::int64_t) noexcept {}
inline void counter(CounterTrack, double) noexcept {}
inline void record_range(NameId, Category, std::int64_t, std::int64_t, std::int32_t, int = 0) noexcept {}
inline void record_range(NameId, Category, std::int64_t, std::int64_t) noexcept {}

}  // namespace disabled_build
#endif

// One recording session writing into a store Writer. At most one exists at a time (the hot path uses
// process-wide state); constructing a second throws ProfilerError. Destroying it (or stop()) drains
// every published record: call it after the recording threads have finished their ranges.
class Recorder {
 public:
  Recorder(store::Writer& writer, RecorderOptions options = {});
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // The running recorder, or nullptr.
  static Recorder* current();

  NameId intern(std::string_view name);
  // The text of an interned id ("" for unknown ids); stable for the recorder's lifetime.
  const char* name_text(NameId id) const;
  CounterTrack add_counter_track(std::string_view name);

  void set_enabled(bool enabled);
  bool enabled() const;
  ClockMap clock() const;

  // Passthrough rows: times are local now_ns(); the recorder maps them to rank-0 time.
  void add(store::AllreduceRow row);
  void add(store::StepRow row);
  void add(std::span<const store::KernelRow> rows);  // device activity, already on the host clock

  void set_range_hooks(const RangeHooks* hooks);
  // Triggered capture (capture.hpp): event rows (ranges, counters, kernels, allreduce spans) go to
  // `capture`, which holds them until their step is decided; step rows still go straight to the Writer.
  // nullptr (the default) writes everything. Set before the first event; `capture` outlives the recorder.
  void set_capture(Capture* capture);

  // Writes everything published so far to the Writer and waits for the Writer to commit it.
  void flush();
  // Drains, stops the flusher and detaches every thread. Idempotent.
  void stop();

  // Events dropped by the recorder itself (pool exhausted), so far.
  std::uint64_t dropped() const;
  store::Writer& writer() { return writer_; }
  const RecorderOptions& options() const { return options_; }

  struct Impl;

 private:
  store::Writer& writer_;
  RecorderOptions options_;
  std::unique_ptr<Impl> impl_;
};

// Free-function forms for code that does not hold the Recorder (no-ops, returning 0, when none runs).
NameId intern(std::string_view name);
CounterTrack add_counter_track(std::string_view name);

}  // namespace wb::profiler
