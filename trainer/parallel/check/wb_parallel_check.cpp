// wb-parallel-check: the multi-rank self-check of the data-parallel layer, run under mpirun by the [mpi]
// tests (and by hand: `wb-parallel-check --nproc 2` relaunches itself under mpirun).
//
//   wb-parallel-check [--nproc N] [--watchdog-s S] [all|collectives|sync|order|clock|loop|nccl]
//
// Every rank prints "rank R pid P" first, then one "rank R: <check> ok ..." line per passed check with
// its figures, or "rank R: FAIL <check>: ..." (exit 1). `loop` allreduces buckets forever (the fault
// tests kill or stop a rank and watch the others stop). `nccl` runs the device checks (CUDA builds).

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "trainer/parallel/buckets.hpp"
#include "trainer/parallel/clock.hpp"
#include "trainer/parallel/error.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/launch.hpp"
#include "trainer/parallel/mpi_communicator.hpp"

#ifdef WB_PARALLEL_NCCL
namespace wb::parallel {
// cuda/nccl_check.cpp: 0 when every device check passed.
int run_nccl_check(MpiCommunicator& mpi, const LaunchInfo& info);
}  // namespace wb::parallel
#endif

namespace {

using namespace wb::parallel;

int g_failures = 0;

void report(int rank, bool ok, const std::string& check, const std::string& figures) {
  if (ok) {
    std::printf("rank %d: %s ok %s\n", rank, check.c_str(), figures.c_str());
  } else {
    std::printf("rank %d: FAIL %s: %s\n", rank, check.c_str(), figures.c_str());
    ++g_failures;
  }
  std::fflush(stdout);
}

// A rank-dependent value with no pattern shared between ranks or elements.
float value_of(int rank, std::size_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * rank) * (1.0 + 0.25 * rank));
}

// ||a - b|| / ||b|| in double.
double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

std::string fmt(const char* format, double a, double b = 0.0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, format, a, b);
  return buf;
}

void check_collectives(MpiCommunicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  const std::size_t n = 100003;  // odd size: no chunk/alignment luck
  std::vector<double> sum(n, 0.0);
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < n; ++i) sum[i] += value_of(r, i);
  }
  std::vector<double> mean(sum);
  for (auto& m : mean) m /= size;

  std::vector<float> data(n);
  for (std::size_t i = 0; i < n; ++i) data[i] = value_of(rank, i);
  comm.allreduce(data.data(), n, ReduceOp::sum);
  const double e_sum = rel_l2(data, sum);
  report(rank, e_sum <= 1e-6, "allreduce-sum", fmt("rel_l2=%.3g", e_sum));

  for (std::size_t i = 0; i < n; ++i) data[i] = value_of(rank, i);
  comm.allreduce(data.data(), n, ReduceOp::mean);
  const double e_mean = rel_l2(data, mean);
  report(rank, e_mean <= 1e-6 && identical_across_ranks(comm, data.data(), n), "allreduce-mean",
         fmt("rel_l2=%.3g", e_mean));

  const int root = size - 1;
  for (std::size_t i = 0; i < n; ++i) data[i] = value_of(rank, i);
  comm.broadcast(data.data(), n, root);
  bool bcast_ok = true;
  for (std::size_t i = 0; i < n; ++i) bcast_ok = bcast_ok && data[i] == value_of(root, i);
  report(rank, bcast_ok, "broadcast", fmt("root=%g", root));

  const std::int64_t mine[2] = {100 + rank, -7 * rank};
  const auto all = comm.allgather(std::span<const std::int64_t>(mine, 2));
  bool gather_ok = all.size() == static_cast<std::size_t>(2 * size);
  for (int r = 0; gather_ok && r < size; ++r) gather_ok = all[2 * r] == 100 + r && all[2 * r + 1] == -7 * r;
  report(rank, gather_ok, "allgather", fmt("values=%g", static_cast<double>(all.size())));

  comm.barrier();
  report(rank, true, "barrier", "");
}

