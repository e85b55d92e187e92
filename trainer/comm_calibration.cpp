#include "trainer/comm_calibration.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <thread>

#include "trainer/parallel/clock.hpp"

namespace wb::trainer {

namespace {

using store::CommCalibrationRow;

std::int64_t median_of(std::vector<std::int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

CommCalibrationRow row_of(int rank, const char* kind, std::int64_t bytes, const std::vector<std::int64_t>& ns) {
  return CommCalibrationRow{rank, kind, bytes, static_cast<std::int32_t>(ns.size()), median_of(ns),
                            ns.empty() ? 0 : *std::min_element(ns.begin(), ns.end())};
}

// The same number on every rank: the largest any rank proposes (ranks must agree on how many collectives
// they issue).
std::int64_t agree_max(parallel::Communicator& comm, std::int64_t mine) {
  const auto all = comm.allgather(mine);
  return *std::max_element(all.begin(), all.end());
}

// Message sizes: x4 from 4 KiB to 1 MiB, x2 above (where a transport's cost can jump several-fold between
// two sizes: a 2-rank job here took 6.5 ms for 16 MiB and 483 ms for 64 MiB), below max_bytes; then
// max_bytes itself.
std::vector<std::int64_t> message_sizes(std::int64_t max_bytes) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t s = 4096; s < max_bytes; s *= s < (1 << 20) ? 4 : 2) sizes.push_back(s);
  sizes.push_back(std::max<std::int64_t>(max_bytes, 4));
  return sizes;
}

// The calibration convolution: a 3x3, 64 -> 64 channel layer, forward and both backwards, as a backward
// pass runs them.
struct ConvLoad {
  backend::Backend& be;
  backend::Tensor x, w, y, dx, dw;
  backend::Conv2dParams p{1, 1};

  ConvLoad(backend::Backend& b, int batch, int image) : be(b) {
    const backend::Shape xs{batch, 64, image, image};
    x = be.empty(xs, backend::DType::f32);
    w = be.empty(backend::Shape{64, 64, 3, 3}, backend::DType::f32);
    y = be.empty(xs, backend::DType::f32);
    dx = be.empty(xs, backend::DType::f32);
    dw = be.empty(backend::Shape{64, 64, 3, 3}, backend::DType::f32);
    be.fill(x, 0.5f);
    be.fill(w, 0.01f);
    be.synchronize();
  }
  std::int64_t run_once() {
    const std::int64_t t0 = parallel::now_ns();
    be.conv2d_forward(x, w, y, p);
    be.conv2d_backward_data(y, w, dx, x.shape(), p);
    be.conv2d_backward_weights(x, y, dw, p);
    be.synchronize();
    return parallel::now_ns() - t0;
  }
};

// Allreduce of `bytes`, alone, `reps` times, each after a barrier.
std::vector<std::int64_t> time_allreduce(parallel::Communicator& comm, float* buf, std::int64_t bytes, int reps) {
  std::vector<std::int64_t> ns;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    const std::int64_t t0 = parallel::now_ns();
    comm.allreduce(buf, static_cast<std::size_t>(bytes / 4), parallel::ReduceOp::sum);
    ns.push_back(parallel::now_ns() - t0);
  }
  return ns;
}

// A second thread plays GradientSync's communication thread: it sleeps until this one, between two
// convolutions, marks a bucket of `bytes` ready, then allreduces it. `count` buckets, one per convolution.
// comm_ns: from a bucket's ready mark (or the previous collective's end, if later) to its collective's
// end: the wake-up, the contention and the collective. compute_ns: the convolutions until the last ends.
void time_together(parallel::Communicator& comm, float* buf, std::int64_t bytes, int count, ConvLoad& conv,
                   std::vector<std::int64_t>& comm_ns, std::vector<std::int64_t>& compute_ns) {
  comm.barrier();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::int64_t> marked;  // ready marks, guarded by mu
  std::atomic<bool> done{false};
  std::exception_ptr failure;
  std::thread t([&] {
    try {
      std::int64_t prev_end = 0;
      for (int i = 0; i < count; ++i) {
        std::int64_t mark;
        {
          std::unique_lock lk(mu);
          cv.wait(lk, [&] { return static_cast<int>(marked.size()) > i; });
          mark = marked[static_cast<std::size_t>(i)];
        }
        comm.allreduce(buf, static_cast<std::size_t>(bytes / 4), parallel::ReduceOp::sum);
        const std::int64_t end = parallel::now_ns();
        comm_ns.push_back(end - std::max(mark, prev_end));
        prev_end = end;
      }
    } catch (...) {
      failure = std::current_exception();
    }
    done = true;
  });
  for (int i = 0; i < count || !done.load(); ++i) {
    compute_ns.push_back(conv.run_once());
    if (i < count) {
      std::lock_guard lk(mu);
      marked.push_back(parallel::now_ns());
      cv.notify_one();
    }
  }
  t.join();
  if (failure) std::rethrow_exception(failure);
}

// Compute while this rank's communication thread waits in a collective for ranks that join it one
// convolution later, as a rank that joins a bucket first waits in backward (MPI polls while it waits).
// Ranks of one parity wait (their collective starts at once, on a second thread, while they time a
// convolution); the others join after a convolution of their own. `waiting_even` picks the parity.
std::vector<std::int64_t> time_waiting(parallel::Communicator& comm, float* buf, ConvLoad& conv, bool waiting_even, int reps) {
  const bool waiting = (comm.rank() % 2 == 0) == waiting_even;
  std::vector<std::int64_t> ns;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    if (!waiting) {
      conv.run_once();
      comm.allreduce(buf, 1024, parallel::ReduceOp::sum);
      continue;
    }
    std::exception_ptr failure;
    std::thread t([&] {
      try {
        comm.allreduce(buf, 1024, parallel::ReduceOp::sum);
      } catch (...) {
        failure = std::current_exception();
      }
    });
    ns.push_back(conv.run_once());
    t.join();
    if (failure) std::rethrow_exception(failure);
  }
  return ns;
}

}  // namespace

