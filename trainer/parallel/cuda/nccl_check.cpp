// The device half of wb-parallel-check (CUDA builds): NCCL allreduce sum/mean and broadcast on device
// buffers, each compared with the value computed on the host in double, and GradientSync over NCCL.
// Then the ordering training relies on: with an input stream (set_input_stream), a collective must
// wait for the work queued there before it, whether marked for its buffer (mark_ready, as GradientSync's
// bucket-ready hook does in wb-train) or not. The checks queue, on the input stream, a host callback
// that sleeps and then the copy that writes the buffer; a collective that did not wait would reduce
// the zeros that were there before, and the result would be wrong. Last, the NCCL rank groups of
// SyncBatchNorm and the sharded classifier, alone and in turn with GradientSync's buckets.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "trainer/parallel/cuda/nccl_communicator.hpp"
#include "trainer/parallel/gradient_sync.hpp"
#include "trainer/parallel/group_comm.hpp"
#include "trainer/parallel/launch.hpp"

namespace wb::parallel {

namespace {

float value_of(int rank, std::size_t i) {
  return static_cast<float>(std::cos(0.21 * static_cast<double>(i) + 0.7 * rank) * (1.0 + 0.5 * rank));
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

int report(int rank, bool ok, const char* check, double figure) {
  std::printf("rank %d: %s%s %s rel_l2=%.3g\n", rank, ok ? "" : "FAIL ", check, ok ? "ok" : "failed", figure);
  std::fflush(stdout);
  return ok ? 0 : 1;
}

// A stream callback that holds the stream for a while (CUDA host functions must not call CUDA).
void CUDART_CB hold_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<const int*>(ms)));
}

const int kHoldMs = 150;

// Rank groups on NCCL (SyncBatchNorm's and the sharded classifier's): each collective against the
// values computed here in double; then, ordered by a GradientSync over the job's NCCL communicator,
// group allreduces asked for between the buckets' gradients, as wb-train's training thread does.
int check_nccl_groups(MpiCommunicator& mpi, NcclCommunicator& nccl) {
  const int rank = mpi.rank(), size = mpi.size();
  int failures = 0;
  auto group = make_group_comm(mpi, GroupScope::global, &nccl);
  const std::size_t n = 1000;
  std::vector<double> values(n), sum(n, 0.0), max(n, -1e300);
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += value_of(r, i);
      max[i] = std::max(max[i], static_cast<double>(value_of(r, i)));
    }
  }
  auto worst = [](const std::vector<double>& a, const std::vector<double>& b) {
    double w = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(a[i] - b[i]));
    return w;
  };
  for (std::size_t i = 0; i < n; ++i) values[i] = value_of(rank, i);
  group->allreduce_sum(std::span<double>(values));
  const double e_sum = worst(values, sum);
  failures += report(rank, group->size() == size && e_sum <= 1e-12, "nccl-group-sum", e_sum);
  for (std::size_t i = 0; i < n; ++i) values[i] = value_of(rank, i);
  group->allreduce_max(std::span<double>(values));
  const double e_max = worst(values, max);
  failures += report(rank, e_max == 0.0, "nccl-group-max", e_max);

  std::vector<float> mine(n), all(n * static_cast<std::size_t>(size)), back(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = value_of(rank, i);
  group->allgather(mine, all);
  double e_gather = 0.0;
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      e_gather = std::max(e_gather, std::abs(static_cast<double>(all[r * n + i]) - value_of(r, i)));
    }
  }
  failures += report(rank, e_gather == 0.0, "nccl-group-allgather", e_gather);
  // Every rank gives `all`; block r of the sum is size * (block r of the gathered values).
  group->reduce_scatter_sum(all, back);
  double e_scatter = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    e_scatter = std::max(e_scatter, std::abs(static_cast<double>(back[i]) - size * static_cast<double>(mine[i])));
  }
  failures += report(rank, e_scatter <= 1e-5, "nccl-group-reduce-scatter", e_scatter);

  // The check runs every rank on one host, so the host's group is the whole job.
  auto local = make_group_comm(mpi, GroupScope::local, &nccl);
  failures += report(rank, local->size() == size, "nccl-group-local", static_cast<double>(local->size()));

  // Ordered among the buckets: A, bucket 2, B, C, bucket 1, bucket 0, D (as the MPI check), each a
  // group allreduce whose sum is checked; a wrong order would hang (the watchdog ends it) or mix sums.
  const std::size_t m = 1 << 16;
  float* grads = nullptr;
  WB_CUDA_CHECK(cudaMalloc(&grads, 30 * m * sizeof(float)));
  WB_CUDA_CHECK(cudaMemset(grads, 0, 30 * m * sizeof(float)));
  std::vector<ParamExtent> params;
  for (int p = 0; p < 30; ++p) params.push_back({static_cast<std::int64_t>(p * m), static_cast<std::int64_t>(m)});
  const std::vector<int> split = {10, 22};
  bool sums_ok = true;
  {
    SyncOptions so;
    so.watchdog_timeout_s = 60;
    GradientSync sync(nccl, buckets_from_split(params, split), grads, so);
    group->order_with(&sync);
    auto exchange = [&](int k) {
      std::vector<double> v(7, static_cast<double>(rank + k));
      group->allreduce_sum(std::span<double>(v));
      for (double x : v) sums_ok = sums_ok && x == static_cast<double>(size * (size - 1) / 2 + size * k);
    };
    for (int step = 0; step < 3; ++step) {
      sync.begin_step(step);
      exchange(1);
      sync.on_grads_ready(22, 30);
      exchange(2);
      sync.on_grads_ready(16, 22);
      exchange(3);
      sync.on_grads_ready(10, 16);
      sync.on_grads_ready(0, 10);
      exchange(4);
      sync.wait_all();
    }
    group->order_with(nullptr);
  }
  cudaFree(grads);
  failures += report(rank, sums_ok, "nccl-group-ordered", sums_ok ? 0.0 : 1.0);
  return failures;
}

}  // namespace