// GradientSync on a simulated backward: 30 parameters of varied sizes, 3 buckets, backward walks
// parameter groups from last to first, sleeping as layers would, reporting each group's gradients.
void check_sync(MpiCommunicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<ParamExtent> params;
  std::int64_t offset = 0;
  for (int p = 0; p < 30; ++p) {
    const std::int64_t numel = 1000 + 3917 * ((p * 7) % 11);
    params.push_back({offset, numel});
    offset += numel;
  }
  const std::vector<int> split = {10, 22};
  const auto buckets = buckets_from_split(params, split);
  const auto total = static_cast<std::size_t>(offset);

  // Parameters start different on every rank; the broadcast from rank 0 makes them equal.
  std::vector<float> weights(total);
  for (std::size_t i = 0; i < total; ++i) weights[i] = value_of(rank + 10, i);
  comm.broadcast(weights.data(), total, 0);
  report(rank, identical_across_ranks(comm, weights.data(), total), "broadcast-parameters", "");

  std::vector<float> grads(total);
  GradientSync sync(comm, buckets, grads.data());
  int overlapped_steps = 0;
  double worst = 0.0;
  bool order_ok = true, identical = true;
  const int steps = 3;
  for (int step = 0; step < steps; ++step) {
    std::vector<double> expected(total, 0.0);
    for (int r = 0; r < size; ++r) {
      for (std::size_t i = 0; i < total; ++i) expected[i] += value_of(r + step, i) / size;
    }
    sync.begin_step(step);
    // Backward in groups of 3 parameters, last group first.
    for (int end = 30; end > 0; end -= 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(6));
      for (std::int64_t i = params[end - 3].offset; i < params[end - 1].offset + params[end - 1].numel; ++i) {
        grads[static_cast<std::size_t>(i)] = value_of(rank + step, static_cast<std::size_t>(i));
      }
      sync.on_grads_ready(end - 3, end);
    }
    const std::int64_t backward_end = now_ns();
    sync.wait_all();
    worst = std::max(worst, rel_l2(grads, expected));
    identical = identical && identical_across_ranks(comm, grads.data(), total);
    const auto spans = sync.spans();
    bool overlapped = false;
    order_ok = order_ok && spans.size() == 3;
    for (std::size_t k = 0; k < spans.size(); ++k) {
      const auto& s = spans[k];
      order_ok = order_ok && s.ready_ns > 0 && s.ready_ns <= s.start_ns && s.start_ns <= s.end_ns &&
                 s.bucket == 2 - static_cast<int>(k) && s.step == step && s.rank == rank;
      if (s.start_ns < backward_end) overlapped = true;
      std::printf("rank %d: span step=%d bucket=%d params=[%d,%d] bytes=%lld ready=%lld start=+%lld end=+%lld\n", rank,
                  s.step, s.bucket, s.first_param, s.last_param, static_cast<long long>(s.bytes),
                  static_cast<long long>(s.ready_ns), static_cast<long long>(s.start_ns - s.ready_ns),
                  static_cast<long long>(s.end_ns - s.ready_ns));
    }
    if (overlapped) ++overlapped_steps;
  }
  report(rank, worst <= 1e-6 && identical, "sync-average", fmt("rel_l2=%.3g", worst));
  report(rank, order_ok, "sync-spans", "");
  report(rank, overlapped_steps == steps, "sync-overlap", fmt("overlapped_steps=%g", overlapped_steps));
}

