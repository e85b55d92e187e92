// Training-step throughput of our CUDA backend against PyTorch on the same GPU, in one run, and the cost
// of profiling on the GPU. torchvision ResNet-50, 1000 classes, batch 256 at 224x224 by default,
// synthetic data already on the device, steady-state steps only. Three precisions: fp32 (TF32 off on
// both sides), tf32, and bf16 with channels-last (PyTorch: autocast bf16 + channels_last). Per
// precision, rounds alternate N of our steps and N of PyTorch's (a persistent child process,
// bench/gpu_vs_torch.py, driven over a pipe). The interpreter is $WB_TORCH_PYTHON, else the build's
// Python: on a GPU machine the PyTorch with CUDA is often not Debian's.
//
// Profiling overhead: our steps with the profiler on (Recorder + the model's op ranges + CUPTI kernel
// tracing, into a scratch run file) and off, alternated, in one precision (default bf16: the fastest
// step, where a fixed per-op cost weighs most).
//
// Memory: both sides stay alive during a precision's alternating rounds, on one GPU, so the batch must
// fit both. Before measuring, each side runs two steps alone at batches 32 and 64 in fp32 (the largest
// footprint), and the peak bytes each allocator held give a per-image cost and a fixed part; when the
// asked-for batch would not fit both sides in 90% of the device memory free at start, the largest
// multiple of 8 that does is used, and said. Between precisions every side frees everything (our model
// and its cache; PyTorch's model and empty_cache) before the next is built. Each side's peak allocator
// bytes are printed per precision (ours: the caching allocator's peak of live blocks; PyTorch:
// max_memory_allocated), next to the cached/reserved peak.
//
// Without the CUDA backend or without a device it prints one line saying so and exits 0 (a benchmark,
// not a test). The last line holds the ratios ours / PyTorch.
//
//   gpu_vs_torch [--batch 256] [--size 224] [--rounds 3] [--steps 20] [--warmup 5] [--no-fit]
//                [--precisions fp32,tf32,bf16] [--overhead-precision bf16] [--no-overhead]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/torch_child.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/model/resnet50.hpp"
#include "tests/support/peers.hpp"
#include "trainer/optim/sgd.hpp"
#if defined(WB_BACKEND_CUDA)
#include <cuda_runtime.h>

#include "profiler/record/recorder.hpp"
#include "trainer/backend/cuda/cuda_backend.hpp"
#include "store/writer.hpp"
#include "trainer/observers.hpp"
#if defined(WB_PROFILER_CUPTI)
#include "profiler/record/cuda/cupti_tracer.hpp"
#endif
#endif

namespace {

using Clock = std::chrono::steady_clock;
using wb::bench::median;

struct Options {
  int batch = 256, size = 224, rounds = 3, steps = 20, warmup = 5;
  std::vector<std::string> precisions = {"fp32", "tf32", "bf16"};
  std::string overhead_precision = "bf16";
  bool overhead = true;
  bool fit = true;  // lower the batch when both sides would not fit on the device
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto text = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("gpu_vs_torch: " + a + " needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string t = text();
      char* end = nullptr;
      const long v = std::strtol(t.c_str(), &end, 10);
      if (end == t.c_str() || *end != '\0' || v < 1 || v > 100000) {
        throw std::invalid_argument("gpu_vs_torch: " + a + ": expected a positive integer, got '" + t + "'");
      }
      return static_cast<int>(v);
    };
    if (a == "--batch") o.batch = number();
    else if (a == "--size") o.size = number();
    else if (a == "--rounds") o.rounds = number();
    else if (a == "--steps") o.steps = number();
    else if (a == "--warmup") o.warmup = number();
    else if (a == "--overhead-precision") o.overhead_precision = text();
    else if (a == "--no-overhead") o.overhead = false;
    else if (a == "--no-fit") o.fit = false;
    else if (a == "--precisions") {
      o.precisions.clear();
      std::stringstream ss(text());
      for (std::string p; std::getline(ss, p, ',');) o.precisions.push_back(p);
    } else {
      throw std::invalid_argument("gpu_vs_torch: unknown flag " + a + " (see the comment at the top of bench/gpu_vs_torch.cpp)");
    }
  }
  auto known = [](const std::string& p) { return p == "fp32" || p == "tf32" || p == "bf16"; };
  for (const auto& p : o.precisions) {
    if (!known(p)) throw std::invalid_argument("gpu_vs_torch: --precisions: expected fp32, tf32 or bf16, got '" + p + "'");
  }
  if (!known(o.overhead_precision)) {
    throw std::invalid_argument("gpu_vs_torch: --overhead-precision: expected fp32, tf32 or bf16, got '" +
                                o.overhead_precision + "'");
  }
  if (o.size < 32 || o.size > 224) throw std::invalid_argument("gpu_vs_torch: --size: expected 32..224");
  if (o.batch < 2) throw std::invalid_argument("gpu_vs_torch: --batch: expected at least 2");
  return o;
}

