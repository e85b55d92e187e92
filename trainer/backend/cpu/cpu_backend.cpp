// CPU backend core: tensor allocation and views, host transfers, layout conversions, the primitive cache
// with its shared scratchpad, and the cache of converted weights. Weight copies are invalidated by a
// generation counter that every write into memory they were made from advances (sgd_update always;
// from_host / copy / fill when the destination overlaps cached weights; params_written on request).
#include "trainer/backend/cpu/cpu_backend.hpp"
#include "trainer/backend/cpu/blocks.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace wb::backend::cpu {

using dnnl::memory;

namespace {

constexpr unsigned char kCanaryByte = 0xA5;

std::size_t round64(std::size_t bytes) { return (std::max<std::size_t>(bytes, 64) + 63) / 64 * 64; }

}  // namespace

std::size_t CpuBackend::idle_block_bytes() const { return blocks_->idle_bytes(); }

std::shared_ptr<void> CpuBackend::storage(std::size_t bytes, bool workspace) {
  const std::size_t body = round64(bytes);
  const std::size_t held = body + kTailSlack + kCanaryBytes;
  void* p = blocks_->take(held);
  if (!p) throw BackendError("cpu backend: out of memory allocating " + std::to_string(bytes) + " bytes");
  auto* c = static_cast<unsigned char*>(p);
  std::memset(c + bytes, 0, body + kTailSlack - bytes);
  std::memset(c + body + kTailSlack, kCanaryByte, kCanaryBytes);
  MemoryTag tag = memory_tag();
  if (workspace) tag.role = MemoryRole::workspace;
  const std::uint64_t ticket = memory_allocated(held, tag);
  std::shared_ptr<void> owner(p, [blocks = blocks_, ticket, held, tag](void* q) {
    memory_freed(ticket, held, tag);
    blocks->give_back(q, held);
  });
  if (guards_.size() >= 2 * live_guards_ + 64) {
    std::erase_if(guards_, [](const Guard& g) { return g.owner.expired(); });
    live_guards_ = guards_.size();
  }
  guards_.push_back({owner, body + kTailSlack});
  ++live_guards_;
  return owner;
}

std::size_t CpuBackend::damaged_guards() const {
  std::size_t damaged = 0;
  for (const Guard& g : guards_) {
    auto owner = g.owner.lock();
    if (!owner) continue;
    const auto* c = static_cast<const unsigned char*>(owner.get()) + g.canary_offset;
    for (std::size_t i = 0; i < kCanaryBytes; ++i) {
      if (c[i] != kCanaryByte) {
        ++damaged;
        break;
      }
    }
  }
  return damaged;
}

CpuBackend::CpuBackend(const CpuOptions& options)
    : threads_(options.threads), reference_kernels_(options.reference_kernels), engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_),
      blocks_(std::make_shared<BlockCache>()) {
  if (threads_ < 0) {
    throw BackendError("cpu backend: threads must be >= 0 (0 = OpenMP default), got " + std::to_string(threads_));
  }
  apply_threads();
}

