#include "trainer/backend/memory.hpp"

namespace wb::backend {

namespace {

// The listener and its generation: a free is reported only to the listener that saw its allocation.
std::atomic<MemoryListener*> g_listener{nullptr};
std::atomic<std::uint64_t> g_generation{0};
thread_local MemoryTag t_tag;

}  // namespace

const char* memory_role_name(MemoryRole role) {
  switch (role) {
    case MemoryRole::activation: return "activation";
    case MemoryRole::gradient: return "gradient";
    case MemoryRole::parameter: return "parameter";
    case MemoryRole::momentum: return "momentum";
    case MemoryRole::workspace: return "workspace";
    case MemoryRole::data: return "data";
    case MemoryRole::other: return "other";
  }
  return "other";
}

void set_memory_listener(MemoryListener* listener) {
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  g_listener.store(listener, std::memory_order_release);
}

MemoryTag memory_tag() noexcept { return t_tag; }
void set_memory_tag(MemoryTag tag) noexcept { t_tag = tag; }

std::uint64_t memory_allocated(std::size_t bytes, MemoryTag tag) noexcept {
  MemoryListener* l = g_listener.load(std::memory_order_acquire);
  if (l == nullptr) [[likely]] return 0;
  l->on_alloc(bytes, tag);
  // Generations start at 1 once a listener was installed, so a reported allocation never gets ticket 0.
  return g_generation.load(std::memory_order_acquire);
}

void memory_freed(std::uint64_t ticket, std::size_t bytes, MemoryTag tag) noexcept {
  if (ticket == 0) return;
  MemoryListener* l = g_listener.load(std::memory_order_acquire);
  if (l == nullptr || g_generation.load(std::memory_order_acquire) != ticket) return;
  l->on_free(bytes, tag);
}

}  // namespace wb::backend
