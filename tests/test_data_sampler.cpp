// Epoch permutation and sharding: shards are disjoint, cover floor(N/S)*S samples, agree on one
// permutation across ranks, and have equal step counts.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <set>
#include <vector>

#include "trainer/data/sampler.hpp"

using namespace wb::data;
using Catch::Matchers::Contains;

TEST_CASE("epoch permutation is a seeded permutation", "[trainer][data]") {
  const auto p = epoch_permutation(1000, 5, 0);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  REQUIRE(sorted == iota);
  REQUIRE(p != iota);
  REQUIRE(epoch_permutation(1000, 5, 0) == p);
  REQUIRE(epoch_permutation(1000, 5, 1) != p);
  REQUIRE(epoch_permutation(1000, 6, 0) != p);

  // Every element lands in the first slot with roughly equal frequency (n = 5, 20000 epochs).
  std::vector<int> first(5, 0);
  for (int e = 0; e < 20000; ++e) ++first[static_cast<size_t>(epoch_permutation(5, 9, e)[0])];
  for (int k = 0; k < 5; ++k) {
    CAPTURE(k, first[static_cast<size_t>(k)]);
    REQUIRE(first[static_cast<size_t>(k)] > 3700);  // expected 4000, sd ~57
    REQUIRE(first[static_cast<size_t>(k)] < 4300);
  }
}

TEST_CASE("bounded random numbers stay in range and hit every value", "[trainer][data]") {
  Rng rng(77);
  std::vector<int> hits(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const uint64_t v = rng.uniform(7);
    REQUIRE(v < 7);
    ++hits[v];
  }
  for (int h : hits) REQUIRE(h > 800);
  for (int i = 0; i < 1000; ++i) {
    const double u = rng.uniform01();
    REQUIRE((u >= 0.0 && u < 1.0));
  }
}

TEST_CASE("shards are disjoint, cover floor(N/S)*S samples and share one permutation", "[trainer][data]") {
  const int64_t n = GENERATE(1003, 1000, 64);
  const int shards = GENERATE(1, 2, 3, 4);
  const bool shuffle = GENERATE(true, false);
  CAPTURE(n, shards, shuffle);
  const int batch = 8;
  const int64_t epoch = 2;
  const auto perm = shuffle ? epoch_permutation(n, 11, epoch) : [&] {
    std::vector<int64_t> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), 0);
    return v;
  }();

  std::set<int64_t> seen;
  for (int k = 0; k < shards; ++k) {
    // Each rank builds its own sampler, as in a real run.
    const ShardSampler s(n, shards, k, batch, 11, shuffle);
    REQUIRE(s.samples_per_shard() == n / shards);
    REQUIRE(s.steps_per_epoch() == (n / shards) / batch);
    const auto order = s.shard_order(epoch);
    REQUIRE(static_cast<int64_t>(order.size()) == n / shards);
    for (size_t i = 0; i < order.size(); ++i) {
      REQUIRE(order[i] == perm[static_cast<size_t>(k) + i * static_cast<size_t>(shards)]);
      REQUIRE(seen.insert(order[i]).second);  // disjoint
    }
    // Batch b, sample j is element b*batch + j of the shard's order.
    std::vector<int64_t> full;
    s.fill_epoch_order(epoch, full);
    for (int64_t b = 0; b < s.steps_per_epoch(); ++b) {
      for (int j = 0; j < batch; ++j) {
        REQUIRE(s.sample_index(full, b, j) == order[static_cast<size_t>(b * batch + j)]);
      }
    }
  }
  REQUIRE(static_cast<int64_t>(seen.size()) == (n / shards) * shards);
}

TEST_CASE("sharding rejects bad settings with one clear line", "[trainer][data]") {
  REQUIRE_THROWS_AS(ShardSampler(40, 4, 0, 11, 1, true), DataError);
  REQUIRE_THROWS_WITH(ShardSampler(40, 4, 0, 11, 1, true),
                      Contains("--batch-size 11") && Contains("10 samples") && Contains("4 shard"));
  REQUIRE_NOTHROW(ShardSampler(40, 4, 3, 10, 1, true));
  REQUIRE_THROWS_AS(ShardSampler(40, 4, 4, 1, 1, true), DataError);
  REQUIRE_THROWS_AS(ShardSampler(40, 4, -1, 1, 1, true), DataError);
  REQUIRE_THROWS_AS(ShardSampler(40, 0, 0, 1, 1, true), DataError);
  REQUIRE_THROWS_AS(ShardSampler(40, 1, 0, 0, 1, true), DataError);
  REQUIRE_THROWS_AS(ShardSampler(3, 4, 0, 1, 1, true), DataError);  // a shard with no samples
}
