// Recorder internals: the chunk pool, the hand-off list, thread attachment and the flusher thread.
// Lock order: g_mutex -> (threads_mutex | full_mutex | pool_mutex | flush_mutex). The flusher never
// takes g_mutex, so stop() may hold it while joining.
#include "profiler/record/recorder.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "profiler/record/capture.hpp"
#include "store/writer.hpp"

namespace wb::profiler {

namespace detail {
std::atomic<bool> g_active{false};
std::atomic<std::uint64_t> g_gen{1};
std::atomic<std::int32_t> g_step{-1};
std::atomic<const RangeHooks*> g_hooks{nullptr};
constinit thread_local ThreadState* t_state __attribute__((tls_model("initial-exec"))) = nullptr;
}  // namespace detail

using detail::Chunk;
using detail::Record;
using detail::ThreadState;

namespace {

constexpr std::size_t kMaxNameTexts = std::size_t{1} << 16;

std::mutex g_mutex;                              // guards g_impl changes and thread attachment
std::atomic<Recorder::Impl*> g_impl{nullptr};    // the running recorder's state
std::vector<ThreadState*>* g_orphans = nullptr;  // states of threads alive at a stop(): never freed

// Names set with set_thread_name, kept per thread for when a recorder attaches it.
thread_local std::string t_name;
thread_local store::TrackKind t_kind = store::TrackKind::thread;

void retire_thread() noexcept;

struct ThreadExit {
  bool armed = false;
  ~ThreadExit() {
    if (armed) retire_thread();
  }
};
thread_local ThreadExit t_exit;

}  // namespace

struct Recorder::Impl {
  Impl(store::Writer& w, const RecorderOptions& o) : writer(w), opts(o), clock(o.clock) {}

  store::Writer& writer;
  RecorderOptions opts;
  Recorder* self = nullptr;
  std::uint64_t gen = 0;
  std::thread::id creator = std::this_thread::get_id();
  int threads_named = 0;  // under g_mutex

  // Pool of free chunks.
  std::mutex pool_mutex;
  Chunk* free_head = nullptr;
  std::atomic<std::uint32_t> free_count{0};
  std::uint32_t total_chunks = 0;  // flusher/constructor only
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::vector<std::unique_ptr<Record[]>> record_blocks;

  // Full chunks waiting for the flusher.
  std::mutex full_mutex;
  std::vector<Chunk*> full;

  std::mutex threads_mutex;
  std::vector<ThreadState*> threads;

  // Flusher control.
  std::mutex flush_mutex;
  std::condition_variable wake;
  std::condition_variable done;
  bool wake_flag = false;
  bool stopping = false;
  bool stopped = false;
  std::uint64_t requested = 0;
  std::uint64_t completed = 0;
  std::thread flusher;

  TickClock ticks;  // flusher-owned after construction
  mutable std::mutex clock_mutex;
  ClockMap clock;

  std::atomic<std::uint64_t> dropped{0};

  std::mutex names_mutex;
  std::deque<std::string> name_store;
  std::unique_ptr<std::atomic<const char*>[]> name_text{new std::atomic<const char*>[kMaxNameTexts]};

  std::vector<store::RangeRow> range_rows;      // flusher scratch, reused
  std::vector<store::CounterRow> counter_rows;
  std::vector<std::int32_t> counter_steps;  // each counter row's step, for a capture
  std::atomic<Capture*> capture{nullptr};

  void grow_pool(std::uint32_t n) {
    n = std::min(n, opts.max_chunks - total_chunks);
    if (n == 0) return;
    std::vector<Chunk*> fresh;
    for (std::uint32_t i = 0; i < n; ++i) {
      chunks.push_back(std::make_unique<Chunk>());
      record_blocks.push_back(std::make_unique<Record[]>(opts.chunk_records));
      Chunk* c = chunks.back().get();
      c->capacity = opts.chunk_records;
      c->records = record_blocks.back().get();
      fresh.push_back(c);
    }
    total_chunks += n;
    std::lock_guard lk(pool_mutex);
    for (Chunk* c : fresh) {
      c->next = free_head;
      free_head = c;
    }
    free_count.fetch_add(n, std::memory_order_release);
  }