std::vector<CommCalibrationRow> calibrate_comm(parallel::Communicator& comm, backend::Backend& be,
                                               const CalibrationOptions& o) {
  const int rank = comm.rank();
  const std::vector<std::int64_t> sizes = message_sizes(o.max_bytes);
  backend::Tensor buffer = be.empty(backend::Shape{std::max<std::int64_t>(sizes.back() / 4, 1)}, backend::DType::f32);
  be.fill(buffer, 0.0f);
  be.synchronize();
  float* buf = buffer.data_as<float>();
  std::vector<CommCalibrationRow> rows;
  const std::int64_t start = parallel::now_ns();
  const auto budget_ns = static_cast<std::int64_t>(o.budget_s * 1e9);

  // The collective alone, per size; the largest sizes get fewer repetitions, and sizes past the budget
  // none (every rank stops at the same size: the decision takes the slowest rank's clock).
  time_allreduce(comm, buf, sizes.front(), 2);  // the first collective sets up connections
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (agree_max(comm, parallel::now_ns() - start) > budget_ns / 2 && i + 1 < sizes.size()) continue;
    const int reps = sizes[i] <= (1 << 20) ? 7 : sizes[i] <= (16 << 20) ? 5 : 3;
    auto ns = time_allreduce(comm, buf, sizes[i], reps);
    rows.push_back(row_of(rank, "allreduce", sizes[i], ns));
  }

  // The convolution alone, then together with back-to-back allreduces of a bucket-sized message.
  ConvLoad conv(be, o.batch, o.image);
  conv.run_once();  // primitives created, memory touched
  std::vector<std::int64_t> compute;
  comm.barrier();
  for (int i = 0; i < 9; ++i) compute.push_back(conv.run_once());
  rows.push_back(row_of(rank, "compute", 0, compute));

  // Buckets of 4 KiB, 64 KiB, 1 MiB and 16 MiB (those up to the largest message) and of the largest message
  // itself, so that the split model never extrapolates a bucket's cost while computing: each marked ready
  // between two convolutions as backward marks them; 8 of each, 3 of a bucket over 16 MiB.
  std::vector<std::int64_t> buckets;
  for (std::int64_t b : {std::int64_t{4096}, std::int64_t{65536}, std::int64_t{1} << 20, std::int64_t{16} << 20})
    if (b < sizes.back()) buckets.push_back(b);
  buckets.push_back(sizes.back());
  for (std::int64_t b : buckets) {
    std::vector<std::int64_t> comm_ns, compute_ns;
    time_together(comm, buf, b, b > (16 << 20) ? 3 : 8, conv, comm_ns, compute_ns);
    rows.push_back(row_of(rank, "compute_during_allreduce", b, compute_ns));
    rows.push_back(row_of(rank, "allreduce_during_compute", b, comm_ns));
  }
  // Every rank waits in turn (with one rank, nobody is late: the row measures the collective's own cost).
  std::vector<std::int64_t> waiting_ns;
  for (bool even : {true, false}) {
    auto ns = time_waiting(comm, buf, conv, even, 5);
    waiting_ns.insert(waiting_ns.end(), ns.begin(), ns.end());
  }
  rows.push_back(row_of(rank, "compute_while_waiting", 4096, waiting_ns));
  comm.barrier();
  return rows;
}

std::string describe_calibration(const std::vector<CommCalibrationRow>& rows) {
  auto bytes = [](std::int64_t b) {
    char buf[32];
    if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(b) / (1 << 20));
    else std::snprintf(buf, sizeof buf, "%.0f KiB", static_cast<double>(b) / 1024);
    return std::string(buf);
  };
  auto time = [](std::int64_t ns) {
    char buf[32];
    if (ns >= 1'000'000) std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) * 1e-6);
    else std::snprintf(buf, sizeof buf, "%.0f us", static_cast<double>(ns) * 1e-3);
    return std::string(buf);
  };
  std::string sizes, during;
  std::int64_t compute = 0, waiting = 0;
  std::map<std::int64_t, std::int64_t> slowed;
  for (const auto& r : rows) {
    if (r.kind == "allreduce") sizes += (sizes.empty() ? "" : ", ") + bytes(r.bytes) + " " + time(r.median_ns);
    if (r.kind == "allreduce_during_compute")
      during += (during.empty() ? "" : ", ") + bytes(r.bytes) + " " + time(r.median_ns);
    if (r.kind == "compute") compute = r.median_ns;
    if (r.kind == "compute_during_allreduce") slowed[r.bytes] = r.median_ns;
    if (r.kind == "compute_while_waiting") waiting = r.median_ns;
  }
  std::string tail = "; while computing: " + during + "; compute x";
  for (const auto& [b, ns] : slowed) {
    char f[48];
    std::snprintf(f, sizeof f, "%s%.2f (%s)", b == slowed.begin()->first ? "" : ", x",
                  compute > 0 ? static_cast<double>(ns) / static_cast<double>(compute) : 0.0, bytes(b).c_str());
    tail += f;
  }
  if (waiting > 0 && compute > 0) {
    char f[64];
    std::snprintf(f, sizeof f, "; compute x%.2f while waiting for a late rank",
                  static_cast<double>(waiting) / static_cast<double>(compute));
    tail += f;
  }
  return "allreduce " + sizes + tail;
}

}  // namespace wb::trainer
