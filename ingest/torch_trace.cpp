// import_torch_traces: parsed trace events -> threads of nested ranges with categories and steps ->
// layer ranges (layer_map.cpp) -> one per-rank run file each -> merged into the output.
#include "ingest/torch_trace.hpp"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <exception>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ingest/layer_map.hpp"
#include "store/db.hpp"
#include "store/merge.hpp"
#include "store/summary.hpp"
#include "store/writer.hpp"

namespace wb::ingest {
namespace {

using store::Category;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool is_host(EventCat c) {
  return c == EventCat::none || c == EventCat::cpu_op || c == EventCat::user_annotation ||
         c == EventCat::python_function || c == EventCat::cuda_runtime;
}
bool is_device(EventCat c) { return c == EventCat::kernel || c == EventCat::gpu_memcpy || c == EventCat::gpu_memset; }

bool is_loss_op(std::string_view n) {
  return n == "aten::cross_entropy_loss" || n == "aten::nll_loss" || n == "aten::nll_loss_nd" ||
         n == "aten::log_softmax" || n == "aten::mse_loss" || n == "aten::binary_cross_entropy_with_logits";
}

// What a name says of its range, before its parent is known; worked out once per distinct name.
enum class NameKind : std::uint8_t { plain, step, comm, optimizer, data, autograd, loss };

NameKind name_kind(std::string_view name) {
  if (starts_with(name, "ProfilerStep#")) return NameKind::step;
  if (starts_with(name, "nccl:") || starts_with(name, "c10d::") || name == "record_param_comms") return NameKind::comm;
  if (starts_with(name, "Optimizer.")) return NameKind::optimizer;
  if (starts_with(name, "enumerate(DataLoader)") || starts_with(name, "enumerate(DataPipe)")) return NameKind::data;
  if (starts_with(name, "autograd::engine::evaluate_function:")) return NameKind::autograd;
  if (is_loss_op(name)) return NameKind::loss;
  return NameKind::plain;
}

// What a range is, from its name's kind and its parent's category (PyTorch's traces carry no phase).
Category category_of(NameKind kind, EventCat cat, std::int64_t fwd_tid, const Node* parent, bool backward_thread) {
  if (kind == NameKind::step) return Category::step;
  if (kind == NameKind::comm) return Category::comm;
  if (parent) {
    Category pc = parent->category;
    if (pc == Category::optimizer || pc == Category::data || pc == Category::loss || pc == Category::backward ||
        pc == Category::comm)
      return pc;
  }
  if (kind == NameKind::optimizer) return Category::optimizer;
  if (kind == NameKind::data) return Category::data;
  // Kineto writes "Fwd thread id" on forward ops too, as 0; an autograd node's is its forward thread's (>= 1).
  if (kind == NameKind::autograd || fwd_tid > 0) return Category::backward;
  if (kind == NameKind::loss) return Category::loss;
  if (cat == EventCat::cuda_runtime && parent && parent->category != Category::step) return parent->category;
  return backward_thread ? Category::backward : Category::forward;
}

// The innermost node containing t (a zero-length node contains its own start), -1 for none. Nodes are
// sorted by start, enclosing ones first, with parents set (build_tree): the last node starting at or
// before t, then up its parents until one still holds t. O(log n + depth).
std::int32_t innermost_at(const std::vector<Node>& nodes, std::int64_t t) {
  auto it = std::upper_bound(nodes.begin(), nodes.end(), t, [](std::int64_t v, const Node& n) { return v < n.start; });
  for (std::int32_t k = static_cast<std::int32_t>(it - nodes.begin()) - 1; k >= 0;
       k = nodes[static_cast<std::size_t>(k)].parent) {
    const Node& n = nodes[static_cast<std::size_t>(k)];
    if (t < n.end || (n.end == n.start && t == n.start)) return k;
  }
  return -1;
}

// The memory events of one device type as memory rows: the live bytes from the event's "Total
// Allocated" (or summed from 0 when absent), the step from its time, the name from the range it falls
// in on its thread: the layer of the innermost op (layer_map.hpp), else the op itself.
template <class StepAt, class RunId>
std::int64_t write_memory(const ParsedTrace& tr, const std::vector<Thread>& threads, std::int64_t base_ns, int rank,
                          int device_type, const StepAt& step_at, const RunId& run_id, store::Writer& w) {
  std::map<std::string, const Thread*> by_key;
  for (const Thread& t : threads) by_key.emplace(t.key, &t);
  const std::uint32_t unnamed = w.intern("pytorch");
  std::vector<store::MemoryRow> rows;
  std::int64_t live = 0;
  for (const TraceMemoryEvent& e : tr.memory) {
    if (e.device_type != device_type || e.bytes == 0) continue;
    const std::int64_t t = e.ts_ns - base_ns;
    live = e.total >= 0 ? e.total : live + e.bytes;
    store::MemoryRow r;
    r.rank = rank;
    r.t_ns = t;
    r.step = step_at(t);
    r.bytes = e.bytes;
    r.live_bytes = live;
    r.role = static_cast<std::uint8_t>(store::kMemoryRoles - 1);
    r.name = unnamed;
    auto it = by_key.find(tr.strings[e.pid] + "/" + tr.strings[e.tid]);
    const Thread* th = it != by_key.end() ? it->second : (threads.empty() ? nullptr : &threads.front());
    if (th) {
      const std::int32_t inner = innermost_at(th->nodes, t);
      for (std::int32_t k = inner; k >= 0; k = th->nodes[static_cast<std::size_t>(k)].parent) {
        const Node& n = th->nodes[static_cast<std::size_t>(k)];
        if (n.added || n.layer != 0) {
          r.name = run_id(n.added ? n.name : n.layer);
          break;
        }
        if (k == inner) r.name = run_id(n.name);
      }
    }
    rows.push_back(r);
  }
  w.add(std::span<const store::MemoryRow>(rows));
  return static_cast<std::int64_t>(rows.size());
}

// Whether a rank's trace is of a ResNet-50: record_function module names of its layers, or 53
// forward convolutions (aten::conv2d) per step, as torchvision's ResNet-50 runs, in most of its steps
// (in the whole trace, a multiple of 53, when it has no steps).
bool looks_like_resnet50(const std::vector<Thread>& threads, const Names& names, std::size_t step_count) {
  constexpr std::int64_t kConvs = 53;
  std::map<std::int32_t, std::int64_t> convs_by_step;
  std::int64_t convs = 0;
  for (const Thread& t : threads)
    for (const Node& n : t.nodes) {
      const std::string& text = names.text(n.name);
      if (text == "layer4.2.conv3") return true;
      if (text == "aten::conv2d" && n.category != Category::backward) {
        ++convs;
        ++convs_by_step[n.step];
      }
    }
  if (step_count == 0) return convs > 0 && convs % kConvs == 0;
  std::size_t resnet_steps = 0;
  for (const auto& [step, c] : convs_by_step) resnet_steps += step >= 0 && c == kConvs;
  return 2 * resnet_steps > step_count;
}

struct RankTrace {
  ParsedTrace trace;
  std::filesystem::path file;
  int rank = 0;
};

// A host event as a range node (times from the import's time base), before build_tree.
Node host_node(const TraceEvent& ev, std::int64_t base_ns) {
  Node n;
  n.start = ev.ts_ns - base_ns;
  n.end = n.start + std::max<std::int64_t>(ev.dur_ns, 0);
  n.ext = ev.external_id;
  n.corr = ev.correlation;
  n.seq = ev.sequence;
  n.fwd_tid = ev.fwd_tid;
  n.name = ev.name;
  n.cat = ev.cat;
  return n;
}

// A device stream's events, in trace order: copies, so that the parsed events can go once split.
struct Stream {
  std::string label;
  std::vector<TraceEvent> events;
};

// One rank's events: threads of host ranges, and the device streams with the devices they ran on.
struct RankEvents {
  std::vector<Thread> threads;
  std::map<std::pair<std::int64_t, std::int64_t>, Stream> streams;  // (device, stream) -> its events
  std::set<int> devices;
};

RankEvents split_events(ParsedTrace& tr, std::int64_t base_ns) {
  RankEvents out;
  // Two passes: the first counts each thread's and stream's events, so that the second fills vectors of
  // their final size (growing them copies each node again and touches fresh pages each time). The
  // second frees the parsed events as it goes.
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::size_t> thread_index;
  std::vector<std::size_t> thread_sizes;
  std::map<std::pair<std::int64_t, std::int64_t>, std::size_t> stream_sizes;
  auto device_of = [&](const TraceEvent& ev) {
    std::int64_t dev = ev.device >= 0 ? ev.device : std::atoll(tr.strings[ev.pid].c_str());
    std::int64_t stream = ev.stream >= 0 ? ev.stream : std::atoll(tr.strings[ev.tid].c_str());
    return std::pair{dev, stream};
  };
  // The thread of a host event; consecutive events are mostly on one thread, so the last one is tried first.
  std::pair<std::uint32_t, std::uint32_t> last_key{~0u, ~0u};
  std::size_t last_index = 0;
  auto thread_of = [&](const TraceEvent& ev) {
    const std::pair<std::uint32_t, std::uint32_t> key{ev.pid, ev.tid};
    if (key == last_key) return last_index;
    auto [it, fresh] = thread_index.try_emplace(key, out.threads.size());
    if (fresh) {
      Thread t;
      t.key = tr.strings[ev.pid] + "/" + tr.strings[ev.tid];
      auto named = tr.thread_names.find((std::uint64_t{ev.pid} << 32) | ev.tid);
      t.label = named != tr.thread_names.end() && !named->second.empty() ? named->second : "thread " + tr.strings[ev.tid];
      out.threads.push_back(std::move(t));
      thread_sizes.push_back(0);
    }
    last_key = key;
    last_index = it->second;
    return last_index;
  };
  tr.events.for_each([&](const TraceEvent& ev) {
    if (is_host(ev.cat)) ++thread_sizes[thread_of(ev)];
    else if (is_device(ev.cat)) ++stream_sizes[device_of(ev)];
  });
  // Room for the layer ranges the mapping adds (about 5% on a ResNet-50): growing a thread of millions of
  // nodes would copy it whole. Capacity never touched costs no memory.
  for (std::size_t i = 0; i < out.threads.size(); ++i)
    reserve_huge(out.threads[i].nodes, thread_sizes[i] + thread_sizes[i] / 8 + 4096);
  for (const auto& [key, n] : stream_sizes) out.streams[key].events.reserve(n);
  Stream* last_stream = nullptr;
  std::pair<std::int64_t, std::int64_t> last_stream_key{-1, -1};
  tr.events.consume([&](const TraceEvent& ev) {
    if (is_host(ev.cat)) {
      out.threads[thread_of(ev)].nodes.push_back(host_node(ev, base_ns));
    } else if (is_device(ev.cat)) {
      const auto key = device_of(ev);
      if (!last_stream || key != last_stream_key) {
        last_stream = &out.streams[key];
        last_stream_key = key;
        if (last_stream->label.empty())
          last_stream->label = "cuda:" + std::to_string(key.first) + " stream " + std::to_string(key.second);
        out.devices.insert(static_cast<int>(key.first));
      }
      last_stream->events.push_back(ev);
    }
  });
  return out;
}

// The ProfilerSteps of a rank: which step a time falls in.
struct StepIndex {
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;  // [start, end) per ProfilerStep
  std::vector<std::int32_t> ids;
  std::vector<std::size_t> order;  // the spans by start, once sorted

