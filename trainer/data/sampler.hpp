#pragma once
// Epoch order and sharding, in the manner of MindSpore's Cifar10Dataset(num_shards, shard_id):
//
//   permutation = epoch_permutation(N, seed, epoch)   identical on every rank (or 0..N-1 unshuffled)
//   shard k     = permutation[k], permutation[k + S], permutation[k + 2S], ...   (S = num_shards)
//                 floor(N / S) samples, so every shard has the same count and the shards are disjoint
//   batches     = consecutive runs of batch_size in the shard's order, remainder dropped:
//                 steps_per_epoch = floor(floor(N / S) / batch_size), the same on every shard.
//
// Random numbers come from counter-based mixing (splitmix64) of (seed, epoch, sample), never from a
// shared generator, so they do not depend on thread count or timing.

#include <cstdint>
#include <vector>

#include "trainer/data/error.hpp"

namespace wb::data {

// splitmix64 finaliser: a bijective 64-bit mix.
uint64_t mix64(uint64_t x);
// A generator seeded from a key; next() is splitmix64, uniform() is exact-rejection bounded.
class Rng {
 public:
  explicit Rng(uint64_t key) : state_(key) {}
  uint64_t next();
  // Uniform in [0, bound), bound >= 1.
  uint64_t uniform(uint64_t bound);
  // Uniform in [0, 1) with 53 bits.
  double uniform01();

 private:
  uint64_t state_;
};
// The key for one (seed, epoch, sample) triple; distinct triples give unrelated streams.
uint64_t sample_key(uint64_t seed, int64_t epoch, int64_t sample);

// Fisher-Yates shuffle of 0..n-1 keyed by (seed, epoch); writes into `out` (resized to n) so a
// caller that keeps the vector allocates only once.
void epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, std::vector<int64_t>& out);
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

class ShardSampler {
 public:
  // Throws DataError for num_shards < 1, shard_id outside [0, num_shards), batch_size < 1, or a batch
  // larger than the shard's samples.
  ShardSampler(int64_t dataset_size, int num_shards, int shard_id, int batch_size, uint64_t seed,
               bool shuffle);

  int64_t dataset_size() const { return dataset_size_; }
  int num_shards() const { return num_shards_; }
  int shard_id() const { return shard_id_; }
  int batch_size() const { return batch_size_; }
  int64_t samples_per_shard() const { return dataset_size_ / num_shards_; }
  int64_t steps_per_epoch() const { return samples_per_shard() / batch_size_; }

  // Fills `perm` with the epoch's global order (reused buffer).
  void fill_epoch_order(int64_t epoch, std::vector<int64_t>& perm) const;
  // Dataset index of sample j (0 <= j < batch_size) of batch b of this shard, given the epoch order.
  int64_t sample_index(const std::vector<int64_t>& perm, int64_t batch, int j) const {
    return perm[shard_id_ + (batch * batch_size_ + j) * static_cast<int64_t>(num_shards_)];
  }
  // This shard's sample order for one epoch: samples_per_shard() dataset indices.
  std::vector<int64_t> shard_order(int64_t epoch) const;

 private:
  int64_t dataset_size_;
  int num_shards_;
  int shard_id_;
  int batch_size_;
  uint64_t seed_;
  bool shuffle_;
};

}  // namespace wb::data
