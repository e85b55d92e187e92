// In one process: GradientSync's bookkeeping (bucket readiness, reduction order, spans, overlap with a
// simulated backward, misuse errors) over SelfCommunicator, and the collective watchdog's timing and
// message. The multi-rank behaviour is in test_parallel_mpi.cpp.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainer/parallel/clock.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/watchdog.hpp"

using namespace wb::parallel;
using namespace std::chrono_literals;

namespace {

std::vector<ParamExtent> uniform_params(int count, std::int64_t numel) {
  std::vector<ParamExtent> out;
  for (int p = 0; p < count; ++p) out.push_back({p * numel, numel});
  return out;
}

}  // namespace

TEST_CASE("GradientSync reduces buckets last-first as backward completes them", "[parallel]") {
  SelfCommunicator comm;
  const auto params = uniform_params(12, 100);
  const std::vector<int> split = {4, 9};  // [0,4) [4,9) [9,12)
  std::vector<float> grads(1200, 1.0f);
  std::vector<BucketSpan> seen;
  SyncOptions options;
  options.on_span = [&](const BucketSpan& s) { seen.push_back(s); };
  GradientSync sync(comm, buckets_from_split(params, split), grads.data(), options);

  for (int step = 0; step < 2; ++step) {
    seen.clear();
    sync.begin_step(step);
    std::int64_t bucket2_reported = 0;
    for (int p = 12; p > 0; --p) {
      std::this_thread::sleep_for(2ms);
      sync.on_grads_ready(p - 1, p);
      if (p - 1 == 9) {
        bucket2_reported = now_ns();
        // Bucket 2 is complete: it is reduced while "backward" goes on.
        sync.wait_bucket(2);
      }
    }
    const std::int64_t backward_end = now_ns();
    sync.wait_all();
    const auto spans = sync.spans();
    REQUIRE(spans.size() == 3);
    REQUIRE(seen.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      CAPTURE(step, k);
      REQUIRE(spans[k].bucket == 2 - static_cast<int>(k));
      REQUIRE(spans[k].step == step);
      REQUIRE(spans[k].ready_ns <= spans[k].start_ns);
      REQUIRE(spans[k].start_ns <= spans[k].end_ns);
      REQUIRE(seen[k].bucket == spans[k].bucket);
    }
    REQUIRE(spans[0].first_param == 9);
    REQUIRE(spans[0].last_param == 11);
    REQUIRE(spans[0].bytes == 300 * 4);
    REQUIRE(spans[0].ready_ns <= bucket2_reported);
    REQUIRE(spans[0].end_ns < backward_end);  // finished during backward: overlap
    REQUIRE(spans[2].first_param == 0);
    // Bucket 0 can only start after backward: its allreduce is the exposed part.
    REQUIRE(exposed_comm_ns(spans, backward_end) == std::max<std::int64_t>(0, spans[2].end_ns - backward_end));
  }
  const std::vector<BucketSpan> hidden = {{0, 0, 1, 0, 0, 4, 10, 20, 30}, {0, 0, 0, 0, 0, 4, 40, 45, 90}};
  REQUIRE(exposed_comm_ns(hidden, 100) == 0);
  REQUIRE(exposed_comm_ns(hidden, 60) == 30);
}

TEST_CASE("GradientSync accepts ranges that straddle buckets", "[parallel]") {
  SelfCommunicator comm;
  const auto params = uniform_params(10, 8);
  const std::vector<int> split = {3, 6};
  std::vector<float> grads(80, 2.0f);
  GradientSync sync(comm, buckets_from_split(params, split), grads.data());
  sync.begin_step(0);
  sync.on_grads_ready(5, 10);  // all of bucket 2 and part of bucket 1
  sync.wait_bucket(2);
  sync.on_grads_ready(0, 5);
  sync.wait_all();
  REQUIRE(sync.spans().size() == 3);
  REQUIRE(grads[79] == 2.0f);  // a world of one: the mean is the value itself
}

