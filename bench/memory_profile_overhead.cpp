// What the memory profile costs a training step, in one process: ResNet-50 steps on the CPU backend
// with wb-train's MemoryProfile installed as the memory listener (rows to a run file, handed over at
// every step's end, as wb-train does) and without it, alternated every few steps with the order flipped
// every round, so that load from elsewhere hits both alike. Two models: as wb-train trains on the CPU
// (every tensor kept from step to step: a steady step allocates nothing), and freeing each activation
// gradient once consumed (as on the CUDA backend: about a hundred allocations and frees per step, each
// one reported). Prints each case's median step time on and off.
//
// On a shared, loaded machine those medians move by several percent from one block of steps to the
// next, more than the profile can cost, so the figure against the goal is measured directly: the cost
// of one reported allocation and free (a tensor allocated and dropped in a loop, the listener installed
// and not, alternated, median of the rounds) times the allocations and frees per step, as a share of the
// step time. The last line is that figure for the model that allocates the most, against the 1 % goal.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "profiler/record/recorder.hpp"
#include "store/writer.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/backend/memory.hpp"
#include "trainer/memory_profile.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/optim/sgd.hpp"

namespace fs = std::filesystem;
using namespace wb;

namespace {

using wb::bench::load_average;
using wb::bench::median;

constexpr double kGoalPercent = 1.0;

struct Options {
  int rounds = 8;
  int steps = 2;  // per half round
  int batch = 32;
  int size = 32;
  int threads = 1;
};

const char* kUsage =
    "usage: memory_profile_overhead [--rounds N] [--steps N] [--batch N] [--size N] [--threads N]\n"
    "ResNet-50 steps on the CPU backend with and without the memory profile, alternated every N steps\n"
    "(default 8 rounds of 2 + 2 steps, batch 32, 32x32, 1 thread), as wb-train keeps its tensors and with\n"
    "activation gradients freed once consumed; the last line is the larger overhead against 1 %.\n";

int parse_int(const std::string& flag, const char* text, int lo) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > 100000)
    throw std::invalid_argument(flag + ": expected an integer >= " + std::to_string(lo) + ", got '" + text + "'");
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(a + ": unknown flag or missing value\n" + kUsage);
    const char* v = argv[++i];
    if (a == "--rounds") o.rounds = parse_int(a, v, 1);
    else if (a == "--steps") o.steps = parse_int(a, v, 1);
    else if (a == "--batch") o.batch = parse_int(a, v, 1);
    else if (a == "--size") o.size = parse_int(a, v, 32);
    else if (a == "--threads") o.threads = parse_int(a, v, 1);
    else throw std::invalid_argument(a + ": unknown flag\n" + kUsage);
  }
  return o;
}

struct Measured {
  double on_ms = 0.0, off_ms = 0.0;
  double events_per_step = 0.0;  // memory rows per profiled step
  double ns_per_pair = 0.0;      // what one reported allocation and its free cost
};

