// The caching device allocator: free lists keyed by rounded size. A step of training asks for the same
// sizes in the same order as the step before, so after the first step every request is a cache hit and
// cudaMalloc (which synchronises the device) is never called on the hot path.
#include <algorithm>
#include <string>

#include "trainer/backend/cuda/cuda_backend.hpp"

namespace wb::backend::cuda {

std::shared_ptr<CachingAllocator> CachingAllocator::create(int device) {
  return std::shared_ptr<CachingAllocator>(new CachingAllocator(device));
}

CachingAllocator::~CachingAllocator() {
  // Runs when the backend and every tensor are gone; errors cannot be reported from a destructor.
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (cudaSetDevice(device_) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) cudaFree(p);
  }
  if (previous >= 0) cudaSetDevice(previous);
  cudaGetLastError();
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20, kSmallLimit = std::size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

std::shared_ptr<void> CachingAllocator::allocate(std::size_t bytes, bool workspace) {
  const std::size_t rounded = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= static_cast<std::int64_t>(rounded);
    }
  }
  if (!p) {
    // The calling thread (a prefetch thread, say) may have another device current.
    cudaError_t rc = cudaSetDevice(device_);
    if (rc == cudaSuccess) rc = cudaMalloc(&p, rounded);
    if (rc == cudaErrorMemoryAllocation) {
      // Give the cached blocks back to the driver and try once more.
      cudaGetLastError();
      release_cached();
      rc = cudaMalloc(&p, rounded);
    }
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw BackendError("cuda backend: cudaMalloc of " + std::to_string(rounded) + " bytes on device " +
                         std::to_string(device_) + " failed: " + cudaGetErrorString(rc));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.cuda_malloc_count;
    stats_.cuda_malloc_bytes += static_cast<std::int64_t>(rounded);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use_bytes += static_cast<std::int64_t>(rounded);
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  MemoryTag tag = memory_tag();
  if (workspace) tag.role = MemoryRole::workspace;
  const std::uint64_t ticket = memory_allocated(rounded, tag);
  auto self = shared_from_this();
  return std::shared_ptr<void>(p, [self, rounded, ticket, tag](void* q) { self->give_back(q, rounded, ticket, tag); });
}

void CachingAllocator::give_back(void* p, std::size_t rounded, std::uint64_t ticket, MemoryTag tag) noexcept {
  memory_freed(ticket, rounded, tag);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use_bytes -= static_cast<std::int64_t>(rounded);
  try {
    free_[rounded].push_back(p);
    stats_.cached_bytes += static_cast<std::int64_t>(rounded);
  } catch (...) {
    cudaFree(p);  // no memory for the free list: hand the block to the driver instead
  }
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) cudaFree(p);
    stats_.cached_bytes -= static_cast<std::int64_t>(size * blocks.size());
    blocks.clear();
  }
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace wb::backend::cuda