TEST_CASE("GradientSync misuse is a clear error", "[parallel]") {
  SelfCommunicator comm;
  const auto params = uniform_params(6, 4);
  const std::vector<int> split = {3};
  std::vector<float> grads(24, 0.0f);
  GradientSync sync(comm, buckets_from_split(params, split), grads.data());
  REQUIRE_THROWS_AS(sync.on_grads_ready(0, 1), DistError);  // before begin_step
  REQUIRE_THROWS_AS(sync.wait_all(), DistError);
  sync.begin_step(0);
  REQUIRE_THROWS_AS(sync.on_grads_ready(4, 7), DistError);  // past the end
  REQUIRE_THROWS_AS(sync.on_grads_ready(3, 3), DistError);  // empty
  REQUIRE_THROWS_AS(sync.wait_bucket(2), DistError);
  sync.on_grads_ready(3, 6);
  REQUIRE_THROWS_AS(sync.on_grads_ready(5, 6), DistError);  // reported twice
  REQUIRE_THROWS_AS(sync.begin_step(1), DistError);         // step 0 not finished
  try {
    sync.wait_all();  // parameters 0..2 never reported
    FAIL("wait_all returned");
  } catch (const DistError& e) {
    const std::string what = e.what();
    CAPTURE(what);
    REQUIRE(what.find("bucket 0 [0, 3) has 3 gradient(s) never reported") != std::string::npos);
  }
  sync.on_grads_ready(0, 3);
  sync.wait_all();
  sync.begin_step(1);

  REQUIRE_THROWS_AS(GradientSync(comm, {}, grads.data()), DistError);
  REQUIRE_THROWS_AS(GradientSync(comm, buckets_from_split(params, split), nullptr), DistError);
  auto gap = buckets_from_split(params, split);
  gap.erase(gap.begin());
  REQUIRE_THROWS_AS(GradientSync(comm, gap, grads.data()), DistError);
}

TEST_CASE("watchdog fires once for a collective that outlives the timeout, never for one that ends", "[parallel]") {
  std::vector<std::string> messages;
  std::mutex m;
  std::atomic<int> fired{0};
  Watchdog dog(4, 0.2, [&](const std::string& msg) {
    std::lock_guard lock(m);
    messages.push_back(msg);
    ++fired;
  });
  {
    auto quick = dog.watch("allreduce of bucket 0 (step 1)");
    std::this_thread::sleep_for(50ms);
  }
  const auto start = std::chrono::steady_clock::now();
  {
    auto stuck = dog.watch("allreduce of bucket 2 (step 7)");
    while (fired.load() == 0 && std::chrono::steady_clock::now() - start < 5s) std::this_thread::sleep_for(5ms);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CAPTURE(waited);
    REQUIRE(waited >= 0.2);
    REQUIRE(waited < 2.0);
    std::this_thread::sleep_for(400ms);  // no second report for the same operation
  }
  std::lock_guard lock(m);
  REQUIRE(messages.size() == 1);
  REQUIRE(messages[0] == "rank 4: allreduce of bucket 2 (step 7) has not completed after 0.2 s: a peer rank is lost");
  REQUIRE(timeout_message(1, "allreduce of bucket 3 (step 12)", 30.0) ==
          "rank 1: allreduce of bucket 3 (step 12) has not completed after 30 s: a peer rank is lost");
  REQUIRE_THROWS_AS(Watchdog(0, 0.0, [](const std::string&) {}), DistError);
  REQUIRE_THROWS_AS(Watchdog(0, -1.0, [](const std::string&) {}), DistError);
}

TEST_CASE("fingerprints tell equal buffers from different ones", "[parallel]") {
  std::vector<float> a(1000, 0.5f), b(a);
  REQUIRE(fingerprint(a.data(), a.size()) == fingerprint(b.data(), b.size()));
  b[999] = std::nextafter(b[999], 1.0f);
  REQUIRE(fingerprint(a.data(), a.size()) != fingerprint(b.data(), b.size()));
  SelfCommunicator self;
  REQUIRE(identical_across_ranks(self, a.data(), a.size()));
  REQUIRE(self.allgather(std::int64_t{42}) == std::vector<std::int64_t>{42});
  REQUIRE_THROWS_AS(self.broadcast(a.data(), a.size(), 1), DistError);
}