#if defined(WB_BACKEND_CUDA)

wb::backend::Precision precision_of(const std::string& p) {
  if (p == "tf32") return wb::backend::Precision::tf32;
  if (p == "bf16") return wb::backend::Precision::bf16;
  return wb::backend::Precision::fp32;
}

// Our side in one precision: backend, model, optimizer and a device-resident batch.
struct Ours {
  Ours(const Options& o, const std::string& precision, int batch) {
    wb::backend::CudaOptions co;
    co.device = 0;
    co.precision = precision_of(precision);
    co.channels_last = precision == "bf16";  // the PyTorch side runs bf16 channels_last too
    backend = wb::backend::make_cuda_backend(co);
    wb::model::ModelConfig cfg;
    cfg.num_classes = 1000;
    cfg.image_size = o.size;
    cfg.batch_size = batch;
    cfg.seed = 0;
    cfg.loss = {wb::backend::LossConvention::torch, 0.1f};
    model = std::make_unique<wb::model::ResNet50>(*backend, cfg);
    const std::int64_t n = batch, s = o.size;
    std::vector<float> host(static_cast<std::size_t>(n * 3 * s * s));
    std::vector<std::int32_t> host_labels(static_cast<std::size_t>(n));
    std::mt19937_64 gen(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : host) v = normal(gen);
    for (std::size_t i = 0; i < host_labels.size(); ++i) host_labels[i] = static_cast<std::int32_t>((i * 7) % 1000);
    images = backend->empty(wb::backend::Shape{n, 3, s, s}, wb::backend::DType::f32);
    labels = backend->empty(wb::backend::Shape{n}, wb::backend::DType::i32);
    backend->from_host(images, host);
    backend->from_host(labels, host_labels);
    backend->synchronize();
  }
  double run(int steps) {
    backend->synchronize();
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) {
      model->forward(images, labels);
      model->backward();
      sgd.step(*model, 0.01f);
    }
    backend->synchronize();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // Peak bytes of live blocks, and bytes obtained from cudaMalloc (the cache included).
  std::pair<std::int64_t, std::int64_t> memory() const {
    const auto m = dynamic_cast<wb::backend::cuda::CudaBackend&>(*backend).stats().memory;
    return {m.peak_in_use_bytes, m.in_use_bytes + m.cached_bytes};
  }

  std::unique_ptr<wb::backend::Backend> backend;
  std::unique_ptr<wb::model::ResNet50> model;
  wb::optim::Sgd sgd{{0.9f, 1e-4f, false}};
  wb::backend::Tensor images, labels;
};