  Chunk* acquire() noexcept {
    if (free_count.load(std::memory_order_acquire) == 0) return nullptr;
    std::lock_guard lk(pool_mutex);
    Chunk* c = free_head;
    if (c == nullptr) return nullptr;
    free_head = c->next;
    c->next = nullptr;
    free_count.fetch_sub(1, std::memory_order_relaxed);
    return c;
  }

  void recycle(Chunk* c) {
    c->published.store(0, std::memory_order_relaxed);
    c->consumed = 0;
    c->track = 0;
    std::lock_guard lk(pool_mutex);
    c->next = free_head;
    free_head = c;
    free_count.fetch_add(1, std::memory_order_release);
  }

  void notify_flusher() {
    {
      std::lock_guard lk(flush_mutex);
      wake_flag = true;
    }
    wake.notify_one();
  }

  void hand_off(Chunk* c) {
    {
      std::lock_guard lk(full_mutex);
      full.push_back(c);
    }
    if (opts.wake_on_full_chunk) notify_flusher();
  }

  // Gives s a fresh chunk; false (and no chunk) when the pool is empty.
  bool take_chunk(ThreadState* s) noexcept {
    Chunk* c = acquire();
    if (c == nullptr) return false;
    c->track = s->track;
    s->own = c;
    s->records = c->records;
    s->capacity = c->capacity;
    s->n = 0;
    s->chunk.store(c, std::memory_order_release);
    return true;
  }

  // Moves s's current chunk (if any) to the full list and leaves s without one.
  void release_chunk(ThreadState* s) {
    Chunk* c = s->own;
    s->chunk.store(nullptr, std::memory_order_release);
    s->own = nullptr;
    s->records = nullptr;
    s->capacity = 0;
    s->n = 0;
    if (c != nullptr) hand_off(c);
  }

  void consume(Chunk* c, std::uint32_t upto, const ClockMap& map) {
    for (std::uint32_t i = c->consumed; i < upto; ++i) {
      const Record& r = c->records[i];
      switch (r.kind) {
        case detail::kRangeTicks:
        case detail::kRangeNs: {
          std::int64_t start = r.kind == detail::kRangeTicks ? ticks.to_ns(r.start) : r.start;
          std::int64_t end = r.kind == detail::kRangeTicks ? ticks.to_ns(r.end) : r.end;
          range_rows.push_back(store::RangeRow{c->track, r.name, map.to_rank0(start), map.to_rank0(end), r.category,
                                               r.depth, r.step, r.corr});
          break;
        }
        case detail::kCounter:
          counter_rows.push_back(store::CounterRow{r.name, map.to_rank0(r.start), std::bit_cast<double>(r.end)});
          counter_steps.push_back(r.step);
          break;
        default:
          break;
      }
    }
    c->consumed = std::max(c->consumed, upto);
  }

  void drain() {
    ClockMap map;
    {
      std::lock_guard lk(clock_mutex);
      map = clock;
    }
    ticks.refresh();

    std::vector<ThreadState*> live;
    std::vector<ThreadState*> retired;
    {
      std::lock_guard lk(threads_mutex);
      for (ThreadState* s : threads) (s->retired.load(std::memory_order_acquire) ? retired : live).push_back(s);
      threads = live;
    }
    std::vector<Chunk*> ready;
    {
      std::lock_guard lk(full_mutex);
      ready.swap(full);
    }
    for (Chunk* c : ready) {
      consume(c, c->published.load(std::memory_order_acquire), map);
      recycle(c);
    }
    for (ThreadState* s : live) {
      Chunk* c = s->chunk.load(std::memory_order_acquire);
      if (c != nullptr) consume(c, c->published.load(std::memory_order_acquire), map);
    }

    std::uint64_t newly_dropped = 0;
    auto count_drops = [&](ThreadState* s) {
      std::uint64_t d = s->dropped.load(std::memory_order_relaxed);
      newly_dropped += d - s->dropped_reported;
      s->dropped_reported = d;
    };
    for (ThreadState* s : live) count_drops(s);
    for (ThreadState* s : retired) {
      count_drops(s);
      delete s;
    }

    try {
      if (Capture* cap = capture.load(std::memory_order_acquire)) {
        cap->hold(std::span<const store::RangeRow>(range_rows));
        cap->hold(std::span<const store::CounterRow>(counter_rows), counter_steps);
      } else {
        if (!range_rows.empty()) writer.add(std::span<const store::RangeRow>(range_rows));
        if (!counter_rows.empty()) writer.add(std::span<const store::CounterRow>(counter_rows));
        // Committed now rather than at the Writer's next interval: a kill loses at most one flush
        // interval and one commit of events (docs/ARCHITECTURE.md).
        if (!range_rows.empty() || !counter_rows.empty()) writer.commit_soon();
      }
      if (newly_dropped > 0) {
        dropped.fetch_add(newly_dropped, std::memory_order_relaxed);
        writer.count_dropped(newly_dropped);
      }
    } catch (...) {
      // The Writer counts its own failures; nothing here may take the training down.
    }
    range_rows.clear();
    counter_rows.clear();
    counter_steps.clear();

    // Keep a reserve of a few chunks per thread so producers find one without allocating.
    std::uint32_t reserve = std::max<std::uint32_t>(4, static_cast<std::uint32_t>(live.size()) * 2);
    std::uint32_t free_now = free_count.load(std::memory_order_relaxed);
    if (free_now < reserve) grow_pool(std::max(reserve - free_now, total_chunks / 2));
  }