  void sort_by_start() {
    order.resize(spans.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return spans[a].first < spans[b].first; });
  }

  // The step whose span holds t, else -1.
  std::int32_t at(std::int64_t t) const {
    auto it = std::upper_bound(order.begin(), order.end(), t, [&](std::int64_t v, std::size_t i) { return v < spans[i].first; });
    if (it == order.begin()) return -1;
    std::size_t i = *(it - 1);
    return t < spans[i].second ? ids[i] : -1;
  }
};

// a() here and b() on a second thread, at once; an exception of either is rethrown here once both are done.
template <class A, class B>
void in_parallel(A&& a, B&& b) {
  std::exception_ptr failed_b;
  std::thread second([&] {
    try {
      b();
    } catch (...) {
      failed_b = std::current_exception();
    }
  });
  try {
    a();
  } catch (...) {
    second.join();
    throw;
  }
  second.join();
  if (failed_b) std::rethrow_exception(failed_b);
}

// f(thread) for every thread, on two threads at once: a trace's host ranges are mostly on two threads
// of about equal size (the Python thread's forward and the autograd thread's backward). f must touch
// nothing but its thread and what no other call writes.
template <class F>
void for_each_thread_parallel(std::vector<Thread>& threads, F&& f) {
  std::vector<std::size_t> order(threads.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return threads[a].nodes.size() > threads[b].nodes.size(); });
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t k = next++; k < order.size(); k = next++) f(threads[order[k]]);
  };
  if (threads.size() > 1) in_parallel(work, work);  // rethrows an exception of either
  else work();
}