// GradientSync as a CollectiveOrder: exchanges asked for from the training thread (here: allreduces of 7
// values on the buckets' own communicator, which would mismatch a bucket's allreduce if any rank issued
// them out of turn) land among the buckets in the program's order, whatever the threads' timing. Each
// rank sleeps its own random amounts on both threads, and every rank must issue exactly
// A, bucket 2, B, C, bucket 1, bucket 0, D.
void check_order(MpiCommunicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<ParamExtent> params;
  std::int64_t offset = 0;
  for (int p = 0; p < 30; ++p) {
    params.push_back({offset, 500 + 100 * p});
    offset += 500 + 100 * p;
  }
  const std::vector<int> split = {10, 22};
  const auto buckets = buckets_from_split(params, split);
  std::vector<float> grads(static_cast<std::size_t>(offset), 1.0f);
  std::mt19937 random(static_cast<unsigned>(1234 + 77 * rank));
  std::mutex random_mutex;
  auto pause = [&] {
    int us = 0;
    {
      std::lock_guard lock(random_mutex);
      us = static_cast<int>(random() % 4000);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  };
  std::vector<std::string> log;  // written on the communication thread only
  SyncOptions options;
  options.on_span = [&](const BucketSpan& s) {
    log.push_back("bucket " + std::to_string(s.bucket));
    pause();
  };
  GradientSync sync(comm, buckets, grads.data(), options);
  bool sums_ok = true;
  auto exchange = [&](const std::string& name) {
    sync.run_in_order(name, [&] {
      log.push_back(name);
      std::vector<float> values(7, static_cast<float>(rank + 1));
      comm.allreduce(values.data(), values.size(), ReduceOp::sum);
      for (float v : values) sums_ok = sums_ok && v == static_cast<float>(size * (size + 1) / 2);
      pause();
    });
  };
  auto ready = [&](int first, int last) {
    pause();
    sync.on_grads_ready(first, last);
  };
  const std::vector<std::string> expected = {"A", "bucket 2", "B", "C", "bucket 1", "bucket 0", "D"};
  bool order_ok = true;
  std::string seen;
  const int steps = 5;
  for (int step = 0; step < steps; ++step) {
    log.clear();
    sync.begin_step(step);
    exchange("A");
    ready(22, 30);  // bucket 2
    exchange("B");
    ready(16, 22);  // half of bucket 1
    exchange("C");
    ready(10, 16);  // bucket 1
    ready(0, 10);   // bucket 0
    exchange("D");
    sync.wait_all();
    if (log != expected) {
      order_ok = false;
      seen.clear();
      for (const auto& e : log) seen += (seen.empty() ? "" : ", ") + e;
    }
  }
  // Outside a step it runs at once.
  exchange("E");
  report(rank, order_ok && sums_ok && log.back() == "E", "collective-order",
         order_ok ? fmt("steps=%g", steps) : "issued " + seen);
}

// Clock offsets with a known skew: rank r's clock runs r * 1.5 ms ahead of rank 0's.
void check_clock(MpiCommunicator& comm) {
  const int rank = comm.rank();
  const std::int64_t skew = 1'500'000LL * rank;
  const auto offsets = measure_clock_offsets(comm, 50, [skew] { return now_ns() + skew; });
  bool ok = offsets.size() == static_cast<std::size_t>(comm.size()) && offsets[0].offset_ns == 0;
  double worst = 0.0, worst_rtt = 0.0;
  for (int r = 1; ok && r < comm.size(); ++r) {
    const double err = std::abs(static_cast<double>(offsets[r].offset_ns - 1'500'000LL * r));
    worst = std::max(worst, err);
    worst_rtt = std::max(worst_rtt, static_cast<double>(offsets[r].round_trip_ns));
    // The midpoint estimate is off by at most half the round trip.
    ok = ok && offsets[r].round_trip_ns > 0 && err <= offsets[r].round_trip_ns / 2.0 + 1.0;
  }
  // Every rank received the same table.
  std::vector<std::int64_t> flat;
  for (const auto& o : offsets) flat.push_back(o.offset_ns);
  const auto all = comm.allgather(flat);
  for (std::size_t i = 0; ok && i < all.size(); ++i) ok = all[i] == flat[i % flat.size()];
  report(rank, ok, "clock-offsets", fmt("max_error_ns=%.0f min_rtt_ns=%.0f", worst, worst_rtt));
}

// Allreduces of 3 buckets forever; a fault test kills or stops one rank and watches the rest stop.
void run_loop(MpiCommunicator& comm, double watchdog_s) {
  std::vector<ParamExtent> params;
  for (int p = 0; p < 6; ++p) params.push_back({p * 50000LL, 50000});
  const std::vector<int> split = {2, 4};
  std::vector<float> grads(300000, 1.0f);
  SyncOptions options;
  options.watchdog_timeout_s = watchdog_s;
  GradientSync sync(comm, buckets_from_split(params, split), grads.data(), options);
  for (int step = 0;; ++step) {
    sync.begin_step(step);
    for (int p = 6; p > 0; --p) sync.on_grads_ready(p - 1, p);
    sync.wait_all();
    if (step == 10 && comm.rank() == 0) {
      std::printf("rank 0: loop running\n");
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int usage(const char* message) {
  std::fprintf(stderr, "wb-parallel-check: %s\nusage: wb-parallel-check [--nproc N] [--watchdog-s S] "
                       "[all|collectives|sync|order|clock|loop|nccl]\n", message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "all";
  int nproc = 0;
  double watchdog_s = kDefaultWatchdogSeconds;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc" && i + 1 < argc) {
      nproc = std::atoi(argv[++i]);
    } else if (a == "--watchdog-s" && i + 1 < argc) {
      watchdog_s = std::atof(argv[++i]);
    } else if (a == "all" || a == "collectives" || a == "sync" || a == "order" || a == "clock" || a == "loop" || a == "nccl") {
      mode = a;
    } else {
      return usage(("unknown argument '" + a + "'").c_str());
    }
  }
  try {
    if (nproc > 0) relaunch_under_mpirun(nproc, argc, argv);
    const LaunchInfo info = launch_info();
    MpiCommunicator comm;
    std::printf("rank %d pid %d world %d local_rank %d launcher %s\n", comm.rank(), static_cast<int>(getpid()),
                comm.size(), info.local_rank, info.launcher.c_str());
    std::fflush(stdout);
    if (info.world_size != comm.size() || info.rank != comm.rank()) {
      report(comm.rank(), false, "launch-info", "environment disagrees with MPI");
    }
    if (mode == "all" || mode == "collectives") check_collectives(comm);
    if (mode == "all" || mode == "sync") check_sync(comm);
    if (mode == "all" || mode == "order") check_order(comm);
    if (mode == "all" || mode == "clock") check_clock(comm);
    if (mode == "loop") run_loop(comm, watchdog_s);
    if (mode == "nccl") {
#ifdef WB_PARALLEL_NCCL
      g_failures += run_nccl_check(comm, info);
#else
      report(comm.rank(), false, "nccl", "this build has no NCCL communicator");
#endif
    }
    comm.barrier();
  } catch (const DistError& e) {
    std::fprintf(stderr, "wb-parallel-check: %s\n", e.what());
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
