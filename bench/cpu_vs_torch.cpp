// Training-step throughput of our CPU backend against PyTorch on the same machine, in one run:
// torchvision ResNet-50, 10 classes, fp32, the same synthetic batch and thread count, steady-state steps
// only. Rounds alternate: N of our steps, then N of PyTorch's (a persistent child process, bench/
// cpu_vs_torch.py, driven over a pipe, so its start-up is not timed). The last line is the ratio
// ours / PyTorch in images per second. Before it, the peak memory of one steady step on each side: ours
// from the backend's allocations (a MemoryListener, as wb-train's memory profile), PyTorch's from its
// allocator's "Total Allocated" under the profiler with profile_memory (as `wb diff` compares them).
//
//   cpu_vs_torch [--threads 2] [--batch 32] [--size 32] [--rounds 3] [--steps 10] [--warmup 3] [--profile]
//                [--keep-tensors]
//
// --keep-tensors keeps every activation and activation gradient from one step to the next instead of
// freeing each once backward has consumed it (ModelConfig::free_consumed_grads 0), for an on/off pair.
// --profile adds a per-op-kind breakdown of our step from the model's observer hooks (timers around
// each module's forward and backward) and the backend's weight-reorder time.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/torch_child.hpp"
#include "trainer/backend/memory.hpp"
#include "layout/resnet50.hpp"
#include "trainer/backend/cpu/cpu_backend.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/optim/sgd.hpp"
#include "tests/support/peers.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int threads = 2, batch = 32, size = 32, rounds = 3, steps = 10, warmup = 3;
  bool profile = false;
  bool keep_tensors = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() {
      if (i + 1 >= argc) throw std::invalid_argument("cpu_vs_torch: " + a + " needs a value");
      return std::atoi(argv[++i]);
    };
    if (a == "--threads") o.threads = value();
    else if (a == "--batch") o.batch = value();
    else if (a == "--size") o.size = value();
    else if (a == "--rounds") o.rounds = value();
    else if (a == "--steps") o.steps = value();
    else if (a == "--warmup") o.warmup = value();
    else if (a == "--profile") o.profile = true;
    else if (a == "--keep-tensors") o.keep_tensors = true;
    else throw std::invalid_argument("cpu_vs_torch: unknown flag " + a);
  }
  if (o.threads < 1 || o.batch < 2 || o.rounds < 1 || o.steps < 1 || o.warmup < 1) {
    throw std::invalid_argument("cpu_vs_torch: threads >= 1, batch >= 2, rounds/steps/warmup >= 1 expected");
  }
  return o;
}

// Per-op-kind time of our step from the observer's ranges (leaf modules only: blocks nest).
class OpTimer : public wb::model::ModelObserver {
 public:
  void on_module_begin(int id, wb::model::Phase) override { start_ = Clock::now(); open_ = id; }
  void on_module_end(int id, wb::model::Phase phase) override {
    if (id != open_) return;  // a block's end: its children were counted already
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    const char* suffix = phase == wb::model::Phase::forward ? " fwd" : phase == wb::model::Phase::backward ? " bwd" : "";
    totals_[kind(id) + suffix] += s;
    open_ = -1;
  }
  void reset() { totals_.clear(); }
  const std::map<std::string, double>& totals() const { return totals_; }

 private:
  static std::string kind(int id) {
    const wb::layout::Module& m = wb::layout::modules()[static_cast<std::size_t>(id)];
    switch (m.kind) {
      case wb::layout::ModuleKind::conv: return "conv";
      case wb::layout::ModuleKind::batch_norm: return "batchnorm";
      case wb::layout::ModuleKind::relu: return "relu/add";
      case wb::layout::ModuleKind::block: return "block";
      default: return m.name;
    }
  }
  Clock::time_point start_;
  int open_ = -1;
  std::map<std::string, double> totals_;
};