// Builds each thread's tree and gives every node its category top-down (parents come first after
// build_tree), two threads at a time; returns the ProfilerSteps found (in thread order), not yet sorted.
StepIndex categorize(std::vector<Thread>& threads, const Names& names, std::size_t name_count) {
  std::vector<NameKind> kinds(name_count);
  for (std::size_t i = 0; i < name_count; ++i) kinds[i] = name_kind(names.text(static_cast<std::uint32_t>(i)));
  std::vector<StepIndex> per_thread(threads.size());
  for_each_thread_parallel(threads, [&](Thread& t) {
    StepIndex& steps = per_thread[static_cast<std::size_t>(&t - threads.data())];
    build_tree(t.nodes);
    // autograd's device threads (GPU runs): autograd nodes and no steps
    bool has_steps = false, has_autograd = false;
    for (const Node& n : t.nodes) {
      const NameKind k = kinds[n.name];
      has_steps = has_steps || k == NameKind::step;
      has_autograd = has_autograd || k == NameKind::autograd;
    }
    for (Node& n : t.nodes) {
      const Node* parent = n.parent >= 0 ? &t.nodes[static_cast<std::size_t>(n.parent)] : nullptr;
      n.category = category_of(kinds[n.name], n.cat, n.fwd_tid, parent, has_autograd && !has_steps);
      if (n.category == Category::step) {
        steps.spans.push_back({n.start, n.end});
        steps.ids.push_back(static_cast<std::int32_t>(std::atoi(names.text(n.name).c_str() + 13)));
      }
    }
  });
  StepIndex steps;
  for (const StepIndex& s : per_thread) {
    steps.spans.insert(steps.spans.end(), s.spans.begin(), s.spans.end());
    steps.ids.insert(steps.ids.end(), s.ids.begin(), s.ids.end());
  }
  return steps;
}

// The host nodes device rows link to. A device row's runtime call is the one with its "correlation";
// its op is the innermost op enclosing that call on the call's thread (the TensorBoard plugin's rule,
// and HTA's). Kineto's "External id" on a device row is not reliably the op's (traces of recent
// versions repeat the correlation there), so it serves only where the trace has no runtime calls.
struct Launches {
  // (id, node) sorted by id, one node per id: sorted vectors take a quarter of a hash map's memory for
  // millions of ids, and are built in one sort.
  using Index = std::vector<std::pair<std::int64_t, Node*>>;
  Index runtime_by_corr;  // the last runtime call with each correlation id
  Index op_by_ext;        // the first op with each External id
  std::uint64_t next_corr_id = 1;

  static Node* find(const Index& index, std::int64_t id) {
    if (id < 0) return nullptr;
    auto it = std::lower_bound(index.begin(), index.end(), id, [](const auto& e, std::int64_t v) { return e.first < v; });
    return it != index.end() && it->first == id ? it->second : nullptr;
  }

