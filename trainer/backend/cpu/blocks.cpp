#include "trainer/backend/cpu/blocks.hpp"

#include <cstdlib>

namespace wb::backend::cpu {

BlockCache::~BlockCache() {
  for (auto& [bytes, blocks] : idle_) {
    for (void* b : blocks) std::free(b);
  }
}

void* BlockCache::take(std::size_t bytes) {
  {
    std::lock_guard lk(mutex_);
    auto it = idle_.find(bytes);
    if (it != idle_.end() && !it->second.empty()) {
      void* b = it->second.back();
      it->second.pop_back();
      idle_bytes_ -= bytes;
      return b;
    }
  }
  return std::aligned_alloc(64, bytes);
}

void BlockCache::give_back(void* block, std::size_t bytes) noexcept {
  std::lock_guard lk(mutex_);
  try {
    idle_[bytes].push_back(block);
    idle_bytes_ += bytes;
  } catch (...) {
    std::free(block);  // no room to keep it: hand it back to the system
  }
}

std::size_t BlockCache::idle_bytes() const {
  std::lock_guard lk(mutex_);
  return idle_bytes_;
}

}  // namespace wb::backend::cpu
