#pragma once
// The key of the backends' per-shape caches (primitives, descriptors): a fixed number of integers stored
// inline, so that the lookup on every op call allocates nothing.

#include <array>
#include <cstddef>
#include <cstdint>

#include "trainer/backend/tensor.hpp"

namespace wb::backend {

template <std::size_t Capacity>
struct FixedKey {
  std::array<std::int64_t, Capacity> v{};
  int n = 0;
  FixedKey& add(std::int64_t x) {
    v[static_cast<std::size_t>(n++)] = x;
    return *this;
  }
  FixedKey& add(const Shape& s) {
    add(s.rank());
    for (int i = 0; i < s.rank(); ++i) add(s[i]);
    return *this;
  }
  bool operator==(const FixedKey& o) const { return n == o.n && v == o.v; }
};

// FNV-1a over the used integers.
struct FixedKeyHash {
  template <std::size_t Capacity>
  std::size_t operator()(const FixedKey<Capacity>& k) const {
    std::uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < k.n; ++i) {
      h ^= static_cast<std::uint64_t>(k.v[static_cast<std::size_t>(i)]);
      h *= 1099511628211ull;
    }
    return static_cast<std::size_t>(h);
  }
};

}  // namespace wb::backend
