// The threaded batch pipeline: in-order, reproducible batches whatever the worker count; a bounded
// queue whose observed depth history is valid; measurable starvation from delay_us; recycled buffers;
// and a shutdown that never hangs.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "trainer/data/pipeline.hpp"

using namespace wb::data;
using Catch::Matchers::Contains;

namespace {

// FNV-1a over raw bytes: a cheap fingerprint of a batch sequence.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

const Dataset& small_set() {
  static const Dataset d = synthetic_images({5, 600, 10}, Split::kTrain);
  return d;
}

PipelineConfig base_config() {
  PipelineConfig c;
  c.batch_size = 16;
  c.workers = 2;
  c.prefetch = 2;
  c.seed = 1;
  c.transform.image_size = 32;
  return c;
}

// Hash of every batch in order, plus a check that batches arrive numbered 0, 1, 2, ...
std::vector<uint64_t> batch_hashes(const PipelineConfig& c) {
  Pipeline pipe(small_set(), c);
  std::vector<uint64_t> out;
  while (BatchRef b = pipe.pop()) {
    REQUIRE(b->step == static_cast<int64_t>(out.size()));
    REQUIRE(b->epoch == b->step / pipe.steps_per_epoch());
    uint64_t h = fnv1a(b->images.data(), b->images.size() * sizeof(float));
    out.push_back(fnv1a(b->labels.data(), b->labels.size() * sizeof(int32_t), h));
  }
  return out;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct QueueRecorder : Observer {
  struct Event {
    int64_t t;
    int depth;
    bool push;
  };
  std::mutex m;
  std::vector<Event> events;
  std::vector<std::pair<int64_t, int64_t>> waits;
  std::multiset<int64_t> batches;
  std::map<int, int64_t> transforms;
  int64_t inverted_ranges = 0;  // counted here, asserted on the test thread (Catch2 is not thread-safe)
  void on_push(int64_t t, int depth) override {
    std::lock_guard l(m);
    events.push_back({t, depth, true});
  }
  void on_pop(int64_t t, int depth) override {
    std::lock_guard l(m);
    events.push_back({t, depth, false});
  }
  void on_wait(int64_t b, int64_t e) override {
    std::lock_guard l(m);
    waits.emplace_back(b, e);
  }
  void on_transform(int, int id, int64_t b, int64_t e) override {
    std::lock_guard l(m);
    inverted_ranges += b > e ? 1 : 0;
    ++transforms[id];
  }
  void on_batch(int worker, int64_t index, int64_t b, int64_t e) override {
    std::lock_guard l(m);
    inverted_ranges += b > e ? 1 : 0;
    batches.insert(index);
  }
  int64_t wait_ns() {
    std::lock_guard l(m);
    int64_t s = 0;
    for (auto [b, e] : waits) s += e - b;
    return s;
  }
};

}  // namespace

TEST_CASE("batch sequence is identical for 1 and 4 workers and across runs", "[trainer][data]") {
  PipelineConfig c = base_config();
  c.total_steps = 2 * (600 / 16) + 5;  // crosses two epoch boundaries
  c.workers = 1;
  const auto one = batch_hashes(c);
  REQUIRE(static_cast<int64_t>(one.size()) == c.total_steps);
  c.workers = 4;
  c.prefetch = 3;
  const auto four = batch_hashes(c);
  REQUIRE(four == one);
  REQUIRE(batch_hashes(c) == one);
  c.seed = 2;
  const auto other = batch_hashes(c);
  REQUIRE(other.size() == one.size());
  for (size_t i = 0; i < one.size(); ++i) REQUIRE(other[i] != one[i]);
  // Epochs are shuffled differently, so epoch 1 does not repeat epoch 0.
  REQUIRE(one[0] != one[static_cast<size_t>(600 / 16)]);
}

TEST_CASE("batches hold the sharded samples, transformed", "[trainer][data]") {
  PipelineConfig c = base_config();
  c.num_shards = 3;
  c.shard_id = 1;
  c.workers = 3;
  c.transform.image_size = 24;
  c.total_steps = 15;  // 200 samples per shard / 16 = 12 steps per epoch, so into epoch 1
  Pipeline pipe(small_set(), c);
  REQUIRE(pipe.steps_per_epoch() == 12);
  const ShardSampler& s = pipe.sampler();
  SampleTransform transform(c.transform, 32, 32);
  std::vector<float> expect(3 * 24 * 24);
  int64_t popped = 0;
  while (BatchRef b = pipe.pop()) {
    REQUIRE(b->images.size() == static_cast<size_t>(16 * 3 * 24 * 24));
    const auto order = s.shard_order(b->epoch);
    const int64_t in_epoch = b->step % 12;
    for (int j = 0; j < 16; ++j) {
      const int64_t idx = order[static_cast<size_t>(in_epoch * 16 + j)];
      REQUIRE(b->labels[static_cast<size_t>(j)] == small_set().labels[static_cast<size_t>(idx)]);
      transform.apply(small_set().image(idx), draw_augment(c.transform, c.seed, b->epoch, idx), expect.data());
      REQUIRE(std::equal(expect.begin(), expect.end(), b->images.begin() + j * 3 * 24 * 24));
    }
    ++popped;
  }
  REQUIRE(popped == 15);
  REQUIRE(!pipe.pop());  // stays finished
}

TEST_CASE("queue stays within capacity and its depth history is consistent", "[trainer][data]") {
  PipelineConfig c = base_config();
  c.workers = 4;
  c.prefetch = 3;
  c.total_steps = 40;
  QueueRecorder rec;
  std::set<const float*> buffers;
  {
    Pipeline pipe(small_set(), c, &rec);
    // Let the queue fill before consuming, so the history certainly reaches the capacity.
    const auto start = Clock::now();
    while (pipe.stats().pushes < 3 && seconds_since(start) < 10.0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    int64_t n = 0;
    while (BatchRef b = pipe.pop()) {
      buffers.insert(b->images.data());
      // A consumer that is sometimes slower and sometimes faster than the workers.
      if (n++ % 8 < 4) std::this_thread::sleep_for(std::chrono::microseconds(1500));
    }
    const PipelineStats st = pipe.stats();
    REQUIRE(st.pushes == 40);
    REQUIRE(st.pops == 40);
    REQUIRE(st.max_depth <= 3);
    REQUIRE(st.max_depth >= 1);
    REQUIRE(st.wait_ns == rec.wait_ns());
    REQUIRE(st.waits == static_cast<int64_t>(rec.waits.size()));
  }
  // Buffers are recycled: no more than prefetch + workers + 1 distinct ones over 40 batches.
  REQUIRE(buffers.size() <= 3 + 4 + 1);

  std::sort(rec.events.begin(), rec.events.end(), [](const auto& a, const auto& b) { return a.t < b.t; });
  REQUIRE(rec.events.size() == 80);
  int depth = 0;
  int max_seen = 0;
  for (size_t i = 0; i < rec.events.size(); ++i) {
    CAPTURE(i);
    if (i > 0) REQUIRE(rec.events[i].t > rec.events[i - 1].t);  // strictly ordered stamps
    depth += rec.events[i].push ? 1 : -1;
    REQUIRE(rec.events[i].depth == depth);
    REQUIRE(depth >= 0);
    REQUIRE(depth <= 3);
    max_seen = std::max(max_seen, depth);
  }
  REQUIRE(depth == 0);
  REQUIRE(max_seen == 3);

  std::multiset<int64_t> expected;
  for (int64_t i = 0; i < 40; ++i) expected.insert(i);
  REQUIRE(rec.batches == expected);
  REQUIRE(rec.inverted_ranges == 0);
  // 32x32 train input: every sample reports decode, crop, flip, normalize, chw (resize skipped).
  REQUIRE(rec.transforms[kDecode] == 40 * 16);
  REQUIRE(rec.transforms[kRandomCrop] == 40 * 16);
  REQUIRE(rec.transforms[kRandomFlip] == 40 * 16);
  REQUIRE(rec.transforms.count(kResize) == 0);
  REQUIRE(rec.transforms[kRescaleNormalize] == 40 * 16);
  REQUIRE(rec.transforms[kHwc2Chw] == 40 * 16);
}

TEST_CASE("per-sample delay starves the consumer measurably", "[trainer][data]") {
  // One worker, batches of 4, a consumer that computes for 2 ms per step: with no delay the queue
  // keeps up; with 1.5 ms and 6 ms per sample a batch takes 6 and 24 ms, so the consumer waits.
  auto measure = [](int64_t delay_us) {
    PipelineConfig c = base_config();
    c.workers = 1;
    c.batch_size = 4;
    c.prefetch = 2;
    c.delay_us = delay_us;
    c.total_steps = 8;
    QueueRecorder rec;
    Pipeline pipe(small_set(), c, &rec);
    while (BatchRef b = pipe.pop()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    REQUIRE(pipe.stats().wait_ns == rec.wait_ns());
    return pipe.stats().wait_ns;
  };
  const int64_t w0 = measure(0);
  const int64_t w1 = measure(1500);
  const int64_t w2 = measure(6000);
  CAPTURE(w0, w1, w2);
  REQUIRE(w1 > w0);
  REQUIRE(w2 > w1);
  // Lower bound from the arithmetic: 8 batches * (24 ms - 2 ms) minus the first batch's head start.
  REQUIRE(w2 > 120'000'000);
  REQUIRE(w1 > 20'000'000);
}

TEST_CASE("shutdown does not hang on a full queue or a blocked consumer", "[trainer][data]") {
  SECTION("workers blocked on a full queue, nobody popping") {
    PipelineConfig c = base_config();
    c.workers = 4;
    c.prefetch = 2;
    Clock::time_point t0;
    {
      Pipeline pipe(small_set(), c);
      const auto start = Clock::now();
      while (pipe.stats().pushes < 2 && seconds_since(start) < 10.0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      REQUIRE(pipe.stats().pushes == 2);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // let every worker block
      REQUIRE(pipe.stats().pushes == 2);                           // the queue holds prefetch batches
      t0 = Clock::now();
    }
    REQUIRE(seconds_since(t0) < 1.0);
  }
  SECTION("consumer blocked in pop while workers sleep in a long delay") {
    PipelineConfig c = base_config();
    c.delay_us = 10'000'000;
    Pipeline pipe(small_set(), c);
    std::atomic<bool> got_batch{true};
    const auto t0 = Clock::now();
    std::thread consumer([&] { got_batch = static_cast<bool>(pipe.pop()); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pipe.stop();
    consumer.join();
    REQUIRE(!got_batch);
    REQUIRE(seconds_since(t0) < 2.0);
    REQUIRE(!pipe.pop());
  }
  SECTION("a held batch outlives stop() and is returned before destruction") {
    PipelineConfig c = base_config();
    Pipeline pipe(small_set(), c);
    BatchRef held = pipe.pop();
    REQUIRE(held);
    REQUIRE(held->step == 0);
    pipe.stop();
    REQUIRE(held->labels.size() == 16);
    held.release();
    REQUIRE(!held);
  }
}

TEST_CASE("pipeline rejects bad settings", "[trainer][data]") {
  PipelineConfig c = base_config();
  SECTION("batch larger than the shard") {
    c.num_shards = 8;
    c.batch_size = 76;  // 600 / 8 = 75 per shard
    REQUIRE_THROWS_AS(Pipeline(small_set(), c), DataError);
    REQUIRE_THROWS_WITH(Pipeline(small_set(), c), Contains("--batch-size 76") && Contains("75"));
  }
  SECTION("workers and prefetch") {
    c.workers = 0;
    REQUIRE_THROWS_WITH(Pipeline(small_set(), c), Contains("--data-workers"));
    c.workers = 1;
    c.prefetch = 0;
    REQUIRE_THROWS_AS(Pipeline(small_set(), c), DataError);
    REQUIRE_THROWS_WITH(Pipeline(small_set(), c), Contains("--prefetch"));
  }
  SECTION("image size") {
    c.transform.image_size = -3;
    REQUIRE_THROWS_WITH(Pipeline(small_set(), c), Contains("--image-size"));
  }
  SECTION("empty dataset") {
    const Dataset empty;
    REQUIRE_THROWS_AS(Pipeline(empty, c), DataError);
  }
}
