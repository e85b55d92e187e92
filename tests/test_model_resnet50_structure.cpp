// ResNet-50's tables, initialisation and hooks: parameter layout and decay flags, module names, the
// statistics of torchvision's init from our seeded generator, the observer's calls (module ranges,
// output dumps, gradient readiness), fused vs unfused equality, eval mode, steady-state allocation.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>

#include "test_backend_util.hpp"
#include "trainer/model/resnet50.hpp"
#include "trainer/optim/sgd.hpp"

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using wb::model::Phase;
using wb::model::ResNet50;

namespace {

wb::model::ModelConfig small_config(std::uint64_t seed = 3) {
  wb::model::ModelConfig c;
  c.num_classes = 10;
  c.image_size = 32;
  c.batch_size = 2;
  c.seed = seed;
  c.loss = {wb::backend::LossConvention::mindspore, 0.1f};
  return c;
}

struct Recorder : wb::model::ModelObserver {
  wb::backend::Backend* be = nullptr;
  bool want = false;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> outputs;
  std::vector<std::pair<int, int>> ready;
  std::vector<int> stack;  // open module ranges
  bool nested_ok = true;
  std::map<Phase, int> ranges;
  bool wants_outputs() const override { return want; }
  void on_output(std::string_view name, const wb::backend::Tensor& t) override {
    outputs.emplace_back(std::string(name), t.shape().to_vector());
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    be->to_host(t, v);  // the tensor must be readable during the call
  }
  void on_module_begin(int id, Phase phase) override {
    stack.push_back(id);
    ++ranges[phase];
  }
  void on_module_end(int id, Phase) override {
    if (stack.empty() || stack.back() != id) nested_ok = false;
    if (!stack.empty()) stack.pop_back();
  }
  void on_grads_ready(int first, int last) override { ready.emplace_back(first, last); }
};

std::vector<float> batch_images(const wb::model::ModelConfig& c) {
  return wb::test::random_normal(static_cast<std::size_t>(c.batch_size * 3 * c.image_size * c.image_size), 77);
}

}  // namespace

TEST_CASE("resnet50 parameter table, buffers and module names follow torchvision", "[trainer][model]") {
  auto be = wb::backend::make_cpu_backend({2});
  ResNet50 model(*be, small_config());
  const auto& params = model.params();
  REQUIRE(params.size() == 161);
  // torchvision: 25,557,032 parameters with 1000 classes; the fc shrinks to 2048 * 10 + 10.
  REQUIRE(model.param_count() == 25557032u - (2048u * 1000u + 1000u) + (2048u * 10u + 10u));
  std::size_t offset = 0, decayed = 0;
  for (const auto& p : params) {
    CAPTURE(p.name);
    CHECK(p.offset == offset);
    offset += p.numel;
    const bool weight = p.name.ends_with(".weight") && p.shape.size() != 1;  // conv and fc weights
    CHECK(p.decay == weight);
    decayed += p.decay ? 1 : 0;
  }
  CHECK(decayed == 54);  // 53 convolutions and the fc
  CHECK(params.front().name == "conv1.weight");
  CHECK(params[3].name == "layer1.0.conv1.weight");
  CHECK(params[12].name == "layer1.0.downsample.0.weight");
  CHECK(params[14].name == "layer1.0.downsample.1.bias");
  CHECK(params[159].name == "fc.weight");
  CHECK(params[159].shape == std::vector<std::int64_t>{10, 2048});
  CHECK(params[160].name == "fc.bias");
  CHECK(model.buffers().size() == 53 * 3);
  CHECK(model.buffers()[2].name == "bn1.num_batches_tracked");
  CHECK(model.buffers()[2].dtype == wb::backend::DType::i64);
  CHECK(model.state_dict().size() == 161 + 159);
  CHECK(model.param_index("layer4.2.bn3.bias") == 158);
  CHECK(model.buffer_index("layer4.2.bn3.running_var") == 157);

  const auto names = ResNet50::module_names();
  CHECK(names[0] == "conv1");
  CHECK(names[2] == "relu");
  CHECK(names[4] == "layer1.0.conv1");
  CHECK(names[6] == "layer1.0.relu");
  CHECK(names[11] == "layer1.0.downsample.0");
  CHECK(names[13] == "layer1.0");
  CHECK(names[static_cast<std::size_t>(ResNet50::loss_module_id())] == "loss");
  CHECK(names[static_cast<std::size_t>(ResNet50::optimizer_module_id())] == "optimizer");
  CHECK(names[static_cast<std::size_t>(ResNet50::loss_module_id()) - 1] == "fc");
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
}