// One model's steps with the profile on and off.
Measured measure(const Options& o, const fs::path& dir, bool free_consumed) {
  store::WriterOptions wo;
  wo.path = dir / (free_consumed ? "free.sqlite" : "keep.sqlite");
  wo.overwrite = true;
  wo.handle_signals = false;
  store::Writer writer(wo);
  profiler::Recorder recorder(writer);
  trainer::MemoryProfile profile(recorder, 0);  // installs itself: the model's buffers are counted

  auto backend = backend::make_cpu_backend({o.threads});
  model::ModelConfig cfg;
  cfg.num_classes = 10;
  cfg.image_size = o.size;
  cfg.batch_size = o.batch;
  cfg.free_consumed_grads = free_consumed ? 1 : 0;
  model::ResNet50 model(*backend, cfg);
  optim::Sgd sgd({0.9f, 1e-4f, false});
  std::vector<float> images(static_cast<std::size_t>(o.batch) * 3 * static_cast<std::size_t>(o.size * o.size));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(o.batch));
  std::mt19937_64 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : images) v = normal(gen);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);

  int step = 0;
  auto run = [&](bool on, std::vector<double>* times) {
    backend::set_memory_listener(on ? &profile : nullptr);
    for (int i = 0; i < o.steps; ++i) {
      profiler::set_step(step++);
      const auto t0 = std::chrono::steady_clock::now();
      model.forward(images, labels);
      model.backward();
      sgd.step(model, 0.01f);
      if (on) profile.flush();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (times) times->push_back(ms);
    }
  };
  run(true, nullptr);  // the first step allocates everything; one more settles the caches
  run(false, nullptr);
  const std::int64_t rows_before = static_cast<std::int64_t>(writer.stats().rows_committed);
  std::vector<double> on_ms, off_ms;
  for (int r = 0; r < o.rounds; ++r) {
    const bool on_first = r % 2 == 0;
    run(on_first, on_first ? &on_ms : &off_ms);
    run(!on_first, on_first ? &off_ms : &on_ms);
  }
  writer.flush();
  const std::int64_t rows = static_cast<std::int64_t>(writer.stats().rows_committed) - rows_before;

  // One allocation and its free through this backend, with the listener and without.
  constexpr int kPairs = 20000, kRounds = 7;
  auto pairs = [&](bool on) {
    backend::set_memory_listener(on ? &profile : nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPairs; ++i) {
      backend::Tensor t = backend->empty(backend::Shape{256}, backend::DType::f32);
    }
    if (on) profile.flush();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kPairs;
  };
  std::vector<double> diffs;
  for (int r = 0; r < kRounds; ++r) {
    const bool on_first = r % 2 == 0;
    const double a = pairs(on_first), b = pairs(!on_first);
    diffs.push_back(on_first ? a - b : b - a);
  }
  backend::set_memory_listener(&profile);
  writer.flush();

  Measured m;
  m.on_ms = median(on_ms);
  m.off_ms = median(off_ms);
  m.events_per_step = static_cast<double>(rows) / static_cast<double>(on_ms.size());
  m.ns_per_pair = std::max(0.0, median(diffs));
  std::printf("  %-36s on %8.2f ms  off %8.2f ms  (%zu steps each, %+.2f%%); %.0f memory rows per profiled step\n",
              free_consumed ? "activation gradients freed:" : "tensors kept (wb-train on the CPU):", m.on_ms, m.off_ms,
              on_ms.size(), 100.0 * (m.on_ms / m.off_ms - 1.0), m.events_per_step);
  std::printf("  %-36s %.0f ns per reported allocation and free (median of %d alternated rounds of %d)\n", "", m.ns_per_pair,
              kRounds, kPairs);
  std::fflush(stdout);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  try {
    const Options o = parse(argc, argv);
    dir = wb::bench::make_temp_dir("wb-memory-overhead");
    std::printf("memory profile overhead: ResNet-50 on the CPU backend, batch %d, %dx%d, %d thread(s), %d rounds of "
                "%d + %d steps (on/off alternated, order flipped every round)\n",
                o.batch, o.size, o.size, o.threads, o.rounds, o.steps, o.steps);
    std::printf("load average at start: %s (the figures are noisy when the machine is loaded)\n", load_average().c_str());
    const Measured keep = measure(o, dir, false);
    const Measured freed = measure(o, dir, true);
    std::printf("load average at end: %s\n", load_average().c_str());
    // Events come in pairs: an allocation's cost is measured with its free.
    auto percent_of = [](const Measured& m) { return 100.0 * m.events_per_step / 2.0 * m.ns_per_pair / 1e6 / m.off_ms; };
    std::printf("direct cost: tensors kept %.4f%%, activation gradients freed %.4f%% of step time\n", percent_of(keep),
                percent_of(freed));
    const Measured& worst = percent_of(keep) > percent_of(freed) ? keep : freed;
    const double percent = percent_of(worst);
    std::printf("memory profile overhead: %.3f%% of step time (%.0f events per step x %.0f ns per pair / 2 against %.2f ms; "
                "goal <= %.0f%%: %s)\n",
                percent, worst.events_per_step, worst.ns_per_pair, worst.off_ms, kGoalPercent,
                percent <= kGoalPercent ? "met" : "missed");
    std::error_code ec;
    fs::remove_all(dir, ec);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memory_profile_overhead: %s\n", e.what());
    if (!dir.empty()) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
    return 1;
  }
}
