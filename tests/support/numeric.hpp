#pragma once
// Normalised errors of a result against a reference.

#include <vector>

namespace wb::test {

// ||a - b|| / ||b||, accumulated in double, the denominator floored at max(floor, 1e-30). Fails the test
// when the sizes differ.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b, double floor = 0.0);

}  // namespace wb::test
