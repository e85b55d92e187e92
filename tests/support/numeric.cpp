#include "support/numeric.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

namespace wb::test {

double rel_l2(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  REQUIRE(a.size() == b.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(num) / std::max({std::sqrt(den), floor, 1e-30});
}

}  // namespace wb::test
