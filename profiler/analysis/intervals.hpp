// Sets of time intervals [start, end) as sorted, disjoint lists: union, intersection, difference and
// length, for the breakdowns that split time among classes (tb_overview.hpp, hta.hpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace wb::analysis {

using Interval = std::pair<std::int64_t, std::int64_t>;
using Intervals = std::vector<Interval>;  // sorted and disjoint once merged

// The union of any intervals (empty ones dropped), sorted and disjoint.
Intervals merged(Intervals v);
// Of two merged lists: the time in both, in the first but not the second.
Intervals intersect(const Intervals& a, const Intervals& b);
Intervals subtract(const Intervals& a, const Intervals& b);
// The length of a merged list, and its length inside [lo, hi).
std::int64_t length_of(const Intervals& v);
std::int64_t length_within(const Intervals& v, std::int64_t lo, std::int64_t hi);

}  // namespace wb::analysis