namespace {

// The buffers every device check uses: n values on the device, their host copy, and what each rank's
// upload sums and averages to over the job.
struct DeviceBuffers {
  NcclCommunicator& nccl;
  int rank, size;
  std::size_t n;
  float* dev = nullptr;
  std::vector<float> host;
  std::vector<double> sum, mean;
  std::vector<ParamExtent> params;  // 4 equal parameters
  std::vector<int> split = {1, 3};  // -> 3 buckets

  DeviceBuffers(NcclCommunicator& c, int r, int s, std::size_t count) : nccl(c), rank(r), size(s), n(count), host(n), sum(n, 0.0) {
    for (int k = 0; k < size; ++k) {
      for (std::size_t i = 0; i < n; ++i) sum[i] += value_of(k, i);
    }
    mean = sum;
    for (auto& m : mean) m /= size;
    for (int p = 0; p < 4; ++p) params.push_back({static_cast<std::int64_t>(p * n / 4), static_cast<std::int64_t>(n / 4)});
  }
  void upload(int r) {
    for (std::size_t i = 0; i < n; ++i) host[i] = value_of(r, i);
    cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  }
  void download() { cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost); }
};

// Allreduce sum and mean, broadcast, and GradientSync over NCCL against host double references.
int check_collectives(DeviceBuffers& b) {
  int failures = 0;
  b.upload(b.rank);
  b.nccl.allreduce(b.dev, b.n, ReduceOp::sum);
  b.download();
  const double e_sum = rel_l2(b.host, b.sum);
  failures += report(b.rank, e_sum <= 1e-6, "nccl-allreduce-sum", e_sum);

  b.upload(b.rank);
  b.nccl.allreduce(b.dev, b.n, ReduceOp::mean);
  b.download();
  const double e_mean = rel_l2(b.host, b.mean);
  failures += report(b.rank, e_mean <= 1e-6, "nccl-allreduce-mean", e_mean);

  b.upload(b.rank);
  b.nccl.broadcast(b.dev, b.n, 0);
  b.download();
  std::vector<double> root(b.n);
  for (std::size_t i = 0; i < b.n; ++i) root[i] = value_of(0, i);
  const double e_bcast = rel_l2(b.host, root);
  failures += report(b.rank, e_bcast == 0.0, "nccl-broadcast", e_bcast);

  b.upload(b.rank);
  {
    GradientSync sync(b.nccl, buckets_from_split(b.params, b.split), b.dev);
    sync.begin_step(0);
    for (int p = 4; p > 0; --p) sync.on_grads_ready(p - 1, p);
    sync.wait_all();
  }
  b.download();
  const double e_sync = rel_l2(b.host, b.mean);
  failures += report(b.rank, e_sync <= 1e-6, "nccl-sync-average", e_sync);
  return failures;
}