void CpuBackend::apply_threads() const {
  // omp_set_num_threads only sets the calling thread's value, so every op re-applies it in case the
  // trainer calls from a thread other than the one that made the backend.
  if (threads_ > 0 && omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
}

CpuTensorImpl& CpuBackend::impl(const Tensor& t) { return impl_as<CpuTensorImpl>(t, "cpu"); }

memory::desc CpuBackend::plain_md(const Shape& shape, DType dtype) {
  if (dtype == DType::i64) return {};
  memory::dims dims;
  for (int i = 0; i < shape.rank(); ++i) dims.push_back(shape[i]);
  if (dims.empty()) dims.push_back(1);
  static const memory::format_tag tags[] = {memory::format_tag::a, memory::format_tag::ab,
                                            memory::format_tag::abc, memory::format_tag::abcd};
  auto dt = dtype == DType::f32 ? memory::data_type::f32 : memory::data_type::s32;
  return memory::desc(dims, dt, tags[dims.size() - 1]);
}

int CpuBackend::layout_id(const memory::desc& m) {
  for (std::size_t i = 0; i < layouts_.size(); ++i) {
    if (layouts_[i] == m) return static_cast<int>(i);
  }
  layouts_.push_back(m);
  return static_cast<int>(layouts_.size() - 1);
}

Tensor CpuBackend::allocate(const Shape& shape, DType dtype, const memory::desc& m) {
  ++stats_.allocations;
  auto t = std::make_shared<CpuTensorImpl>();
  t->shape = shape;
  t->dtype = dtype;
  t->owner = this;
  if (dtype == DType::i64) {
    t->bytes = static_cast<std::size_t>(shape.numel()) * 8;
    t->storage = storage(t->bytes);
    t->data = t->storage.get();
    return Tensor(t);
  }
  t->md = m;
  t->bytes = m.get_size();
  t->storage = storage(t->bytes);
  t->data = t->storage.get();
  t->mem = memory(m, engine_, t->data);
  t->layout_id = layout_id(m);
  t->plain = m == plain_md(shape, dtype);
  return Tensor(t);
}

void CpuBackend::ensure(Tensor& t, const Shape& shape, const memory::desc& want) {
  if (t.defined()) {
    auto* p = dynamic_cast<CpuTensorImpl*>(t.impl());
    if (p && p->shape == shape && p->md == want) return;
  }
  t = allocate(shape, DType::f32, want);
}

Tensor CpuBackend::empty(const Shape& shape, DType dtype) {
  apply_threads();
  return allocate(shape, dtype, plain_md(shape, dtype));
}

Tensor CpuBackend::view(const Tensor& base, std::size_t offset, const Shape& shape) {
  auto t = make_view_impl(impl(base), offset, shape, *this);
  if (t->dtype != DType::i64) {
    t->md = plain_md(shape, t->dtype);
    t->mem = memory(t->md, engine_, t->data);
    t->layout_id = layout_id(t->md);
  }
  return Tensor(t);
}

Slot CpuBackend::make_slot(const memory::desc& m, SlotPool pool) {
  Pool& p = pools_[static_cast<std::size_t>(pool)];
  const std::size_t bytes = m.get_size();
  if (bytes > p.bytes) {
    ++stats_.allocations;
    p.storage.reset();  // the old buffer goes before the new one comes
    p.storage = storage(bytes, /*workspace=*/true);
    p.bytes = bytes;
    p.filled_by = nullptr;
  }
  Slot s;
  s.md = m;
  s.pool = pool;
  s.mem = memory(m, engine_, p.storage.get());
  return s;
}

const memory& CpuBackend::bind(Slot& slot) {
  void* data = pools_[static_cast<std::size_t>(slot.pool)].storage.get();
  if (slot.mem.get_data_handle() != data) slot.mem.set_data_handle(data);
  return slot.mem;
}

void CpuBackend::reorder_raw(const dnnl::reorder& prim, const dnnl_exec_arg_t (&args)[2]) {
  if (dnnl_primitive_execute(prim.get(), stream_.get(), 2, args) != dnnl_success) {
    throw BackendError("cpu backend: a layout conversion failed");
  }
}

void CpuBackend::run_slot_reorder(const memory& src, Slot& slot) {
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src.get()}, {DNNL_ARG_TO, bind(slot).get()}};
  reorder_raw(slot.prim, args);
}

const memory& CpuBackend::as_layout(const Tensor& t, const memory::desc& want, Slot& slot, SlotPool pool) {
  auto& ti = impl(t);
  if (ti.md == want) return ti.mem;
  if (!slot.mem || !(slot.md == want) || slot.pool != pool) slot = make_slot(want, pool);
  if (!slot.prim || !(slot.from == ti.md)) {
    slot.from = ti.md;
    slot.prim = dnnl::reorder(dnnl::reorder::primitive_desc(engine_, ti.md, engine_, want));
  }
  run_slot_reorder(ti.mem, slot);
  ++stats_.input_reorders;
  return slot.mem;
}

