// The device queue's page-locked staging buffers (trainer/gpu/staging_pool.hpp): whole pages, page-
// aligned, no page shared between two buffers, failures named and nothing leaked. The device queue
// allocates them with cudaHostAlloc; here an aligned host allocator stands in for it, which exercises
// the same layout rules on any machine (the CUDA run itself is in test_trainer_device's [cuda] cases).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "trainer/gpu/staging_pool.hpp"

namespace {

using wb::gpu::StagingAllocator;
using wb::gpu::StagingPool;

int g_live = 0;        // buffers allocated and not yet released
int g_fail_after = -1;  // the allocation with this index (0-based) fails; -1: none
int g_calls = 0;
std::size_t g_offset = 0;  // added to the returned pointer (to hand out misaligned memory)

void* test_alloc(std::size_t bytes, std::size_t alignment) {
  if (g_fail_after >= 0 && g_calls++ >= g_fail_after) return nullptr;
  void* p = std::aligned_alloc(alignment, bytes + alignment);
  if (p == nullptr) return nullptr;
  ++g_live;
  return static_cast<char*>(p) + g_offset;
}

void test_free(void* p) {
  --g_live;
  std::free(static_cast<char*>(p) - g_offset);
}

constexpr StagingAllocator kTestAlloc{test_alloc, test_free, "test allocator"};

struct Reset {
  Reset() { g_live = 0, g_fail_after = -1, g_calls = 0, g_offset = 0; }
  ~Reset() { g_fail_after = -1, g_offset = 0; }
};

}  // namespace

TEST_CASE("staging buffers are whole pages, page-aligned, and share no page", "[trainer]") {
  Reset reset;
  const std::size_t page = StagingPool::page_size();
  // A batch of 4 images 3x32x32 f32 is not a whole number of pages on 4 KiB or 64 KiB pages; labels
  // are a few bytes.
  for (const std::size_t bytes : {std::size_t{4 * 3 * 32 * 32 * 4 + 4}, std::size_t{16}, page, 3 * page + 1}) {
    CAPTURE(bytes, page);
    {
      StagingPool pool(bytes, 3, kTestAlloc);
      CHECK(pool.size() == 3);
      CHECK(g_live == 3);
      CHECK(pool.bytes() == bytes);
      CHECK(pool.capacity() % page == 0);
      CHECK(pool.capacity() >= bytes);
      CHECK(pool.capacity() < bytes + page);
      std::set<std::uintptr_t> pages;
      for (int i = 0; i < pool.size(); ++i) {
        const auto begin = reinterpret_cast<std::uintptr_t>(pool.buffer(i));
        CHECK(begin % page == 0);
        for (std::uintptr_t p = begin; p < begin + pool.capacity(); p += page) {
          CHECK(pages.insert(p).second);  // no page belongs to two buffers
        }
      }
      CHECK(pages.size() == 3 * pool.capacity() / page);
      CHECK_THROWS_AS(pool.buffer(3), std::out_of_range);
    }
    CHECK(g_live == 0);  // every buffer went back
  }
}

TEST_CASE("a failed staging allocation names the allocator and frees the buffers already taken", "[trainer]") {
  Reset reset;
  g_fail_after = 2;
  try {
    StagingPool pool(1 << 20, 4, kTestAlloc);
    FAIL("the third allocation should have failed");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("test allocator") != std::string::npos);
    CHECK(what.find("buffer 3 of 4") != std::string::npos);
  }
  CHECK(g_live == 0);
}

TEST_CASE("memory that is not page-aligned is refused", "[trainer]") {
  Reset reset;
  g_offset = 64;
  CHECK_THROWS_WITH(StagingPool(4096, 2, kTestAlloc), Catch::Contains("not page-aligned"));
  CHECK(g_live == 0);
  CHECK_THROWS_AS(StagingPool(4096, 0, kTestAlloc), std::invalid_argument);
}