// Collectives wait for writes queued on the input stream (after a pause), whether the buffer was marked
// ready or not, and GradientSync with wb-train's bucket-ready hook sees every bucket's final gradients.
int check_ordering(DeviceBuffers& b) {
  cudaStream_t input = nullptr;
  float* pinned = nullptr;  // the copy source: page-locked, so the copy is asynchronous
  if (cudaStreamCreateWithFlags(&input, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMallocHost(&pinned, b.n * sizeof(float)) != cudaSuccess) {
    std::printf("rank %d: FAIL nccl-ordered: cudaStreamCreate / cudaMallocHost\n", b.rank);
    return 1;
  }
  int failures = 0;
  for (std::size_t i = 0; i < b.n; ++i) pinned[i] = value_of(b.rank, i);
  b.nccl.set_input_stream(input);
  // Queues, on the input stream, a pause and then the copy of `count` values at `offset` into dev.
  const auto queue_write = [&](std::size_t offset, std::size_t count) {
    WB_CUDA_CHECK(cudaLaunchHostFunc(input, hold_stream, const_cast<int*>(&kHoldMs)));
    WB_CUDA_CHECK(cudaMemcpyAsync(b.dev + offset, pinned + offset, count * sizeof(float), cudaMemcpyHostToDevice, input));
  };
  const auto zero = [&] {
    WB_CUDA_CHECK(cudaMemset(b.dev, 0, b.n * sizeof(float)));
    WB_CUDA_CHECK(cudaDeviceSynchronize());
  };

  // Marked: the event mark_ready recorded for this buffer.
  zero();
  queue_write(0, b.n);
  b.nccl.mark_ready(b.dev);
  b.nccl.allreduce(b.dev, b.n, ReduceOp::sum);
  b.download();
  const double e_marked = rel_l2(b.host, b.sum);
  failures += report(b.rank, e_marked <= 1e-6, "nccl-ordered-marked", e_marked);

  // Unmarked: an event recorded on the input stream when the collective is called.
  zero();
  queue_write(0, b.n);
  b.nccl.allreduce(b.dev, b.n, ReduceOp::sum);
  b.download();
  const double e_unmarked = rel_l2(b.host, b.sum);
  failures += report(b.rank, e_unmarked <= 1e-6, "nccl-ordered-unmarked", e_unmarked);

  // GradientSync with the bucket-ready hook of wb-train: each parameter's gradient is written on the
  // input stream after a pause, reported ready right after it was queued (not run), and the hook marks
  // the input stream for the bucket; every bucket's allreduce must see its final gradients.
  zero();
  {
    SyncOptions so;
    NcclCommunicator& nccl = b.nccl;
    so.on_ready = [&nccl](const Bucket&, float* data) { nccl.mark_ready(data); };
    GradientSync sync(b.nccl, buckets_from_split(b.params, b.split), b.dev, so);
    sync.begin_step(0);
    for (int p = 4; p > 0; --p) {
      const auto& extent = b.params[static_cast<std::size_t>(p - 1)];
      queue_write(static_cast<std::size_t>(extent.offset), static_cast<std::size_t>(extent.numel));
      sync.on_grads_ready(p - 1, p);
    }
    sync.wait_all();
  }
  b.download();
  const double e_sync_ordered = rel_l2(b.host, b.mean);
  failures += report(b.rank, e_sync_ordered <= 1e-6, "nccl-sync-ordered", e_sync_ordered);

  b.nccl.set_input_stream(nullptr);
  WB_CUDA_CHECK(cudaStreamSynchronize(input));
  cudaStreamDestroy(input);
  cudaFreeHost(pinned);
  return failures;
}

}  // namespace

int run_nccl_check(MpiCommunicator& mpi, const LaunchInfo& info) {
  const int rank = mpi.rank(), size = mpi.size();
  const int devices = ::wb::cuda::device_count();
  if (devices == 0) {
    std::printf("rank %d: FAIL nccl: no CUDA device\n", rank);
    return 1;
  }
  NcclCommunicator nccl(mpi, info.local_rank % devices);
  DeviceBuffers b(nccl, rank, size, std::size_t{1} << 20);
  if (cudaMalloc(&b.dev, b.n * sizeof(float)) != cudaSuccess) {
    std::printf("rank %d: FAIL nccl: cudaMalloc\n", rank);
    return 1;
  }
  int failures = check_collectives(b);
  failures += check_ordering(b);
  failures += check_nccl_groups(mpi, nccl);
  cudaFree(b.dev);
  nccl.barrier();
  return failures;
}

}  // namespace wb::parallel
