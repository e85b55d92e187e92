// The single-process reference of the 2-rank trainer tests (--sync-bn, --shard-fc): one step of the
// whole model, built here from the state rank 0 dumped, and the rel-L2 of a run's dumped tensors
// against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "store/reader.hpp"
#include "support/numeric.hpp"
#include "support/python.hpp"
#include "test_trainer_util.hpp"
#include "trainer/backend/backend.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/optim/sgd.hpp"
#include "support/peers.hpp"

namespace wb::test {

inline std::vector<float> floats(const wb::store::TensorRow& t) {
  std::vector<float> out(t.data.size() / sizeof(float));
  std::memcpy(out.data(), t.data.data(), out.size() * sizeof(float));
  return out;
}

inline std::vector<std::int32_t> labels_of(const wb::store::TensorRow& t) {
  std::vector<std::int32_t> out;
  if (t.dtype == "I64") {
    std::vector<std::int64_t> v(t.data.size() / 8);
    std::memcpy(v.data(), t.data.data(), v.size() * 8);
    for (auto x : v) out.push_back(static_cast<std::int32_t>(x));
  } else {
    out.resize(t.data.size() / 4);
    std::memcpy(out.data(), t.data.data(), out.size() * 4);
  }
  return out;
}

// One process's step from the state rank 0 dumped, on `images` (n images) with plain batch norm:
// loss, gradients, running statistics and parameters after the update, each by name.
struct StepResult {
  float loss = 0;
  std::map<std::string, std::vector<float>> grad, param_after, stats_after;
};

inline StepResult one_process(wb::store::Reader& run, const std::vector<float>& images, const std::vector<std::int32_t>& labels,
                       int n) {
  auto be = wb::backend::make_cpu_backend({1});
  wb::model::ModelConfig mc;
  mc.num_classes = 10;
  mc.image_size = 32;
  mc.batch_size = n;
  mc.loss = {wb::backend::LossConvention::mindspore, 0.1f};
  wb::model::ResNet50 model(*be, mc);
  std::vector<float> params(model.param_count());
  for (const auto& p : model.params()) {
    auto v = floats(run.tensor("run", "param", p.name, 0, 0));
    REQUIRE(v.size() == p.numel);
    std::copy(v.begin(), v.end(), params.begin() + static_cast<std::ptrdiff_t>(p.offset));
  }
  model.params_from_host(params);
  std::vector<float> stats = model.running_stats_to_host();
  for (const auto& b : model.buffers()) {
    if (b.dtype != wb::backend::DType::f32) continue;
    auto v = floats(run.tensor("run", "buffer", b.name, 0, 0));
    REQUIRE(v.size() == b.numel);
    std::copy(v.begin(), v.end(), stats.begin() + static_cast<std::ptrdiff_t>(b.offset));
  }
  model.running_stats_from_host(stats);
  StepResult r;
  r.loss = model.forward(images, labels);
  model.backward();
  const std::vector<float> g = model.grads_to_host();
  wb::optim::Sgd sgd({0.9f, 1e-4f, false});
  sgd.step(model, 0.05f);
  const std::vector<float> after = model.params_to_host(), stats_after = model.running_stats_to_host();
  for (const auto& p : model.params()) {
    const auto o = static_cast<std::ptrdiff_t>(p.offset), e = o + static_cast<std::ptrdiff_t>(p.numel);
    r.grad[p.name] = {g.begin() + o, g.begin() + e};
    r.param_after[p.name] = {after.begin() + o, after.begin() + e};
  }
  for (const auto& b : model.buffers()) {
    if (b.dtype != wb::backend::DType::f32) continue;
    const auto o = static_cast<std::ptrdiff_t>(b.offset), e = o + static_cast<std::ptrdiff_t>(b.numel);
    r.stats_after[b.name] = {stats_after.begin() + o, stats_after.begin() + e};
  }
  return r;
}

// A 2-rank run's step 0 (each rank's dumped batch and loss) and one process's step on the two batches
// concatenated.
struct Concatenated {
  std::vector<float> halves[2];               // each rank's images
  std::vector<std::int32_t> half_labels[2];  // and labels
  float run_loss = 0;                         // the ranks' mean loss
  StepResult ref;
};

inline Concatenated concatenated_step(wb::store::Reader& run, int batch) {
  Concatenated c;
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  for (int rank : {0, 1}) {
    c.halves[rank] = floats(run.tensor("run", "input", "input", 0, rank));
    c.half_labels[rank] = labels_of(run.tensor("run", "label", "label", 0, rank));
    images.insert(images.end(), c.halves[rank].begin(), c.halves[rank].end());
    labels.insert(labels.end(), c.half_labels[rank].begin(), c.half_labels[rank].end());
    c.run_loss += floats(run.tensor("run", "loss", "loss", 0, rank))[0] / 2;
  }
  REQUIRE(labels.size() == 2 * static_cast<std::size_t>(batch));
  c.ref = one_process(run, images, labels, 2 * batch);
  return c;
}

// The largest rel-L2 of the run's tensors of `kind` (rank 0's dump) against `ref`, over the names that
// start with one of `prefixes` (all names when empty).
inline double worst(wb::store::Reader& run, const std::string& kind, const std::map<std::string, std::vector<float>>& ref,
                    std::string* which, const std::vector<std::string>& prefixes = {}) {
  double w = 0;
  for (const auto& [name, v] : ref) {
    const std::string& n = name;  // a structured binding is not captured by a lambda before clang 16
    if (!prefixes.empty() && std::none_of(prefixes.begin(), prefixes.end(),
                                          [&](const std::string& p) { return n.starts_with(p); })) {
      continue;
    }
    const double e = rel_l2(floats(run.tensor("run", kind, name, 0, 0)), v, 1e-12);
    if (e >= w) {
      w = e;
      *which = name;
    }
  }
  return w;
}

// torch_step.py's replay of the run file `run_path` into `ref`, and `wb compare` of the two, which must
// pass every one of the 1139 tensors; then the worst rel-L2 per kind of rank 0's dump against the replay,
// and over the gradients whose names start with one of `focus`.
struct Replay {
  std::string output;                 // torch_step.py's
  std::map<std::string, double> by_kind;
  double focus = 0;
  std::string focus_name;  // the gradient with the worst rel-L2 among `focus`
  std::string describe() const {
    std::string line;
    for (const auto& [kind, e] : by_kind) line += " " + kind + " " + std::to_string(e);
    return line;
  }
};

inline Replay replay_and_compare(const std::filesystem::path& run_path, const std::filesystem::path& ref,
                                 const std::vector<std::string>& focus) {
  const std::filesystem::path script = std::filesystem::path(WB_SOURCE_DIR) / "compare" / "reference" / "torch_step.py";
  const auto replay = run_python(shell_quote(script.string()) + " " + shell_quote(run_path.string()) + " --out " +
                                 shell_quote(ref.string()) + " --threads 1");
  CAPTURE(replay.output);
  REQUIRE(replay.exit_code == 0);
  const auto cmp = run_command(shell_quote(WB_CLI) + " compare " + shell_quote(run_path.string()) + " " +
                               shell_quote(ref.string()));
  CAPTURE(cmp.output.substr(cmp.output.size() > 3000 ? cmp.output.size() - 3000 : 0));
  CHECK(cmp.exit_code == 0);
  CHECK(cmp.output.find("1139 tensors: 1139 pass, 0 fail") != std::string::npos);
  Replay r;
  r.output = replay.output;
  wb::store::Reader run(run_path);
  const auto torch = read_checkpoint(ref);
  for (const auto& info : run.tensors("run")) {
    if (info.rank != 0 || info.dtype != "F32") continue;
    const std::string key = info.kind == info.name ? info.kind : info.kind + "." + info.name;
    auto it = torch.find(key);
    REQUIRE(it != torch.end());
    std::vector<float> theirs(it->second.data.size() / sizeof(float));
    std::memcpy(theirs.data(), it->second.data.data(), theirs.size() * sizeof(float));
    const double e = rel_l2(floats(run.tensor("run", info.kind, info.name, 0, 0)), theirs, 1e-12);
    r.by_kind[info.kind] = std::max(r.by_kind[info.kind], e);
    const std::string& name = info.name;
    if (info.kind == "grad" &&
        std::any_of(focus.begin(), focus.end(), [&](const std::string& p) { return name.starts_with(p); })) {
      if (e >= r.focus) {
        r.focus = e;
        r.focus_name = name;
      }
    }
  }
  return r;
}

}  // namespace wb::test
