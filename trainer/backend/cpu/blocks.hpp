#pragma once
// The CPU backend's storage blocks, kept by exact size between tensors.
//
// The model frees activations and their gradients as backward consumes them and allocates them again
// in the next step (Backend::cheap_reallocation). Through malloc, that pattern made glibc's heap grow
// without bound: measured at 224x224, batch 4, the process's resident memory rose by about 130 MiB a
// step while the live tensors stayed at 626 MiB (freed blocks were split and merged into free chunks
// that the next step's requests, in another order, did not fit). Blocks of large sizes served by mmap
// instead are faulted in again page by page every step. So the backend keeps each freed block under its
// exact size and hands it to the next tensor of that size: every step asks for the same sizes, so from
// the second step on nothing is allocated from the system and nothing is faulted in.
//
// As with the CUDA caching allocator (and PyTorch's "allocated"), the memory profile counts a block
// while a tensor holds it: its return here is reported as a free. What the backend holds besides is
// idle_bytes(); bench/cpu_vs_torch prints it at the step's end.
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace wb::backend::cpu {

class BlockCache {
 public:
  BlockCache() = default;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache();

  // A 64-byte aligned block of exactly `bytes`: an idle one of that size, else a new one (null when the
  // system has no memory left).
  void* take(std::size_t bytes);
  // Keeps `block` (from take(bytes)) for the next take of that size.
  void give_back(void* block, std::size_t bytes) noexcept;

  std::size_t idle_bytes() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> idle_;
  std::size_t idle_bytes_ = 0;
};

}  // namespace wb::backend::cpu