const memory& CpuBackend::weights_as(const Tensor& w, const memory::desc& want, int cache) {
  auto& wi = impl(w);
  if (wi.md == want) return wi.mem;
  const SlotPool pool = cache == 0 ? SlotPool::weights : SlotPool::weights_bwd;
  Pool& p = pools_[static_cast<std::size_t>(pool)];
  auto& wc = weight_cache_[static_cast<std::size_t>(cache)][wi.data];
  if (wc.slot.mem && wc.slot.md == want && wc.slot.from == wi.md && wc.generation == param_generation_ &&
      p.filled_by == &wc) {
    return bind(wc.slot);
  }
  if (!wc.slot.mem || !(wc.slot.md == want)) wc.slot = make_slot(want, pool);
  if (!wc.slot.prim || !(wc.slot.from == wi.md)) {
    wc.slot.from = wi.md;
    wc.slot.prim = dnnl::reorder(dnnl::reorder::primitive_desc(engine_, wi.md, engine_, want));
  }
  std::int64_t t0 = now_ns();
  run_slot_reorder(wi.mem, wc.slot);
  stats_.weight_reorder_ns += now_ns() - t0;
  ++stats_.weight_reorders;
  wc.generation = param_generation_;
  p.filled_by = &wc;
  const char* lo = static_cast<const char*>(wi.data);
  const char* hi = lo + wi.bytes;
  cached_lo_ = cached_lo_ ? std::min(cached_lo_, lo) : lo;
  cached_hi_ = cached_hi_ ? std::max(cached_hi_, hi) : hi;
  return wc.slot.mem;
}

void CpuBackend::note_write(const void* data, std::size_t bytes) {
  const char* lo = static_cast<const char*>(data);
  if (cached_lo_ && lo < cached_hi_ && lo + bytes > cached_lo_) bump_param_generation();
}

void CpuBackend::reorder(const memory& src, const memory& dst) {
  memory::desc s = src.get_desc(), d = dst.get_desc();
  const dnnl::reorder* prim = nullptr;
  for (auto& r : reorders_) {
    if (r.src == s && r.dst == d) {
      prim = &r.prim;
      break;
    }
  }
  if (!prim) {
    reorders_.push_back({s, d, dnnl::reorder(dnnl::reorder::primitive_desc(engine_, s, engine_, d))});
    prim = &reorders_.back().prim;
  }
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src.get()}, {DNNL_ARG_TO, dst.get()}};
  if (dnnl_primitive_execute(prim->get(), stream_.get(), 2, args) != dnnl_success) {
    throw BackendError("cpu backend: a layout conversion failed");
  }
}

void CpuBackend::grow_scratch(std::size_t bytes) {
  if (bytes <= scratch_bytes_) return;
  ++stats_.allocations;
  scratch_ = storage(bytes, /*workspace=*/true);
  scratch_bytes_ = bytes;
}

Entry* CpuBackend::insert(const CacheKey& key, std::unique_ptr<Entry> entry, const dnnl::primitive_desc_base& pd) {
  memory::desc sd = pd.scratchpad_desc();
  entry->scratch_bytes = sd.get_size();
  if (entry->scratch_bytes > 0) {
    grow_scratch(entry->scratch_bytes);
    entry->scratch = memory(sd, engine_, scratch_.get());
  }
  Entry* raw = entry.get();
  cache_[key] = std::move(entry);
  return raw;
}

