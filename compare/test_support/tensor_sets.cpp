#include "compare/test_support/tensor_sets.hpp"

#include <cstring>

namespace wb::compare::testing {

store::HostTensor random_tensor(const LayoutEntry& entry, std::mt19937_64& rng) {
  store::HostTensor t;
  t.name = entry.key;
  t.dtype = entry.dtype;
  t.shape = entry.shape;
  const std::int64_t n = t.numel();
  t.data.resize(static_cast<std::size_t>(n) * store::dtype_size(t.dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    std::byte* p = t.data.data() + i * static_cast<std::int64_t>(store::dtype_size(t.dtype));
    switch (t.dtype) {
      case store::DType::F32: {
        const float v = normal(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case store::DType::F64: {
        const double v = normal(rng);
        std::memcpy(p, &v, 8);
        break;
      }
      case store::DType::I64: {
        const std::int64_t v = static_cast<std::int64_t>(rng() % 10);
        std::memcpy(p, &v, 8);
        break;
      }
      case store::DType::I32: {
        const std::int32_t v = static_cast<std::int32_t>(rng() % 10);
        std::memcpy(p, &v, 4);
        break;
      }
      default: *p = static_cast<std::byte>(rng() % 2); break;
    }
  }
  return t;
}

TensorSet make_set(const std::vector<LayoutEntry>& layout, std::uint64_t seed, std::string source) {
  std::mt19937_64 rng(seed);
  TensorSet set;
  set.source = std::move(source);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    set.tensors.push_back({layout[i].key, static_cast<std::int64_t>(i), random_tensor(layout[i], rng)});
  }
  set.index();
  return set;
}

float get_f32(const store::HostTensor& t, std::int64_t i) {
  float v;
  std::memcpy(&v, t.data.data() + 4 * i, 4);
  return v;
}

void set_f32(store::HostTensor& t, std::int64_t i, float v) { std::memcpy(t.data.data() + 4 * i, &v, 4); }

}  // namespace wb::compare::testing