TEST_CASE("resnet50 initialisation follows torchvision and is deterministic per seed", "[trainer][model]") {
  auto be = wb::backend::make_cpu_backend({2});
  ResNet50 a(*be, small_config(11)), b(*be, small_config(11)), c(*be, small_config(12));
  const auto pa = a.params_to_host(), pb = b.params_to_host(), pc = c.params_to_host();
  REQUIRE(pa == pb);
  REQUIRE(pa != pc);
  for (const auto& p : a.params()) {
    CAPTURE(p.name);
    const float* v = pa.data() + p.offset;
    double sum = 0, sq = 0, mx = 0;
    for (std::size_t i = 0; i < p.numel; ++i) {
      sum += v[i];
      sq += static_cast<double>(v[i]) * v[i];
      mx = std::max(mx, std::abs(static_cast<double>(v[i])));
    }
    const double n = static_cast<double>(p.numel), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    if (p.shape.size() == 4) {  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out * k * k))
      const double want = std::sqrt(2.0 / static_cast<double>(p.shape[0] * p.shape[2] * p.shape[3]));
      CHECK_THAT(sd, WithinRel(want, 5.0 / std::sqrt(n) + 0.01));
      CHECK_THAT(mean, WithinAbs(0.0, 5.0 * want / std::sqrt(n)));
    } else if (p.name.starts_with("fc.")) {  // U(-1/sqrt(2048), 1/sqrt(2048))
      const double bound = 1.0 / std::sqrt(2048.0);
      CHECK(mx <= bound);
      if (p.numel > 1000) CHECK_THAT(sd, WithinRel(bound / std::sqrt(3.0), 0.05));
    } else if (p.name.ends_with(".weight")) {
      CHECK(sum == n);  // gamma = 1
    } else {
      CHECK(sq == 0.0);  // beta = 0
    }
  }
  const auto stats = a.running_stats_to_host();
  for (const auto& buf : a.buffers()) {
    if (buf.dtype != wb::backend::DType::f32) continue;
    const float want = buf.name.ends_with("running_var") ? 1.0f : 0.0f;
    CHECK(stats[buf.offset] == want);
  }
}

TEST_CASE("resnet50 observer: module ranges, output dumps and gradient readiness", "[trainer][model]") {
  auto be = wb::backend::make_cpu_backend({2});
  const auto cfg = small_config();
  const auto images = batch_images(cfg);
  const std::vector<std::int32_t> labels{1, 8};
  ResNet50 plain(*be, cfg), watched(*be, cfg);
  Recorder rec;
  rec.be = be.get();
  rec.want = true;
  watched.set_observer(&rec);

  const float l0 = plain.forward(images, labels);
  plain.backward();
  const float l1 = watched.forward(images, labels);
  watched.backward();
  wb::optim::Sgd sgd({0.9f, 1e-4f, false});
  sgd.step(watched, 0.1f);

  // Dumps: every module output once in execution order, relu calls numbered, block output last.
  REQUIRE(rec.outputs.size() == 4 + 16 * 10 + 4 * 2 + 2);
  CHECK(rec.outputs[0].first == "conv1");
  CHECK(rec.outputs[2].first == "relu");
  CHECK(rec.outputs[3].first == "maxpool");
  CHECK(rec.outputs[4].first == "layer1.0.conv1");
  CHECK(rec.outputs[6].first == "layer1.0.relu.0");
  CHECK(rec.outputs[9].first == "layer1.0.relu.1");
  CHECK(rec.outputs[11].first == "layer1.0.bn3");
  CHECK(rec.outputs[12].first == "layer1.0.downsample.0");
  CHECK(rec.outputs[13].first == "layer1.0.downsample.1");
  CHECK(rec.outputs[14].first == "layer1.0.relu.2");
  CHECK(rec.outputs[15].first == "layer1.0");
  CHECK(rec.outputs[15].second == std::vector<std::int64_t>{2, 256, 8, 8});
  CHECK(rec.outputs[rec.outputs.size() - 2].first == "avgpool");
  CHECK(rec.outputs[rec.outputs.size() - 2].second == std::vector<std::int64_t>{2, 2048, 1, 1});
  CHECK(rec.outputs.back().first == "fc");
  CHECK(rec.outputs.back().second == std::vector<std::int64_t>{2, 10});

  // Ranges: balanced and nested; the optimizer range once.
  CHECK(rec.nested_ok);
  CHECK(rec.stack.empty());
  CHECK(rec.ranges[Phase::optimizer] == 1);
  CHECK(rec.ranges[Phase::loss] == 2);
  CHECK(rec.ranges[Phase::forward] == rec.ranges[Phase::backward]);

  // Gradient readiness: in backward order, covering [0, 161) exactly once, fc first.
  REQUIRE(!rec.ready.empty());
  CHECK(rec.ready.front() == std::pair{159, 161});
  int expect_last = 161;
  for (auto [first, last] : rec.ready) {
    CAPTURE(first, last);
    CHECK(last == expect_last);
    CHECK(first < last);
    expect_last = first;
  }
  CHECK(expect_last == 0);

  // Observed (unfused bn + relu) and unobserved (fused) runs compute the same step.
  CHECK_THAT(l1, WithinRel(l0, 1e-6f));
  CHECK(wb::test::rel_l2(watched.logits_to_host(), plain.logits_to_host()) <= 1e-6);
  CHECK(wb::test::rel_l2(watched.grads_to_host(), plain.grads_to_host()) <= 1e-5);
}