void CpuBackend::execute(const dnnl::primitive& prim, Entry& entry, std::initializer_list<dnnl_exec_arg_t> args) {
  std::array<dnnl_exec_arg_t, 16> a{};
  int n = 0;
  for (const auto& arg : args) a[static_cast<std::size_t>(n++)] = arg;
  if (entry.scratch_bytes > 0) {
    // The shared scratchpad may have grown (moved) since this primitive was cached.
    if (entry.scratch.get_data_handle() != scratch_.get()) entry.scratch.set_data_handle(scratch_.get());
    a[static_cast<std::size_t>(n++)] = {DNNL_ARG_SCRATCHPAD, entry.scratch.get()};
  }
  dnnl_status_t st = dnnl_primitive_execute(prim.get(), stream_.get(), n, a.data());
  if (st != dnnl_success) throw BackendError("cpu backend: a oneDNN primitive failed, status " + std::to_string(st));
}

dnnl::primitive_attr CpuBackend::attr(bool relu_post_op) const {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (relu_post_op) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    a.set_post_ops(po);
  }
  return a;
}

// ---- host transfers -------------------------------------------------------------------------------

void CpuBackend::from_host(const Tensor& dst, std::span<const float> src) {
  apply_threads();
  auto& d = impl(dst);
  check_host_transfer(dst, DType::f32, src.size(), name(), "from_host");
  note_write(d.data, d.bytes);
  if (d.plain) {
    std::memcpy(d.data, src.data(), src.size_bytes());
    return;
  }
  memory user(plain_md(d.shape), engine_, const_cast<float*>(src.data()));
  reorder(user, d.mem);
}

void CpuBackend::from_host(const Tensor& dst, std::span<const std::int32_t> src) {
  auto& d = impl(dst);
  check_host_transfer(dst, DType::i32, src.size(), name(), "from_host");
  std::memcpy(d.data, src.data(), src.size_bytes());
}

void CpuBackend::to_host(const Tensor& src, std::span<float> dst) {
  apply_threads();
  auto& s = impl(src);
  check_host_transfer(src, DType::f32, dst.size(), name(), "to_host");
  if (s.plain) {
    std::memcpy(dst.data(), s.data, dst.size_bytes());
    return;
  }
  memory user(plain_md(s.shape), engine_, dst.data());
  reorder(s.mem, user);
}

void CpuBackend::to_host(const Tensor& src, std::span<std::int32_t> dst) {
  auto& s = impl(src);
  check_host_transfer(src, DType::i32, dst.size(), name(), "to_host");
  std::memcpy(dst.data(), s.data, dst.size_bytes());
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  apply_threads();
  auto& s = impl(src);
  auto& d = impl(dst);
  check_copy(src, dst, name());
  note_write(d.data, d.bytes);
  if (s.dtype != DType::f32 || s.md == d.md) {
    std::memcpy(d.data, s.data, std::min(s.bytes, d.bytes));
    return;
  }
  reorder(s.mem, d.mem);
}

void CpuBackend::fill(const Tensor& dst, float value) {
  apply_threads();
  auto& d = impl(dst);
  check_dtype(dst, DType::f32, name(), "fill");
  note_write(d.data, d.bytes);
  if (d.plain) {
    std::fill_n(static_cast<float*>(d.data), d.shape.numel(), value);
    return;
  }
  // Blocked layouts carry zero padding that a plain fill would overwrite; go through a plain copy.
  std::vector<float> host(static_cast<std::size_t>(d.shape.numel()), value);
  from_host(dst, host);
}

void CpuBackend::accumulate(const Tensor& src, float scale, const Tensor& dst, bool assign) {
  apply_threads();
  check_accumulate(src, dst, name());
  note_write(impl(dst).data, impl(dst).bytes);
  const float* x = src.data_as<float>();
  float* y = dst.data_as<float>();
  const std::int64_t n = src.numel();
  if (assign) {
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) y[i] = scale * x[i];
  } else {
#pragma omp parallel for simd schedule(static)
    for (std::int64_t i = 0; i < n; ++i) y[i] += scale * x[i];
  }
}

}  // namespace wb::backend::cpu

namespace wb::backend {

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace wb::backend