// Profiling on vs off, alternated (the order flips every round), as wb-train profiles a GPU run.
void profiling_overhead(const Options& o, int batch, const std::string& dir) {
  namespace fs = std::filesystem;
  Ours ours(o, o.overhead_precision, batch);
  wb::store::WriterOptions wo;
  wo.path = fs::path(dir) / "overhead.sqlite";
  wo.overwrite = true;
  wo.handle_signals = false;
  wb::store::Writer writer(wo);
  wb::profiler::Recorder recorder(writer);
  wb::profiler::set_thread_name("main");
  wb::trainer::StepObserver observer(&recorder, nullptr, *ours.backend);
  ours.run(o.warmup);
#if defined(WB_PROFILER_CUPTI)
  // One tracer for the whole bench, paused while unprofiled: CUPTI does not promise that subscribing
  // again in one process works.
  wb::profiler::cuda::CuptiTracer cupti(recorder);
  cupti.pause();
#endif
  auto profiled = [&](bool on) {
    recorder.set_enabled(on);
    ours.model->set_observer(on ? &observer : nullptr);
#if defined(WB_PROFILER_CUPTI)
    if (on) cupti.resume();
#endif
    const double t = ours.run(o.steps);
    ours.model->set_observer(nullptr);
#if defined(WB_PROFILER_CUPTI)
    cupti.pause();  // hands over the round's records: outside the timed steps
#endif
    return t;
  };
  std::vector<double> on_s, off_s, paired;
  for (int r = 0; r < o.rounds; ++r) {
    double on = 0, off = 0;
    if (r % 2 == 0) {
      on = profiled(true);
      off = profiled(false);
    } else {
      off = profiled(false);
      on = profiled(true);
    }
    on_s.push_back(on);
    off_s.push_back(off);
    paired.push_back(100.0 * (on - off) / off);
    std::printf("overhead round %d: profiled %.2f ms/step, unprofiled %.2f ms/step, %+.2f %%\n", r + 1,
                1e3 * on / o.steps, 1e3 * off / o.steps, paired.back());
  }
  recorder.stop();
  writer.finish();
  std::printf("profiling overhead (%s, CUPTI %s): %+.2f %% (median of rounds; profiled %.2f vs %.2f ms/step)\n",
              o.overhead_precision.c_str(),
#if defined(WB_PROFILER_CUPTI)
              "on",
#else
              "not built",
#endif
              median(paired), 1e3 * median(on_s) / o.steps, 1e3 * median(off_s) / o.steps);
}

double gib(double bytes) { return bytes / double(1 << 30); }

std::pair<std::int64_t, std::int64_t> torch_memory(wb::bench::TorchChild& torch) {
  const std::string answer = torch.ask("memory");
  long long allocated = 0, reserved = 0;
  if (std::sscanf(answer.c_str(), "%lld %lld", &allocated, &reserved) != 2) {
    throw std::runtime_error("gpu_vs_torch: PyTorch memory: unexpected answer '" + answer + "'");
  }
  return {allocated, reserved};
}

void torch_release(wb::bench::TorchChild& torch) {
  if (const std::string answer = torch.ask("release"); answer != "ok")
    throw std::runtime_error("gpu_vs_torch: PyTorch release: " + answer);
}

// The batch both sides fit at (see the top of the file): each side's peak at batches 32 and 64 in fp32,
// run alone, extrapolated linearly.
int fitted_batch(const Options& o, wb::bench::TorchChild& torch) {
  std::size_t free_bytes = 0, total_bytes = 0;
  WB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int b0 = 32, b1 = 64;
  if (o.batch <= b1) return o.batch;  // small enough: the probes would cost more than they tell
  auto ours_peak = [&](int b) {
    Ours ours(o, "fp32", b);
    ours.run(2);
    return static_cast<double>(ours.memory().second);  // what the side holds from the driver
  };
  auto torch_peak = [&](int b) {
    if (const std::string answer = torch.ask("config fp32 " + std::to_string(b)); answer != "ok")
      throw std::runtime_error("gpu_vs_torch: PyTorch config fp32 " + std::to_string(b) + ": " + answer);
    torch.run(2);
    const double peak = static_cast<double>(torch_memory(torch).second);
    torch_release(torch);
    return peak;
  };
  torch_release(torch);
  const double o0 = ours_peak(b0), o1 = ours_peak(b1), t0 = torch_peak(b0), t1 = torch_peak(b1);
  const double per_image = (o1 - o0 + t1 - t0) / (b1 - b0);
  const double fixed = o0 + t0 - per_image * b0;
  const double budget = 0.9 * static_cast<double>(free_bytes);
  auto need = [&](int b) { return fixed + per_image * b; };
  std::printf("memory: %.1f GiB free of %.1f GiB; fp32 per image: ours %.1f MiB, pytorch %.1f MiB; batch %d needs "
              "about %.1f GiB for both sides\n",
              gib(static_cast<double>(free_bytes)), gib(static_cast<double>(total_bytes)), (o1 - o0) / (b1 - b0) / (1 << 20),
              (t1 - t0) / (b1 - b0) / (1 << 20), o.batch, gib(need(o.batch)));
  if (need(o.batch) <= budget) return o.batch;
  int b = o.batch / 8 * 8;
  while (b > 8 && need(b) > budget) b -= 8;
  std::printf("memory: batch %d does not fit both sides in 90%% of the free memory (%.1f GiB); measuring at batch %d "
              "(about %.1f GiB)\n",
              o.batch, gib(budget), b, gib(need(b)));
  return b;
}