  // The runtime call with this correlation id, or null.
  const Node* call(std::int64_t correlation) const { return find(runtime_by_corr, correlation); }

  // The range a device row with these ids is attributed to: the op enclosing its runtime call, the
  // call itself when no op encloses it, the op with its External id when no call is on record; with
  // whether that is an op (not a bare runtime call).
  std::pair<Node*, bool> launcher(std::int64_t correlation, std::int64_t external_id, std::vector<Thread>& threads) const {
    if (Node* call = find(runtime_by_corr, correlation)) {
      const std::vector<Node>& nodes = threads[call->thread].nodes;
      for (std::int32_t k = call->parent; k >= 0; k = nodes[static_cast<std::size_t>(k)].parent) {
        Node& n = threads[call->thread].nodes[static_cast<std::size_t>(k)];
        if (n.cat != EventCat::cuda_runtime) return {&n, true};
      }
      return {call, false};
    }
    if (Node* op = find(op_by_ext, external_id)) return {op, true};
    return {nullptr, false};
  }
};

// Sorts an index by id and keeps one node per id: the first or the last in thread and node order.
void sort_unique(Launches::Index& index, bool keep_last) {
  std::stable_sort(index.begin(), index.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::size_t out = 0;
  for (std::size_t i = 0; i < index.size(); ++i) {
    if (out > 0 && index[out - 1].first == index[i].first) {
      if (keep_last) index[out - 1] = index[i];
      continue;
    }
    index[out++] = index[i];
  }
  index.resize(out);
  index.shrink_to_fit();
}

Launches index_launches(std::vector<Thread>& threads) {
  Launches out;
  // Each thread's ids gathered on one of two threads, then joined in thread order.
  std::vector<Launches> per_thread(threads.size());
  for_each_thread_parallel(threads, [&](Thread& t) {
    const auto ti = static_cast<std::size_t>(&t - threads.data());
    Launches& mine = per_thread[ti];
    for (Node& n : t.nodes) {
      n.thread = static_cast<std::uint32_t>(ti);
      if (n.added) continue;
      if (n.cat == EventCat::cuda_runtime) {
        if (n.corr >= 0) mine.runtime_by_corr.emplace_back(n.corr, &n);
      } else if (n.ext >= 0) {
        mine.op_by_ext.emplace_back(n.ext, &n);
      }
    }
  });
  std::size_t calls = 0, ops = 0;
  for (const Launches& l : per_thread) calls += l.runtime_by_corr.size(), ops += l.op_by_ext.size();
  out.runtime_by_corr.reserve(calls);
  out.op_by_ext.reserve(ops);
  for (Launches& l : per_thread) {
    out.runtime_by_corr.insert(out.runtime_by_corr.end(), l.runtime_by_corr.begin(), l.runtime_by_corr.end());
    out.op_by_ext.insert(out.op_by_ext.end(), l.op_by_ext.begin(), l.op_by_ext.end());
    l = Launches{};
  }
  // The two indexes sorted at once, one on each of two threads.
  in_parallel([&] { sort_unique(out.runtime_by_corr, true); }, [&] { sort_unique(out.op_by_ext, false); });
  return out;
}

// Rows handed to the writer at a time: its eager commit size (WriterOptions::eager_commit_rows).
constexpr std::size_t kWriterBatch = 65536;

store::WriterOptions import_writer_options(const std::filesystem::path& path, int rank, bool build_indexes) {
  store::WriterOptions wo;
  wo.path = path;
  wo.rank = rank;
  wo.handle_signals = false;
  wo.overwrite = true;
  wo.build_indexes = build_indexes;  // merge builds the merged file's
  wo.bulk_load = true;                // a scratch file, renamed or merged once complete
  wo.pack = false;                    // a packed copy would cost a tenth of the import for 7% of the file
  // Nothing may be dropped: a batch waits while four are pending, so that the rows made faster than the
  // inserts go are not all held twice (in the threads' nodes and in the writer's queue).
  wo.max_pending_rows = 4 * kWriterBatch;
  wo.wait_for_room = true;
  wo.report_failure = false;  // the import's own error says it, and the file is removed
  return wo;
}

// A device event as a kernel row, its name still the trace's string id, without its correlation id; the
// range it is attributed to (Launches::launcher) in *linked, with whether that is an op.
store::KernelRow kernel_row(const TraceEvent& ev, std::int64_t base_ns, const Launches& launches,
                            std::vector<Thread>& threads, std::pair<Node*, bool>* linked) {
  store::KernelRow k;
  k.start_ns = ev.ts_ns - base_ns;
  k.end_ns = k.start_ns + std::max<std::int64_t>(ev.dur_ns, 0);
  k.kind = static_cast<std::uint8_t>(ev.cat == EventCat::kernel ? store::KernelKind::kernel
                                     : ev.cat == EventCat::gpu_memcpy ? store::KernelKind::memcpy
                                                                      : store::KernelKind::memset);
  for (int d = 0; d < 3; ++d) {
    k.grid[d] = ev.grid[d];
    k.block[d] = ev.block[d];
  }
  k.bytes = ev.bytes;
  k.blocks_per_sm = ev.blocks_per_sm;
  k.occupancy = ev.occupancy >= 0.0f ? ev.occupancy / 100.0f : -1.0f;
  if (const Node* call = launches.call(ev.correlation)) {
    k.launch_ns = call->start;
    k.launch_end_ns = call->end;
  }
  *linked = launches.launcher(ev.correlation, ev.external_id, threads);
  k.name = ev.name;  // trace string id, interned when written
  return k;
}

// Each stream's label and kernel rows, by start. The rows are made on two threads at once, each half of a
// stream; then, in trace order, each linked range takes a correlation id the first time a row links to
// it, and the rows are counted in `info`.
std::vector<std::pair<std::string, std::vector<store::KernelRow>>> stream_kernel_rows(
    const std::map<std::pair<std::int64_t, std::int64_t>, Stream>& streams, std::int64_t base_ns, Launches& launches,
    std::vector<Thread>& threads, TraceImport& info) {
  std::vector<std::pair<std::string, std::vector<store::KernelRow>>> stream_rows;
  for (const auto& entry : streams) {
    const Stream& s = entry.second;  // not a structured binding: the lambdas below use it
    const std::size_t n = s.events.size();
    std::vector<store::KernelRow> rows(n);
    std::vector<std::pair<Node*, bool>> linked(n);
    auto make = [&](std::size_t from, std::size_t to) {
      for (std::size_t i = from; i < to; ++i) rows[i] = kernel_row(s.events[i], base_ns, launches, threads, &linked[i]);
    };
    in_parallel([&] { make(0, n / 2); }, [&] { make(n / 2, n); });
    for (std::size_t i = 0; i < n; ++i) {
      const TraceEvent& ev = s.events[i];
      if (auto [node, is_op] = linked[i]; node) {
        if (node->corr_id == 0) node->corr_id = launches.next_corr_id++;
        rows[i].corr_id = node->corr_id;
        ++(is_op ? info.linked_to_op : info.linked_to_runtime);
      }
      if (ev.cat == EventCat::kernel) ++info.kernels;
      else if (ev.cat == EventCat::gpu_memcpy) ++info.memcpys;
      else ++info.memsets;
    }
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    stream_rows.emplace_back(s.label, std::move(rows));
  }
  return stream_rows;
}

// The thread with the steps first, so it is track 1 and "main".
void main_thread_first(std::vector<Thread>& threads) {
  std::stable_sort(threads.begin(), threads.end(), [](const Thread& a, const Thread& b) {
    auto steps = [](const Thread& t) {
      return std::count_if(t.nodes.begin(), t.nodes.end(), [](const Node& n) { return n.category == Category::step; });
    };
    return steps(a) > steps(b);
  });
}

// One step row per ProfilerStep: data wait is the DataLoader's time in it; PyTorch's trace has no loss,
// learning rate or image count.
template <class StepAt>
std::vector<store::StepRow> step_rows(const Thread& t, int rank, const StepAt& step_at) {
  std::vector<store::StepRow> steps;
  for (std::size_t i = 0; i < t.nodes.size(); ++i) {
    const Node& n = t.nodes[i];
    if (n.category != Category::step) continue;
    store::StepRow s;
    s.rank = rank;
    s.step = step_at(n.start);
    s.start_ns = n.start;
    s.end_ns = n.end;
    for (std::size_t j = i + 1; j < t.nodes.size() && t.nodes[j].start < n.end; ++j)
      if (t.nodes[j].category == Category::data && t.nodes[j].parent == static_cast<std::int32_t>(i))
        s.data_wait_ns += t.nodes[j].end - t.nodes[j].start;
    steps.push_back(s);
  }
  return steps;
}

bool is_python(const Node& n) { return n.cat == EventCat::python_function && !n.added; }

// A node's nesting depth among the nodes of its own kind (Python functions, or the rest).
std::uint8_t depth_among(const std::vector<Node>& nodes, const Node& n) {
  int depth = 0;
  for (std::int32_t k = n.parent; k >= 0; k = nodes[static_cast<std::size_t>(k)].parent)
    depth += is_python(nodes[static_cast<std::size_t>(k)]) == is_python(n);
  return static_cast<std::uint8_t>(std::min(depth, 255));
}

// A host thread's tracks in the run file: its ranges', and its Python functions' (with_stack) beside it,
// which nest among themselves and which the op analyses (the TensorBoard breakdown among them) leave out.
struct ThreadTracks {
  std::uint32_t track = 0;
  std::uint32_t python_track = 0;  // = track when the thread has no Python functions
  bool python = false;
  bool has_steps = false;
};

std::vector<ThreadTracks> add_thread_tracks(const std::vector<Thread>& threads, store::Writer& w) {
  std::vector<ThreadTracks> out;
  for (std::size_t ti = 0; ti < threads.size(); ++ti) {
    const Thread& t = threads[ti];
    ThreadTracks tt;
    tt.has_steps =
        std::any_of(t.nodes.begin(), t.nodes.end(), [](const Node& n) { return n.category == Category::step; });
    const std::string label = ti == 0 && tt.has_steps ? "main" : t.label;
    tt.track = w.add_track(store::TrackKind::thread, label);
    tt.python = std::any_of(t.nodes.begin(), t.nodes.end(), [](const Node& n) { return is_python(n); });
    tt.python_track =
        tt.python ? w.add_track(store::TrackKind::thread, label + std::string(store::kPythonTrackSuffix)) : tt.track;
    out.push_back(tt);
  }
  return out;
}

// Each thread's ranges on its tracks (add_thread_tracks), and the main thread's steps; returns how many
// steps that is.
template <class StepAt, class RunId>
std::int32_t write_threads(const std::vector<Thread>& threads, const std::vector<ThreadTracks>& tracks, int rank,
                           const StepAt& step_at, const RunId& run_id, store::Writer& w,
                           store::SummaryBuilder* summary, TraceImport& info) {
  std::vector<store::RangeRow> rows;
  std::int32_t main_steps = 0;
  for (std::size_t ti = 0; ti < threads.size(); ++ti) {
    const Thread& t = threads[ti];
    const auto [track, python_track, python, has_steps] = tracks[ti];
    // Handed over in batches of the writer's eager commit size: its thread commits one while the next is
    // built, and the rows are never held twice whole.
    rows.clear();
    rows.reserve(std::min(t.nodes.size(), kWriterBatch));
    for (const Node& n : t.nodes) {
      if (rows.size() == kWriterBatch) {
        w.add(std::span<const store::RangeRow>(rows));
        rows.clear();
      }
      store::RangeRow r;
      r.track = is_python(n) ? python_track : track;
      r.name = run_id(n.name);
      r.start_ns = n.start;
      r.end_ns = n.end;
      r.category = static_cast<std::uint8_t>(n.category);
      r.depth = python ? depth_among(t.nodes, n) : n.depth;
      r.step = n.category == Category::step ? step_at(n.start) : n.step;
      r.corr_id = n.corr_id;
      rows.push_back(r);
      if (summary) summary->add(r);
      if (!n.added) ++info.ranges;
    }
    w.add(std::span<const store::RangeRow>(rows));
    if (summary) {
      summary->end_track(track);
      summary->end_track(python_track);
    }

    if (ti == 0 && has_steps) {
      std::vector<store::StepRow> steps = step_rows(t, rank, step_at);
      main_steps = static_cast<std::int32_t>(steps.size());
      w.add(std::span<const store::StepRow>(steps));
    }
  }
  return main_steps;
}

// Each stream's launch queue track (HTA's queue length), for a stream with launched work. Its samples are
// not stored: Reader::counters derives them from the stream's kernels (store::launch_queue).
void add_launch_queues(const std::vector<std::pair<std::string, std::vector<store::KernelRow>>>& stream_rows,
                       store::Writer& w) {
  for (const auto& [label, krs] : stream_rows)
    if (std::any_of(krs.begin(), krs.end(), [](const store::KernelRow& k) { return k.launch_ns >= 0; }))
      w.add_track(store::TrackKind::queue, label + std::string(store::kLaunchQueueSuffix));
}

// Each stream's track, and its kernel rows given it and the run file's names; the tracks in stream order.
template <class RunId>
std::vector<std::uint32_t> add_stream_tracks(
    std::vector<std::pair<std::string, std::vector<store::KernelRow>>>& stream_rows, const RunId& run_id,
    store::Writer& w) {
  std::vector<std::uint32_t> tracks;
  for (auto& [label, krs] : stream_rows) {
    tracks.push_back(w.add_track(store::TrackKind::stream, label));
    for (auto& k : krs) {
      k.track = tracks.back();
      k.name = run_id(k.name);
    }
  }
  return tracks;
}

// The deviceProperties entry of the device the rank ran on (null when the trace has none).
nlohmann::json device_properties_of(const ParsedTrace& tr, const std::set<int>& devices) {
  if (tr.device_properties.is_array())
    for (const auto& d : tr.device_properties)
      if (d.is_object() && d.contains("name") && d["name"].is_string() &&
          (!d.contains("id") || !d["id"].is_number_integer() || devices.empty() || d["id"].get<int>() == *devices.begin())) {
        return d;
      }
  return nullptr;
}

// Where it ran, and what it was: the rank row and the run's meta.
void write_rank_meta(const RankTrace& rt, const TraceImport& info, const nlohmann::json& props, bool gpu,
                     int world_size, const std::map<std::string, std::map<std::string, std::string>>& methods,
                     store::Writer& w) {
  const ParsedTrace& tr = rt.trace;
  const std::string device_name = props.is_object() ? props["name"].get<std::string>() : std::string();
  // A CUDA compute capability (an AMD device's computeMajor is its gfx generation: not recorded).
  if (props.is_object() && props.contains("computeMajor") && props["computeMajor"].is_number_integer() &&
      device_name.rfind("AMD", 0) != 0)
    w.set_meta("compute_major", std::to_string(props["computeMajor"].get<int>()));
  // The device's memory, for the TensorBoard plugin's memory rule (profiler/analysis/tb_overview.cpp).
  if (props.is_object() && props.contains("totalGlobalMem") && props["totalGlobalMem"].is_number_integer())
    w.set_meta("device_total_memory", std::to_string(props["totalGlobalMem"].get<std::int64_t>()));
  store::RankRow rr;
  rr.rank = rt.rank;
  rr.host = "pytorch-trace";
  rr.device = device_name.empty() ? info.device : info.device + " (" + device_name + ")";
  rr.pid = 0;
  w.set_rank(rr);
  nlohmann::json config = {{"framework", "pytorch"},
                           {"trace", rt.file.filename().string()},
                           {"trace_format", tr.format == TraceFormat::kineto ? "kineto" : "legacy"}};
  if (!tr.distributed_info.empty()) config["distributed_info"] = tr.distributed_info;
  w.set_meta("framework", "pytorch");
  w.set_meta("device", info.device);
  if (!device_name.empty()) w.set_meta("device_name", device_name);
  w.set_meta("world_size", std::to_string(world_size));
  w.set_meta("config_json", config.dump());
  w.set_meta("source_trace", rt.file.string());
  w.set_meta("trace_format", tr.format == TraceFormat::kineto ? "kineto" : "legacy");
  w.set_meta("layer_match", nlohmann::json(methods).dump());
  if (gpu) w.set_meta("gpu_trace", "1");
}

TraceImport write_rank(RankTrace& rt, std::int64_t base_ns, int world_size, const std::filesystem::path& path,
                       bool build_indexes, LayerMapping layers) {
  ParsedTrace& tr = rt.trace;
  TraceImport info;
  info.file = rt.file;
  info.format = tr.format;
  info.rank = rt.rank;
  std::copy(std::begin(tr.events_by_cat), std::end(tr.events_by_cat), std::begin(info.events_by_cat));
  info.other_categories = tr.other_categories;

  // Threads of host ranges, and the device streams.
  RankEvents events = split_events(tr, base_ns);  // the parsed events are gone after it
  std::vector<Thread>& threads = events.threads;
  const std::set<int>& devices = events.devices;
  if (threads.empty())
    throw TraceError(rt.file.string() + ": the trace has no host ranges (expected cpu_op or ProfilerStep events)");

  Names names(tr.strings);
  // Categories top-down (parents come first after build_tree), then steps by time.
  StepIndex steps = categorize(threads, names, tr.strings.size());
  // The main thread is the one with the steps (the legacy exporter's "CPU functions" tid 1, Kineto's
  // python thread).
  steps.sort_by_start();
  auto step_at = [&](std::int64_t t) -> std::int32_t { return steps.at(t); };
  for_each_thread_parallel(threads, [&](Thread& t) {
    for (Node& n : t.nodes) n.step = step_at(n.start);
  });

  std::map<std::string, std::map<std::string, std::string>> methods;
  info.resnet50 = looks_like_resnet50(threads, names, steps.spans.size());
  const bool map = layers == LayerMapping::resnet50 || (layers == LayerMapping::automatic && info.resnet50);
  if (map) info.layers = map_layers(threads, names, methods);
  info.layers_mapped = map;
  for_each_thread_parallel(threads, [&](Thread& t) {
    build_tree(t.nodes);
    for (Node& n : t.nodes)
      if (n.step < 0) n.step = step_at(n.start);
  });
  for (const Thread& t : threads)
    for (const Node& n : t.nodes) info.layer_ranges += n.added ? 1 : 0;

  Launches launches = index_launches(threads);
  // The kernels' own file (write_kernel_file), removed once the writer has closed.
  struct RemovedAtExit {
    std::filesystem::path file;
    ~RemovedAtExit() {
      std::error_code ec;
      std::filesystem::remove(file, ec);
    }
  } kernel_file{std::filesystem::path(path.string() + ".kernels")};
  store::Writer w(import_writer_options(path, rt.rank, build_indexes));
  auto stream_rows = stream_kernel_rows(events.streams, base_ns, launches, threads, info);
  events.streams.clear();  // each stream's events are its kernel rows now

  // Trace string ids -> the run file's, interned once each.
  std::vector<std::uint32_t> sid(tr.strings.size(), std::numeric_limits<std::uint32_t>::max());
  auto run_id = [&](std::uint32_t id) {
    if (sid[id] == std::numeric_limits<std::uint32_t>::max()) sid[id] = w.intern(tr.strings[id]);
    return sid[id];
  };

  main_thread_first(threads);
  // The timeline's summaries (of a file that gets its indexes: a rank's scratch file gets them when merged)
  // are built here from the rows as they are handed over, while the writer's thread inserts them, rather
  // than read back from the file after.
  auto summary = build_indexes ? std::make_unique<store::SummaryBuilder>() : nullptr;
  // Every track first, in the order the file numbers them: threads, launch queues, streams.
  const std::vector<ThreadTracks> thread_tracks = add_thread_tracks(threads, w);
  add_launch_queues(stream_rows, w);
  const std::vector<std::uint32_t> stream_tracks = add_stream_tracks(stream_rows, run_id, w);
  std::vector<std::span<const store::KernelRow>> kernels;
  for (const auto& [label, krs] : stream_rows)
    if (!krs.empty()) kernels.emplace_back(krs);
  // The kernels go into a file of their own on a second thread while the writer's thread inserts the
  // ranges; the writer then copies that table whole (Writer::adopt_kernels), far cheaper than inserting
  // them itself. The file has indexes exactly when the run file does (bulk_load: when it gets them).
  in_parallel(
      [&] {
        info.steps = write_threads(threads, thread_tracks, rt.rank, step_at, run_id, w, summary.get(), info);
        info.memory_events =
            write_memory(tr, threads, base_ns, rt.rank, devices.empty() ? 0 : 1, step_at, run_id, w);
      },
      [&] {
        if (!kernels.empty()) store::write_kernel_file(kernel_file.file, kernels, build_indexes);
      });
  if (!kernels.empty()) w.adopt_kernels(kernel_file.file);
  if (summary) {
    for (std::size_t i = 0; i < stream_rows.size(); ++i) {
      for (const auto& k : stream_rows[i].second) summary->add(k);
      summary->end_track(stream_tracks[i]);
    }
    w.use_summary(std::move(summary));
  }
  if (tr.max_memory_allocated >= 0) w.set_meta("max_memory_allocated", std::to_string(tr.max_memory_allocated));

  info.device = devices.empty() ? "cpu" : "cuda:" + std::to_string(*devices.begin());
  write_rank_meta(rt, info, device_properties_of(tr, devices), !devices.empty(), world_size, methods, w);
  // The span of the ops (cpu_op, not annotations): the TensorBoard breakdown's one step when the trace has
  // no ProfilerStep (its StepParser's cpu_min_ts and cpu_max_ts).
  std::int64_t ops_lo = std::numeric_limits<std::int64_t>::max(), ops_hi = std::numeric_limits<std::int64_t>::min();
  for (const Thread& t : threads)
    for (const Node& n : t.nodes)
      if (!n.added && (n.cat == EventCat::cpu_op || n.cat == EventCat::none)) {
        ops_lo = std::min(ops_lo, n.start);
        ops_hi = std::max(ops_hi, n.end);
      }
  if (ops_lo < ops_hi)
    w.set_meta("ops_span.rank" + std::to_string(rt.rank), std::to_string(ops_lo) + " " + std::to_string(ops_hi));
  // The layer ranges added are no ops of PyTorch's: the TensorBoard breakdown leaves them out.
  std::set<std::string> added;
  for (const Thread& t : threads)
    for (const Node& n : t.nodes)
      if (n.added) added.insert(tr.strings[n.name]);
  if (!added.empty()) w.set_meta("layer_ranges_added", nlohmann::json(added).dump());
  if (!w.finish()) throw store::StoreError(path.string() + ": writing the imported run failed: " + w.failure());
  if (w.dropped() > 0)
    throw store::StoreError(path.string() + ": " + std::to_string(w.dropped()) + " rows of the import were lost");
  return info;
}

}  // namespace