  void run_flusher() {
    std::unique_lock lk(flush_mutex);
    while (true) {
      wake.wait_for(lk, opts.flush_interval, [&] { return wake_flag || stopping; });
      bool stop_now = stopping;
      std::uint64_t ticket = requested;
      wake_flag = false;
      lk.unlock();
      drain();
      lk.lock();
      completed = ticket;
      done.notify_all();
      if (stop_now) break;
    }
  }
};

namespace {

Recorder::Impl* live_impl(const ThreadState* s) {
  Recorder::Impl* im = g_impl.load(std::memory_order_acquire);
  return im != nullptr && s->gen == im->gen ? im : nullptr;
}

void detach_state(ThreadState* s) {
  s->chunk.store(nullptr, std::memory_order_release);
  s->own = nullptr;
  s->records = nullptr;
  s->capacity = 0;
  s->n = 0;
}

void retire_thread() noexcept {
  std::lock_guard lk(g_mutex);
  ThreadState* s = detail::t_state;
  detail::t_state = nullptr;
  if (s == nullptr) return;
  Recorder::Impl* im = live_impl(s);
  if (im == nullptr) return;  // an orphan of a stopped recorder; it stays in the orphan list
  try {
    im->release_chunk(s);
  } catch (...) {
    detach_state(s);
  }
  s->retired.store(true, std::memory_order_release);
}

// Creates the track and state for the calling thread; g_mutex must be held.
ThreadState* attach_locked(Recorder::Impl* im) noexcept {
  try {
    std::string name = t_name;
    if (name.empty()) {
      name = std::this_thread::get_id() == im->creator ? "main" : "thread-" + std::to_string(im->threads_named++);
    }
    auto s = std::make_unique<ThreadState>();
    s->gen = im->gen;
    s->track = im->writer.add_track(t_kind, name);
    {
      std::lock_guard lk(im->threads_mutex);
      im->threads.push_back(s.get());
    }
    detail::t_state = s.release();
    t_exit.armed = true;
    im->take_chunk(detail::t_state);
    return detail::t_state;
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

namespace detail {

ThreadState* attach_thread() noexcept {
  std::lock_guard lk(g_mutex);
  Recorder::Impl* im = g_impl.load(std::memory_order_acquire);
  if (im == nullptr) return nullptr;
  ThreadState* s = t_state;
  if (s != nullptr && s->gen == im->gen) return s;
  return attach_locked(im);
}

void chunk_full(ThreadState* s) noexcept {
  Recorder::Impl* im = live_impl(s);
  if (im == nullptr) {
    detach_state(s);
    return;
  }
  try {
    im->release_chunk(s);
  } catch (...) {
    detach_state(s);
    return;
  }
  im->take_chunk(s);
}

bool refill(ThreadState* s) noexcept {
  Recorder::Impl* im = live_impl(s);
  if (im == nullptr) return false;
  if (s->own != nullptr) {  // full chunk not yet handed over (cannot happen after chunk_full; defensive)
    try {
      im->release_chunk(s);
    } catch (...) {
      detach_state(s);
    }
  }
  return im->take_chunk(s);
}

}  // namespace detail

double measure_ns_per_event(int n, int rounds) {
  n = std::max(n, 1);
  rounds = std::max(rounds, 1);
  // A private producer state and chunk, shaped like a live thread's.
  constexpr std::uint32_t kCapacity = 4096;
  std::vector<detail::Record> records(kCapacity);
  detail::Chunk chunk;
  chunk.capacity = kCapacity;
  chunk.records = records.data();
  detail::ThreadState local;
  local.records = records.data();
  local.capacity = kCapacity;
  local.own = &chunk;
  local.chunk.store(&chunk, std::memory_order_relaxed);
  std::vector<double> per_round;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      // What Range's constructor and destructor do, minus the hooks (none on the CPU).
      volatile bool active = detail::g_active.load(std::memory_order_relaxed);
      (void)active;
      volatile detail::ThreadState* tls = detail::t_state;
      (void)tls;
      const std::uint8_t depth = static_cast<std::uint8_t>(local.depth++);
      const std::int32_t step = detail::g_step.load(std::memory_order_relaxed);
      const std::int64_t start = now_ticks();
      const std::int64_t end = now_ticks();
      --local.depth;
      // The private chunk wraps before it is full, so it is never handed to a flusher.
      if (local.n + 1 >= local.capacity) local.n = 0;
      detail::push(&local, detail::Record{start, end, 1, 0, step, 0, depth, detail::kRangeTicks, 0});
    }
    const auto t1 = std::chrono::steady_clock::now();
    per_round.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
  }
  std::sort(per_round.begin(), per_round.end());
  return per_round[per_round.size() / 2];
}

void set_thread_name(std::string_view name, store::TrackKind kind) {
  t_name.assign(name);
  t_kind = kind;
  std::lock_guard lk(g_mutex);
  Recorder::Impl* im = g_impl.load(std::memory_order_acquire);
  if (im == nullptr) return;
  ThreadState* s = detail::t_state;
  if (s == nullptr || s->gen != im->gen) {
    attach_locked(im);
    return;
  }
  // Already recording under another name: close the chunk of the old track and continue on a new one.
  im->release_chunk(s);
  s->track = im->writer.add_track(kind, name);
  im->take_chunk(s);
}

Recorder::Recorder(store::Writer& writer, RecorderOptions options)
    : writer_(writer), options_(options), impl_(std::make_unique<Impl>(writer, options)) {
  if (options_.chunk_records == 0) throw ProfilerError("profiler: RecorderOptions::chunk_records must be > 0");
  if (options_.max_chunks == 0) throw ProfilerError("profiler: RecorderOptions::max_chunks must be > 0");
  std::lock_guard lk(g_mutex);
  if (g_impl.load() != nullptr) {
    throw ProfilerError("profiler: a Recorder is already running (one per process); stop it before starting another");
  }
  impl_->grow_pool(std::max<std::uint32_t>(1, std::min(options_.initial_chunks, options_.max_chunks)));
  impl_->self = this;
  impl_->gen = detail::g_gen.fetch_add(1) + 1;
  impl_->flusher = std::thread([im = impl_.get()] { im->run_flusher(); });
  g_impl.store(impl_.get(), std::memory_order_release);
  detail::g_active.store(options_.enabled, std::memory_order_relaxed);
}

Recorder::~Recorder() {
  try {
    stop();
  } catch (...) {
    // stop() only throws if the Writer does; a destructor must not.
  }
}

Recorder* Recorder::current() {
  Recorder::Impl* im = g_impl.load(std::memory_order_acquire);
  return im != nullptr ? im->self : nullptr;
}

void Recorder::stop() {
  Impl& im = *impl_;
  {
    std::lock_guard lk(im.flush_mutex);
    if (im.stopped) return;
  }
  std::lock_guard glk(g_mutex);
  detail::g_active.store(false, std::memory_order_relaxed);
  detail::g_hooks.store(nullptr, std::memory_order_relaxed);
  g_impl.store(nullptr, std::memory_order_release);
  detail::g_gen.fetch_add(1);
  {
    std::lock_guard lk(im.flush_mutex);
    im.stopping = true;
  }
  im.wake.notify_one();
  if (im.flusher.joinable()) im.flusher.join();  // its last pass drains every published record
  {
    std::lock_guard lk(im.flush_mutex);
    im.stopped = true;
  }
  im.done.notify_all();
  std::lock_guard tlk(im.threads_mutex);
  for (ThreadState* s : im.threads) {
    if (s->retired.load(std::memory_order_acquire)) {
      delete s;
      continue;
    }
    detach_state(s);
    if (g_orphans == nullptr) g_orphans = new std::vector<ThreadState*>();
    g_orphans->push_back(s);
  }
  im.threads.clear();
  writer_.flush();
}

NameId Recorder::intern(std::string_view name) {
  NameId id = writer_.intern(name);
  std::lock_guard lk(impl_->names_mutex);
  if (id < kMaxNameTexts && impl_->name_text[id].load(std::memory_order_relaxed) == nullptr) {
    impl_->name_store.emplace_back(name);
    impl_->name_text[id].store(impl_->name_store.back().c_str(), std::memory_order_release);
  }
  return id;
}

const char* Recorder::name_text(NameId id) const {
  if (id >= kMaxNameTexts) return "";
  const char* t = impl_->name_text[id].load(std::memory_order_acquire);
  return t != nullptr ? t : "";
}

CounterTrack Recorder::add_counter_track(std::string_view name) {
  return CounterTrack{writer_.add_track(store::TrackKind::queue, name)};
}

void Recorder::set_enabled(bool enabled) {
  options_.enabled = enabled;
  std::lock_guard lk(g_mutex);
  if (g_impl.load() == impl_.get()) detail::g_active.store(enabled, std::memory_order_relaxed);
}

bool Recorder::enabled() const { return options_.enabled; }

ClockMap Recorder::clock() const {
  std::lock_guard lk(impl_->clock_mutex);
  return impl_->clock;
}

void Recorder::add(store::AllreduceRow row) {
  ClockMap map = clock();
  row.ready_ns = map.to_rank0(row.ready_ns);
  row.start_ns = map.to_rank0(row.start_ns);
  row.end_ns = map.to_rank0(row.end_ns);
  if (Capture* cap = impl_->capture.load(std::memory_order_acquire)) cap->hold(row);
  else writer_.add(row);
}

void Recorder::add(store::StepRow row) {
  ClockMap map = clock();
  row.start_ns = map.to_rank0(row.start_ns);
  row.end_ns = map.to_rank0(row.end_ns);
  writer_.add(row);
}

void Recorder::add(std::span<const store::KernelRow> rows) {
  ClockMap map = clock();
  std::vector<store::KernelRow> mapped(rows.begin(), rows.end());
  for (store::KernelRow& k : mapped) {
    k.start_ns = map.to_rank0(k.start_ns);
    k.end_ns = map.to_rank0(k.end_ns);
  }
  if (Capture* cap = impl_->capture.load(std::memory_order_acquire)) cap->hold(std::span<const store::KernelRow>(mapped));
  else writer_.add(std::span<const store::KernelRow>(mapped));
}

void Recorder::set_capture(Capture* capture) { impl_->capture.store(capture, std::memory_order_release); }

void Recorder::set_range_hooks(const RangeHooks* hooks) { detail::g_hooks.store(hooks, std::memory_order_release); }

void Recorder::flush() {
  Impl& im = *impl_;
  {
    std::unique_lock lk(im.flush_mutex);
    if (!im.stopped) {
      std::uint64_t ticket = ++im.requested;
      im.wake_flag = true;
      im.wake.notify_one();
      im.done.wait(lk, [&] { return im.completed >= ticket || im.stopped; });
    }
  }
  writer_.flush();
}

std::uint64_t Recorder::dropped() const { return impl_->dropped.load(std::memory_order_relaxed); }

NameId intern(std::string_view name) {
  Recorder* r = Recorder::current();
  return r != nullptr ? r->intern(name) : 0;
}

CounterTrack add_counter_track(std::string_view name) {
  Recorder* r = Recorder::current();
  return r != nullptr ? r->add_counter_track(name) : CounterTrack{};
}

}  // namespace wb::profiler