#endif  // WB_BACKEND_CUDA

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
#if !defined(WB_BACKEND_CUDA)
    (void)o;
    std::printf("gpu_vs_torch: this build has no CUDA backend (configure with -DWB_CUDA=ON); nothing to measure\n");
    return 0;
#else
    if (wb::backend::cuda_device_count() == 0) {
      std::printf("gpu_vs_torch: no CUDA device found; nothing to measure\n");
      return 0;
    }
    const char* env = std::getenv("WB_TORCH_PYTHON");
    const std::string python = env && *env ? env : WB_PYTHON;
    char tmpl[] = "/tmp/wb-bench-gpu-vs-torch-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("gpu_vs_torch: mkdtemp failed");
    const std::string dir = tmpl;

    wb::bench::TorchChild torch({python, std::string(WB_SOURCE_DIR) + "/bench/gpu_vs_torch.py", std::to_string(o.batch),
                                 std::to_string(o.size), "1000"},
                                "gpu_vs_torch");
    const int batch = o.fit ? fitted_batch(o, torch) : o.batch;
    std::printf("gpu_vs_torch: ResNet-50, batch %d, %dx%d, 1000 classes, synthetic data on the device, "
                "%d rounds of %d steps after %d warm-up steps; %s\n",
                batch, o.size, o.size, o.rounds, o.steps, o.warmup, torch.banner().c_str());
    std::ostringstream summary;
    for (const std::string& p : o.precisions) {
      const std::string label = p == "bf16" ? "bf16 channels-last" : p == "fp32" ? "fp32 (TF32 off)" : "tf32";
      double ours_total = 0, torch_total = 0;
      {
        torch_release(torch);  // PyTorch's previous model and cache are gone before ours is built
        Ours ours(o, p, batch);
        if (const std::string answer = torch.ask("config " + p + " " + std::to_string(batch)); answer != "ok")
          throw std::runtime_error("gpu_vs_torch: PyTorch config " + p + ": " + answer);
        ours.run(o.warmup);
        torch.run(o.warmup);
        for (int r = 0; r < o.rounds; ++r) {
          const double a = ours.run(o.steps);
          const double b = torch.run(o.steps);
          ours_total += a;
          torch_total += b;
          std::printf("%s round %d: ours %.1f img/s, pytorch %.1f img/s\n", label.c_str(), r + 1,
                      o.steps * batch / a, o.steps * batch / b);
        }
        const auto [ours_peak, ours_held] = ours.memory();
        const auto [torch_peak, torch_held] = torch_memory(torch);
        std::printf("%s memory: ours peak %.2f GiB (held %.2f GiB), pytorch peak %.2f GiB (reserved %.2f GiB)\n",
                    label.c_str(), gib(static_cast<double>(ours_peak)), gib(static_cast<double>(ours_held)),
                    gib(static_cast<double>(torch_peak)), gib(static_cast<double>(torch_held)));
      }
      const double images = static_cast<double>(o.rounds) * o.steps * batch;
      std::printf("%s: ours %.1f img/s, pytorch %.1f img/s, ratio ours/pytorch %.3f\n", label.c_str(),
                  images / ours_total, images / torch_total, torch_total / ours_total);
      std::fflush(stdout);
      summary << (summary.tellp() > 0 ? ", " : "") << p << " " << std::fixed;
      summary.precision(3);
      summary << torch_total / ours_total;
    }
    if (o.overhead) {
      torch_release(torch);
      profiling_overhead(o, batch, dir);
    }
    std::printf("ratio ours/pytorch: %s\n", summary.str().c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return 0;
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
