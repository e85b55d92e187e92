// Deterministic tensor sets for tests and benchmarks: a layout filled with seeded random values.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "compare/tensor_set.hpp"
#include "compare/test_support/resnet50_layout.hpp"

namespace wb::compare::testing {

// Normal(0, 1) values for floating dtypes, small non-negative integers for integer dtypes.
store::HostTensor random_tensor(const LayoutEntry& entry, std::mt19937_64& rng);

// Tensors in layout order with exec_order = position, indexed.
TensorSet make_set(const std::vector<LayoutEntry>& layout, std::uint64_t seed, std::string source = "test");

// Element access for planting faults in F32 tensors.
float get_f32(const store::HostTensor& t, std::int64_t i);
void set_f32(store::HostTensor& t, std::int64_t i, float v);

}  // namespace wb::compare::testing