void tune_allocator_for_import() {
  // Larger blocks (the parsed events' 28 MiB ones, the big vectors) are mapped, and go back to the system
  // when freed; a trim threshold this high keeps the smaller ones' freed memory in the heap.
  mallopt(M_MMAP_THRESHOLD, 16 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

ImportResult import_torch_traces(const std::vector<std::filesystem::path>& traces, const std::filesystem::path& out,
                                 const ImportOptions& options) {
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  if (traces.empty()) throw TraceError("wb import torch-trace: no trace given");
  if (std::filesystem::exists(out) && !options.overwrite)
    throw store::StoreError(out.string() + ": exists (pass --overwrite to replace it)");

  std::vector<RankTrace> ranks;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    RankTrace rt;
    rt.file = traces[i];
    rt.trace = read_trace(traces[i]);
    rt.rank = static_cast<int>(i);
    const auto& di = rt.trace.distributed_info;
    if (di.is_object() && di.contains("rank") && di["rank"].is_number_integer()) rt.rank = di["rank"].get<int>();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    say("read " + traces[i].string() + ": " + std::to_string(rt.trace.events.size()) + " events in " +
        std::to_string(static_cast<int>(s * 1000)) + " ms" +
        (rt.trace.readers > 1 ? " (" + std::to_string(rt.trace.readers) + " threads)" : ""));
    ranks.push_back(std::move(rt));
  }
  int world_size = static_cast<int>(ranks.size());
  if (ranks.size() == 1) {
    // One rank's trace (of a job of distributedInfo's world_size): the file holds that rank alone.
    const auto& di = ranks[0].trace.distributed_info;
    if (di.is_object() && di.contains("world_size") && di["world_size"].is_number_integer())
      world_size = std::max(1, di["world_size"].get<int>());
  } else {
    std::sort(ranks.begin(), ranks.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
    for (std::size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i].rank != static_cast<int>(i))
        throw TraceError(ranks[i].file.string() + ": distributedInfo says rank " + std::to_string(ranks[i].rank) +
                         ", expected one trace per rank 0.." + std::to_string(ranks.size() - 1));
  }
  // One time base for all ranks: Kineto's timestamps are on one (epoch) clock across processes.
  std::int64_t base = std::numeric_limits<std::int64_t>::max();
  for (const auto& r : ranks)
    r.trace.events.for_each([&](const TraceEvent& e) { base = std::min(base, e.ts_ns); });

  ImportResult result;
  result.out = out;
  result.world_size = world_size;
  if (ranks.size() == 1) {
    say("rank " + std::to_string(ranks[0].rank) + ": building ranges, layers and kernels; writing " + out.string());
    std::filesystem::path tmp = out;
    tmp += ".import-" + std::to_string(::getpid());
    try {
      result.traces.push_back(write_rank(ranks[0], base, world_size, tmp, true, options.layers));
      std::filesystem::rename(tmp, out);
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw;
    }
    return result;
  }
  // Several ranks: per-rank files in a scratch folder next to the output, merged into it.
  std::filesystem::path dir = out;
  dir += ".import-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  try {
    for (auto& r : ranks) {
      say("rank " + std::to_string(r.rank) + ": building ranges, layers and kernels");
      result.traces.push_back(
          write_rank(r, base, world_size, dir / ("rank-" + std::to_string(r.rank) + ".sqlite"), false, options.layers));
      r.trace = ParsedTrace{};  // free it before the next
    }
    say("merging into " + out.string());
    store::merge_run(dir, out, options.overwrite);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    throw;
  }
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace wb::ingest