// The bytes the backend holds, and the most it held since `peak` was last reset.
struct PeakListener final : wb::backend::MemoryListener {
  std::atomic<std::int64_t> live{0}, peak{0};
  void on_alloc(std::size_t bytes, wb::backend::MemoryTag) noexcept override {
    const std::int64_t now = live.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
    std::int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  void on_free(std::size_t bytes, wb::backend::MemoryTag) noexcept override {
    live.fetch_sub(static_cast<std::int64_t>(bytes));
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    namespace fs = std::filesystem;
    char tmpl[] = "/tmp/wb-bench-cpu-vs-torch-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("cpu_vs_torch: mkdtemp failed");
    const std::string dir = tmpl;

    // The synthetic batch both sides train on.
    const std::size_t n_img = static_cast<std::size_t>(o.batch) * 3 * static_cast<std::size_t>(o.size * o.size);
    std::vector<float> images(n_img);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(o.batch));
    std::mt19937_64 gen(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : images) v = normal(gen);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);
    std::ofstream(dir + "/images.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(images.data()), static_cast<std::streamsize>(n_img * 4));
    std::ofstream(dir + "/labels.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(labels.data()), static_cast<std::streamsize>(labels.size() * 4));

    PeakListener listener;
    wb::backend::set_memory_listener(&listener);  // before the model, so every allocation is seen
    auto backend = wb::backend::make_cpu_backend({o.threads});
    auto& cpu = dynamic_cast<wb::backend::cpu::CpuBackend&>(*backend);
    wb::model::ModelConfig cfg;
    cfg.num_classes = 10;
    cfg.image_size = o.size;
    cfg.batch_size = o.batch;
    cfg.seed = 0;
    cfg.loss = {wb::backend::LossConvention::torch, 0.1f};
    if (o.keep_tensors) cfg.free_consumed_grads = 0;
    wb::model::ResNet50 model(*backend, cfg);
    wb::optim::Sgd sgd({0.9f, 1e-4f, false});
    long our_faults = 0, our_counted_steps = 0;  // minor page faults of our timed steps
    auto our_steps = [&](int n) {
      rusage ru0{};
      getrusage(RUSAGE_SELF, &ru0);
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        model.forward(images, labels);
        model.backward();
        sgd.step(model, 0.01f);
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      rusage ru1{};
      getrusage(RUSAGE_SELF, &ru1);
      our_faults += ru1.ru_minflt - ru0.ru_minflt;
      our_counted_steps += n;
      return seconds;
    };

    wb::bench::TorchChild torch({WB_PYTHON, std::string(WB_SOURCE_DIR) + "/bench/cpu_vs_torch.py", std::to_string(o.batch),
                                 std::to_string(o.size), "10", std::to_string(o.threads), dir},
                                "cpu_vs_torch");
    our_steps(o.warmup);
    torch.run(o.warmup);
    our_faults = our_counted_steps = 0;  // steady steps only
    std::printf("cpu_vs_torch: ResNet-50, batch %d, %dx%d, 10 classes, fp32, %d threads, %d rounds of %d steps%s\n",
                o.batch, o.size, o.size, o.threads, o.rounds, o.steps, o.keep_tensors ? ", tensors kept" : "");
    double ours_total = 0, torch_total = 0;
    for (int r = 0; r < o.rounds; ++r) {
      const double a = our_steps(o.steps);
      const double b = torch.run(o.steps);
      ours_total += a;
      torch_total += b;
      std::printf("round %d: ours %.1f img/s, pytorch %.1f img/s\n", r + 1, o.steps * o.batch / a,
                  o.steps * o.batch / b);
    }
    const double images_run = static_cast<double>(o.rounds) * o.steps * o.batch;
    if (o.profile) {
      OpTimer timer;
      model.set_observer(&timer);
      cpu.reset_stats();
      const double t = our_steps(o.steps);
      model.set_observer(nullptr);
      std::printf("profile of our step (%.1f ms/step):\n", 1e3 * t / o.steps);
      for (const auto& [k, v] : timer.totals()) std::printf("  %-20s %8.2f ms/step\n", k.c_str(), 1e3 * v / o.steps);
      std::printf("  %-20s %8.2f ms/step (%lld conversions/step, inside conv)\n", "weight reorders",
                  1e-6 * static_cast<double>(cpu.stats().weight_reorder_ns) / o.steps,
                  static_cast<long long>(cpu.stats().weight_reorders / o.steps));
      std::printf("  %-20s %8lld per step\n", "activation reorders",
                  static_cast<long long>(cpu.stats().input_reorders / o.steps));
    }
    listener.peak = listener.live.load();
    our_steps(1);
    const double ours_peak = static_cast<double>(listener.peak.load());
    std::printf("idle storage blocks our backend keeps for reuse at the step's end: %.2f MiB\n",
                static_cast<double>(cpu.idle_block_bytes()) / 1048576.0);
    const double torch_peak = std::stod(torch.ask("memory"));
    std::printf("peak memory of a step: ours %.2f MiB, pytorch %.2f MiB, ratio %.3f\n", ours_peak / 1048576.0,
                torch_peak / 1048576.0, ours_peak / torch_peak);
    std::printf("minor page faults per steady step of ours: %ld\n", our_faults / std::max(1L, our_counted_steps));
    std::printf("ours %.1f img/s, pytorch %.1f img/s\n", images_run / ours_total, images_run / torch_total);
    std::printf("ratio ours/pytorch: %.3f\n", torch_total / ours_total);
    std::error_code ec;
    fs::remove_all(dir, ec);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
