// compare_speed: `wb compare` end to end (load both files + metrics + verdicts + first divergence) on
// two safetensors dumps the size of a full ResNet-50 step one at batch 32, 32x32 input, 10 classes:
// input, label, 161 parameters, 159 BN buffers, every module's activation, loss, 161 gradients,
// 161 updated parameters, 159 updated buffers, 161 momentum buffers. Goal: under 2 s on the 2-core
// development machine.
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "compare/compare.hpp"
#include "compare/load.hpp"
#include "compare/test_support/tensor_sets.hpp"

namespace fs = std::filesystem;
using namespace wb::compare;

namespace {

void write_set(const TensorSet& s, const fs::path& path) {
  std::vector<wb::store::HostTensor> tensors;
  nlohmann::json order;
  for (const auto& t : s.tensors) {
    tensors.push_back(t.tensor);
    tensors.back().name = t.key;
    order[t.key] = t.exec_order;
  }
  wb::store::write_safetensors(path, tensors, {{kExecOrderMetadataKey, order.dump()}});
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds of the whole process (all threads): on a shared machine the wall time depends on the
// load, this does not.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main() {
  const fs::path dir = fs::temp_directory_path() / ("wb_bench_compare_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path pa = dir / "a.safetensors", pb = dir / "b.safetensors";
  std::int64_t elements = 0;
  {
    const auto layout = testing::resnet50_step(32, 32, 10);
    const TensorSet b = testing::make_set(layout, 1, "reference");
    // A: the reference with fp32-level noise on everything computed (so nothing is bit-exact there).
    TensorSet a = b;
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> u(-1e-6f, 1e-6f);
    for (auto& t : a.tensors) {
      elements += t.tensor.numel();
      const TensorKind k = kind_of_key(t.key);
      if (t.tensor.dtype != wb::store::DType::F32 || k == TensorKind::param || k == TensorKind::buffer ||
          k == TensorKind::input) {
        continue;
      }
      for (std::int64_t i = 0; i < t.tensor.numel(); ++i) {
        testing::set_f32(t.tensor, i, testing::get_f32(t.tensor, i) * (1.0f + u(rng)));
      }
    }
    std::printf("dump: %zu tensors, %.1f M elements per side (%.0f MB per file)\n", layout.size(),
                static_cast<double>(elements) / 1e6, static_cast<double>(elements) * 4.0 / 1e6);
    write_set(a, pa);
    write_set(b, pb);
  }
  const double bytes = static_cast<double>(fs::file_size(pa) + fs::file_size(pb));

  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    auto fb = std::async(std::launch::async, [&] { return load_tensor_set(pb); });
    const TensorSet a = load_tensor_set(pa);
    const TensorSet b = fb.get();
    const double t_load = seconds_since(t0), c_load = cpu_seconds() - c0;
    const Comparison c = compare_sets(a, b);
    const double total = seconds_since(t0), c_total = cpu_seconds() - c0;
    std::printf("run %d: load %.3f s (cpu %.3f), metrics+verdict %.3f s (cpu %.3f), total %.3f s (cpu %.3f; %zu rows, "
                "%lld failed)\n",
                rep, t_load, c_load, total - t_load, c_total - c_load, total, c_total, c.rows.size(),
                static_cast<long long>(c.failed));
    best = std::min(best, total);
  }
  fs::remove_all(dir);
  std::printf("throughput: %.2f GB/s counting both files\n", bytes / best / 1e9);
  std::printf("compare_speed: %.3f s end to end (goal < 2 s): %s\n", best, best < 2.0 ? "met" : "NOT met");
  return 0;
}