TEST_CASE("resnet50 eval mode, batch counters, steady-state allocation and bad input", "[trainer][model]") {
  auto be = wb::backend::make_cpu_backend({2});
  auto& cpu = dynamic_cast<wb::backend::cpu::CpuBackend&>(*be);
  auto cfg = small_config();
  cfg.free_consumed_grads = 0;  // keep the activation gradients too: then a steady step allocates nothing
  ResNet50 model(*be, cfg);
  const auto images = batch_images(cfg);
  const std::vector<std::int32_t> labels{0, 9};
  wb::optim::Sgd sgd({0.9f, 1e-4f, true});
  for (int step = 0; step < 3; ++step) {
    if (step == 1) cpu.reset_stats();
    model.forward(images, labels);
    model.backward();
    sgd.step(model, 0.001f);  // small: batch 2 of one repeated batch diverges at 0.05, in torch too
  }
  CHECK(cpu.stats().allocations == 0);  // steps 2 and 3 reuse every tensor, slot and scratchpad
  CHECK(model.num_batches_tracked()[0] == 3);
  CHECK(model.num_batches_tracked()[52] == 3);

  const auto stats_before = model.running_stats_to_host();
  model.set_training(false);
  const float eval_loss = model.forward(images, labels);
  CHECK(std::isfinite(eval_loss));
  CHECK(model.running_stats_to_host() == stats_before);
  CHECK(model.num_batches_tracked()[0] == 3);
  REQUIRE_THROWS_AS(model.backward(), wb::model::ModelError);
  model.set_training(true);

  REQUIRE_THROWS_AS(model.forward(std::vector<float>(10), labels), wb::model::ModelError);
  REQUIRE_THROWS_AS(model.forward(images, std::vector<std::int32_t>{0}), wb::model::ModelError);
  REQUIRE_THROWS_AS(model.forward(images, std::vector<std::int32_t>{0, 10}), wb::backend::BackendError);
  auto bad = cfg;
  bad.image_size = 16;
  REQUIRE_THROWS_AS(ResNet50(*be, bad), wb::model::ModelError);
  bad = cfg;
  bad.num_classes = 0;
  REQUIRE_THROWS_AS(ResNet50(*be, bad), wb::model::ModelError);
}

TEST_CASE("resnet50 freeing consumed activation gradients changes no number", "[trainer][model]") {
  // Both backends free each activation gradient once consumed by default (the CUDA caching allocator
  // hands the block to the next gradient; on the CPU, malloc reuses it); kept or freed, the same steps
  // give bit-identical gradients and parameters, the tensors really are reallocated every step, and no
  // buffer guard is damaged.
  auto be_keep = wb::backend::make_cpu_backend({2});
  auto be_free = wb::backend::make_cpu_backend({2});
  auto& cpu_keep = dynamic_cast<wb::backend::cpu::CpuBackend&>(*be_keep);
  auto& cpu_free = dynamic_cast<wb::backend::cpu::CpuBackend&>(*be_free);
  auto cfg = small_config();
  cfg.free_consumed_grads = 0;
  ResNet50 keep(*be_keep, cfg);
  cfg.free_consumed_grads = 1;
  ResNet50 freed(*be_free, cfg);
  const auto images = batch_images(cfg);
  const std::vector<std::int32_t> labels{3, 7};
  wb::optim::Sgd sgd({0.9f, 1e-4f, false});
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    if (step == 1) {
      cpu_keep.reset_stats();
      cpu_free.reset_stats();
    }
    CHECK(keep.forward(images, labels) == freed.forward(images, labels));
    keep.backward();
    freed.backward();
    CHECK(keep.grads_to_host() == freed.grads_to_host());
    sgd.step(keep, 0.001f);
    sgd.step(freed, 0.001f);
    CHECK(keep.params_to_host() == freed.params_to_host());
  }
  CHECK(cpu_keep.stats().allocations == 0);
  CHECK(cpu_free.stats().allocations >= 2 * 50);  // every consumed gradient, in each of steps 2 and 3
  CHECK(cpu_keep.damaged_guards() == 0);
  CHECK(cpu_free.damaged_guards() == 0);
}
