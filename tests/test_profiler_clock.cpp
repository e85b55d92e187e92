// Clock alignment math (ping-pong offset, linear drift) and the tick -> nanosecond conversion.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "profiler/record/clock.hpp"
#include "profiler/record/clock_sync.hpp"

using namespace wb::profiler;
using Catch::Matchers::WithinAbs;

TEST_CASE("best_offset takes the sample with the smallest round trip", "[profiler]") {
  // The remote clock runs 5,000 ns ahead. Sample i is delayed asymmetrically, which biases its
  // midpoint estimate; only the tightest exchange (rtt 200, symmetric) gives the exact offset.
  const std::int64_t true_offset = 5000;
  std::vector<ClockSample> samples;
  auto exchange = [&](std::int64_t t0, std::int64_t out, std::int64_t back) {
    samples.push_back({t0, t0 + out + true_offset, t0 + out + back});
  };
  exchange(1'000'000, 900, 100);   // rtt 1000, estimate off by +400
  exchange(2'000'000, 100, 100);   // rtt 200, exact
  exchange(3'000'000, 50, 700);    // rtt 750, estimate off by -325
  exchange(4'000'000, 2000, 2000); // rtt 4000, symmetric but slow
  ClockSync sync = best_offset(samples);
  CHECK(sync.offset_ns == true_offset);
  CHECK(sync.rtt_ns == 200);
  CHECK(sync.local_ns == 2'000'100);
  CHECK(sync.samples == 4);

  // The estimate's error is bounded by rtt/2 whatever the asymmetry.
  ClockSync skewed = best_offset(std::vector<ClockSample>{{0, 900 + true_offset, 1000}});
  CHECK(skewed.offset_ns - true_offset == 400);
  CHECK(std::abs(skewed.offset_ns - true_offset) <= skewed.rtt_ns / 2);
}

TEST_CASE("best_offset rejects empty and impossible samples", "[profiler]") {
  REQUIRE_THROWS_AS(best_offset(std::vector<ClockSample>{}), ClockSyncError);
  REQUIRE_THROWS_AS(best_offset(std::vector<ClockSample>{{100, 50, 90}}), ClockSyncError);
  REQUIRE_THROWS_AS(estimate_offset([] { return std::int64_t{0}; }, 0), ClockSyncError);
}

TEST_CASE("estimate_offset recovers a simulated remote clock within rtt/2", "[profiler]") {
  // The "remote" clock is this process's clock shifted by -3.2 ms; each ping waits a random, asymmetric
  // time before and after reading it.
  const std::int64_t true_offset = -3'200'000;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> spin(0, 2000);
  auto busy = [](int n) {
    volatile int x = 0;
    for (int i = 0; i < n; ++i) x = x + i;
  };
  ClockSync sync = estimate_offset(
      [&] {
        busy(spin(rng));
        std::int64_t remote = now_ns() + true_offset;
        busy(spin(rng));
        return remote;
      },
      50);
  CAPTURE(sync.offset_ns, sync.rtt_ns);
  CHECK(sync.samples == 50);
  CHECK(std::abs(sync.offset_ns - true_offset) <= sync.rtt_ns / 2 + 1);
}

TEST_CASE("ClockMap corrects drift linearly between the start and end measurements", "[profiler]") {
  // Offset 100 ns at t=1 s, 1100 ns at t=11 s: 100 ns of drift per second.
  ClockMap map(1'000'000'000, 100, 11'000'000'000, 1100);
  CHECK(map.to_rank0(1'000'000'000) == 1'000'000'100);
  CHECK(map.to_rank0(11'000'000'000) == 11'000'001'100);
  CHECK(map.to_rank0(6'000'000'000) == 6'000'000'600);
  CHECK(map.to_rank0(16'000'000'000) == 16'000'001'600);  // extrapolated past the end
  CHECK(map.to_rank0(0) == 0);                             // and before the start: 100 - 100
  CHECK_THAT(map.drift_ns_per_s(), WithinAbs(100.0, 1e-9));

  // Against a double-precision reference at arbitrary points, including huge offsets.
  ClockMap big(123'456'789'012, -987'654'321, 3'723'456'789'012, -987'123'456);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    std::int64_t t = static_cast<std::int64_t>(rng() % 4'000'000'000'000ULL);
    long double frac = static_cast<long double>(t - 123'456'789'012) / (3'723'456'789'012.0L - 123'456'789'012.0L);
    long double want = t + (-987'654'321.0L) + frac * (-987'123'456.0L + 987'654'321.0L);
    CAPTURE(t);
    CHECK_THAT(static_cast<double>(big.to_rank0(t)), WithinAbs(static_cast<double>(want), 1.0));
  }

  ClockMap single(ClockSync{250, 40, 5'000, 8});  // one measurement: a constant shift
  CHECK(single.to_rank0(0) == 250);
  CHECK(single.to_rank0(1'000'000'000'000) == 1'000'000'000'250);
  CHECK(ClockMap{}.to_rank0(42) == 42);  // single-process runs: offset 0

  REQUIRE_THROWS_AS(ClockMap(10, 0, 5, 0), ClockSyncError);
}

TEST_CASE("TickClock converts ticks to the CLOCK_MONOTONIC nanoseconds of now_ns()", "[profiler]") {
  TickClock clock;
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    clock.refresh();
    std::int64_t before = now_ns();
    std::int64_t ticks = now_ticks();
    std::int64_t after = now_ns();
    std::int64_t converted = clock.to_ns(ticks);
    CAPTURE(round, before, converted, after, clock.uses_tsc());
    // Within the pairing error (a few hundred ns covers a preempted calibration read on a busy VM).
    CHECK(converted >= before - 2000);
    CHECK(converted <= after + 2000);
  }
}

TEST_CASE("TickClock maps a tick to the same nanosecond before and after a refresh", "[profiler]") {
  TickClock clock;
  std::vector<std::int64_t> ticks;
  for (int i = 0; i < 200; ++i) {
    ticks.push_back(now_ticks());
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  std::vector<std::int64_t> first;
  for (std::int64_t t : ticks) first.push_back(clock.to_ns(t));
  for (int r = 0; r < 3; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    clock.refresh();
  }
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    CAPTURE(i);
    CHECK(clock.to_ns(ticks[i]) == first[i]);
    if (i > 0) CHECK(first[i] >= first[i - 1]);  // monotone in ticks
  }
  // New ticks, converted after the refreshes, still come after the old ones.
  CHECK(clock.to_ns(now_ticks()) >= first.back());
}
