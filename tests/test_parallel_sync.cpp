// In one process: GradientSync's bookkeeping (bucket readiness, reduction order, spans, overlap with a
// simulated backward, misuse errors) over SelfCommunicator, the collective watchdog's timing and
// message, and the heartbeats that let it name a stopped or dead peer. The multi-rank behaviour is in
// test_parallel_mpi.cpp and, through wb-train, test_trainer_faults.cpp.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainer/parallel/clock.hpp"
#include "trainer/parallel/communicator.hpp"
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/heartbeat.hpp"
#include "trainer/parallel/watchdog.hpp"
#include "support/temp_dir.hpp"

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

TEST_CASE("watchdog: the message carries what the diagnosis says about the peers", "[parallel]") {
  std::atomic<int> fired{0};
  std::string message;
  std::mutex m;
  Watchdog dog(
      0, 0.1,
      [&](const std::string& msg) {
        std::lock_guard lock(m);
        message = msg;
        ++fired;
      },
      [] { return std::string("rank 3 stopped responding (last heartbeat 9.0 s ago, at step 2, computing)"); });
  {
    auto stuck = dog.watch("allreduce of bucket 1 (step 2)");
    const auto start = std::chrono::steady_clock::now();
    while (fired.load() == 0 && std::chrono::steady_clock::now() - start < 5s) std::this_thread::sleep_for(5ms);
  }
  std::lock_guard lock(m);
  REQUIRE(message == "rank 0: allreduce of bucket 1 (step 2) has not completed after 0.1 s: rank 3 stopped responding "
                     "(last heartbeat 9.0 s ago, at step 2, computing)");
}

namespace {

void write_beat(const std::filesystem::path& dir, int rank, double age_s, pid_t pid, const std::string& host) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const auto ns = static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec -
                  static_cast<std::int64_t>(age_s * 1e9);
  std::ofstream(heartbeat_file(dir, rank)) << "rank " << rank << " beat 12 unix_ns " << ns << " step 7 pid " << pid
                                           << " host " << host << " doing allreduce of bucket 2 (step 7)\n";
}

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

TEST_CASE("heartbeats: a live peer, a stopped one, a dead one and a missing one are told apart", "[parallel]") {
  wb::test::TempDir dir;
  Heartbeat zero(dir.path(), 0, 3, 0.05);
  zero.set_step(7);
  REQUIRE(zero.stale_s() == 2.0);
  {
    // Rank 1 beats for real; rank 2 has not written yet.
    Heartbeat one(dir.path(), 1, 3, 0.05);
    one.set_step(7);
    one.set_doing("allreduce of bucket 0 (step 7)");
    std::this_thread::sleep_for(200ms);
    const auto beat = read_heartbeat(heartbeat_file(dir.path(), 1));
    REQUIRE(beat);
    CHECK(beat->rank == 1);
    CHECK(beat->beat >= 2);  // the first beat at start, then one every 50 ms
    CHECK(beat->step == 7);
    CHECK(beat->pid == getpid());
    CHECK(beat->doing == "allreduce of bucket 0 (step 7)");
    const std::string d = zero.diagnose();
    CAPTURE(d);
    CHECK(d.find("rank 2 has no heartbeat in " + dir.path().string()) != std::string::npos);
    CHECK(d.find("rank 1") == std::string::npos);  // alive: not named
    write_beat(dir.path(), 2, 0.1, getpid(), host_name());
    CHECK(zero.diagnose() == "every peer still has a heartbeat (rank 1 at step 7, in allreduce of bucket 0 (step 7); "
                             "rank 2 at step 7, in allreduce of bucket 2 (step 7)): a peer is stuck elsewhere or its "
                             "network is lost");
  }
  // A clean end removes the file.
  CHECK_FALSE(std::filesystem::exists(heartbeat_file(dir.path(), 1)));

  // Rank 1's last beat is 9 s old, its process alive: stopped (SIGSTOP, a debugger, a lost node).
  write_beat(dir.path(), 1, 9.0, getpid(), host_name());
  // Rank 2's process on this host has exited: gone, however fresh its last beat.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  write_beat(dir.path(), 2, 0.1, child, host_name());
  const std::string d = zero.diagnose();
  CAPTURE(d);
  CHECK(d.rfind("rank 1 stopped responding (last heartbeat 9.", 0) == 0);
  CHECK(d.find(" s ago, at step 7, in allreduce of bucket 2 (step 7); pid " + std::to_string(getpid()) + " on " +
               host_name() + ")") != std::string::npos);
  CHECK(d.find("; rank 2 is gone (process " + std::to_string(child) + " exited; last heartbeat 0.1 s ago") !=
        std::string::npos);
  // On another host a pid says nothing: only the age counts.
  write_beat(dir.path(), 2, 0.1, child, "elsewhere");
  CHECK(zero.diagnose().find("rank 2") == std::string::npos);
  CHECK_FALSE(read_heartbeat(dir / "no-such.heartbeat"));
  CHECK(Heartbeat::interval_for(30.0) == 1.0);
  CHECK(Heartbeat::interval_for(6.0) == Approx(0.6));
  CHECK(Heartbeat::interval_for(0.1) == 0.05);
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
