// Page-locked staging buffers for host-to-device batch copies: one buffer per device-queue slot, each
// page-aligned and rounded up to whole pages, so no two buffers share a page and none shares a page
// with anything else the process allocates. The copy thread copies a host batch into its slot's
// buffer and the DMA reads from there: cudaMemcpyAsync from pageable memory would make the copy
// synchronous (and staged by the driver), and page-locking the pipeline's own std::vector buffers in
// place (cudaHostRegister) fails for buffers that share a page, which is how batches used to reach
// the device from pageable memory while the run recorded "pinned".
//
// The allocation functions are a parameter so that the layout rules are tested on any machine: the
// device queue passes cudaHostAlloc / cudaFreeHost (which return page-aligned, page-locked memory),
// the tests pass an aligned allocator.
//
//   StagingPool pool(bytes, slots, {cuda_host_alloc, cuda_free_host});
//   std::memcpy(pool.buffer(slot), batch.data(), bytes);  cudaMemcpyAsync(dst, pool.buffer(slot), ...);
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace wb::gpu {

struct StagingAllocator {
  // Returns at least `bytes` of memory aligned to `alignment`, or nullptr on failure.
  void* (*allocate)(std::size_t bytes, std::size_t alignment);
  void (*release)(void* p);
  const char* name;  // for error messages: "cudaHostAlloc", ...
};

class StagingPool {
 public:
  static std::size_t page_size() {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : 4096;
  }
  // `bytes` rounded up to whole pages.
  static std::size_t rounded(std::size_t bytes) {
    const std::size_t page = page_size();
    return (bytes == 0 ? page : (bytes + page - 1) / page * page);
  }

  StagingPool(std::size_t bytes, int count, StagingAllocator alloc) : bytes_(bytes), capacity_(rounded(bytes)), alloc_(alloc) {
    if (count < 1) throw std::invalid_argument("staging pool: expected at least one buffer, got " + std::to_string(count));
    const std::size_t page = page_size();
    try {
      for (int i = 0; i < count; ++i) {
        void* p = alloc_.allocate(capacity_, page);
        if (p == nullptr) {
          throw std::runtime_error(std::string("staging pool: ") + alloc_.name + " of " + std::to_string(capacity_) +
                                   " bytes (page-locked batch staging buffer " + std::to_string(i + 1) + " of " +
                                   std::to_string(count) + ") failed");
        }
        buffers_.push_back(p);
        if (reinterpret_cast<std::uintptr_t>(p) % page != 0) {
          throw std::runtime_error(std::string("staging pool: ") + alloc_.name + " returned memory that is not page-aligned");
        }
      }
    } catch (...) {
      free_all();
      throw;
    }
  }
  ~StagingPool() { free_all(); }
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  int size() const { return static_cast<int>(buffers_.size()); }
  std::size_t bytes() const { return bytes_; }        // what each buffer holds
  std::size_t capacity() const { return capacity_; }  // what each buffer occupies: whole pages
  void* buffer(int i) const { return buffers_.at(static_cast<std::size_t>(i)); }

 private:
  void free_all() noexcept {
    for (void* p : buffers_) alloc_.release(p);
    buffers_.clear();
  }

  std::size_t bytes_, capacity_;
  StagingAllocator alloc_;
  std::vector<void*> buffers_;
};

}  // namespace wb::gpu
