#include "trainer/data/sampler.hpp"

#include <numeric>
#include <string>
#include <utility>

namespace wb::data {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Rng::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Rng::uniform(uint64_t bound) {
  // Reject the top partial block so every value is equally likely (std distributions are
  // implementation-defined, which would make runs differ between standard libraries).
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t r = next();
  while (r >= limit) r = next();
  return r % bound;
}

double Rng::uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t sample_key(uint64_t seed, int64_t epoch, int64_t sample) {
  return mix64(mix64(mix64(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(sample));
}

void epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, std::vector<int64_t>& out) {
  out.resize(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  // The sample slot of the key is -1 so the shuffle stream never coincides with an augmentation stream.
  Rng rng(sample_key(seed, epoch, -1));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(i + 1)));
    std::swap(out[static_cast<size_t>(i)], out[static_cast<size_t>(j)]);
  }
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> out;
  epoch_permutation(n, seed, epoch, out);
  return out;
}

ShardSampler::ShardSampler(int64_t dataset_size, int num_shards, int shard_id, int batch_size,
                           uint64_t seed, bool shuffle)
    : dataset_size_(dataset_size),
      num_shards_(num_shards),
      shard_id_(shard_id),
      batch_size_(batch_size),
      seed_(seed),
      shuffle_(shuffle) {
  if (num_shards < 1) {
    throw DataError("data sharding: num_shards (world size) is " + std::to_string(num_shards) +
                    ", expected >= 1");
  }
  if (shard_id < 0 || shard_id >= num_shards) {
    throw DataError("data sharding: shard_id (rank) is " + std::to_string(shard_id) +
                    ", expected 0.." + std::to_string(num_shards - 1));
  }
  if (batch_size < 1) {
    throw DataError("--batch-size is " + std::to_string(batch_size) + ", expected >= 1");
  }
  if (batch_size > samples_per_shard()) {
    throw DataError("--batch-size " + std::to_string(batch_size) + " exceeds the " +
                    std::to_string(samples_per_shard()) + " samples of each of " +
                    std::to_string(num_shards) + " shard(s) of a " + std::to_string(dataset_size) +
                    "-sample dataset; expected at most " + std::to_string(samples_per_shard()));
  }
}

void ShardSampler::fill_epoch_order(int64_t epoch, std::vector<int64_t>& perm) const {
  if (shuffle_) {
    epoch_permutation(dataset_size_, seed_, epoch, perm);
  } else {
    perm.resize(static_cast<size_t>(dataset_size_));
    std::iota(perm.begin(), perm.end(), int64_t{0});
  }
}

std::vector<int64_t> ShardSampler::shard_order(int64_t epoch) const {
  std::vector<int64_t> perm;
  fill_epoch_order(epoch, perm);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(samples_per_shard()));
  for (int64_t i = 0; i < samples_per_shard(); ++i) {
    out.push_back(perm[static_cast<size_t>(shard_id_ + i * num_shards_)]);
  }
  return out;
}

}  // namespace wb::data
