#pragma once
// Memory accounting of a backend's storage: every allocation and free of tensor storage, workspace and
// converted weights is reported to one process-wide MemoryListener (the trainer's memory profile), with
// what the storage is for (its role) and the model module that made it (its owner).
//
// The owner and role come from a per-thread tag that the model pushes around each module (forward:
// activation, backward: gradient) and that code making model-level buffers sets for them (parameters,
// momentum, the data batch). A backend's private buffers (layout conversions, scratchpads, converted
// weights) are always `workspace`, owned by the module that asked for them. The free reports the tag of
// the allocation, so a listener can keep what is alive by role and owner without a map of pointers.
//
// Without a listener the cost is one relaxed atomic load per allocation; the tags cost a thread-local
// store per module.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace wb::backend {

enum class MemoryRole : std::uint8_t { activation = 0, gradient = 1, parameter = 2, momentum = 3, workspace = 4, data = 5, other = 6 };
inline constexpr int kMemoryRoles = 7;
// "activation", "gradient", "parameter", "momentum", "workspace", "data", "other".
const char* memory_role_name(MemoryRole role);

// What an allocation is for: a role and the model module that made it (-1: none, a model-level buffer).
struct MemoryTag {
  MemoryRole role = MemoryRole::other;
  std::int32_t owner = -1;
};

class MemoryListener {
 public:
  virtual ~MemoryListener() = default;
  // `bytes` is what the allocator holds for the storage (rounding, padding and guards included).
  // Both may run on any thread that allocates or drops a tensor.
  virtual void on_alloc(std::size_t bytes, MemoryTag tag) noexcept = 0;
  virtual void on_free(std::size_t bytes, MemoryTag tag) noexcept = 0;
};

// Installs (or with null removes) the process-wide listener. Frees of storage allocated under another
// listener (or none) are not reported, so a listener sees balanced pairs only.
void set_memory_listener(MemoryListener* listener);

// This thread's tag.
MemoryTag memory_tag() noexcept;
void set_memory_tag(MemoryTag tag) noexcept;

// Sets this thread's tag for its lifetime and restores the previous one.
class MemoryTagScope {
 public:
  explicit MemoryTagScope(MemoryTag tag) noexcept : saved_(memory_tag()) { set_memory_tag(tag); }
  MemoryTagScope(MemoryRole role, std::int32_t owner = -1) noexcept : MemoryTagScope(MemoryTag{role, owner}) {}
  ~MemoryTagScope() { set_memory_tag(saved_); }
  MemoryTagScope(const MemoryTagScope&) = delete;
  MemoryTagScope& operator=(const MemoryTagScope&) = delete;

 private:
  MemoryTag saved_;
};

// For allocators: reports an allocation of `bytes` under `tag` and returns the ticket its free passes
// to memory_freed (0: nothing was reported, nothing to report at the free).
std::uint64_t memory_allocated(std::size_t bytes, MemoryTag tag) noexcept;
void memory_freed(std::uint64_t ticket, std::size_t bytes, MemoryTag tag) noexcept;

}  // namespace wb::backend
