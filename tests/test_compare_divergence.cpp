// The comparison pipeline on hand-built ResNet-50 step dumps: no false alarms, planted faults found
// as the first divergence and classified (local, inherited, optimizer-only, initial state), per-tensor
// reporting of shape mismatches, missing names and NaN, profiles and threshold overrides.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "compare/compare.hpp"
#include "compare/load.hpp"
#include "compare/test_support/tensor_sets.hpp"
#include "store/tensor_file.hpp"
#include "support/temp_dir.hpp"

using namespace wb::compare;
using wb::compare::testing::get_f32;
using wb::compare::testing::set_f32;
using wb::test::TempDir;

namespace {

// Step one of SGD from the set's own gradients: momentum = grad + wd * param, param_after =
// param - lr * momentum.
void sgd_step(TensorSet& s, float weight_decay) {
  for (auto& t : s.tensors) {
    if (kind_of_key(t.key) != TensorKind::param_after) continue;
    const std::string name(base_name(t.key));
    const auto& p = s.find("param." + name)->tensor;
    const auto& g = s.find("grad." + name)->tensor;
    auto& m = s.tensors[*s.position("momentum." + name)].tensor;
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const float mom = get_f32(g, i) + weight_decay * get_f32(p, i);
      set_f32(m, i, mom);
      set_f32(t.tensor, i, get_f32(p, i) - 0.1f * mom);
    }
  }
}

TensorSet reference_step() {
  TensorSet b = wb::compare::testing::make_set(wb::compare::testing::resnet50_step(2, 32, 10, 16), 42, "B");
  sgd_step(b, 1e-4f);
  return b;
}

TensorSet copy_of(const TensorSet& b) {
  TensorSet a = b;
  a.source = std::string("A");
  a.index();
  return a;
}

// Multiplies every element of a tensor by (1 + rel * u), u uniform in [-1, 1].
void perturb(TensorSet& s, const std::string& key, double rel, std::uint64_t seed) {
  auto& t = s.tensors[*s.position(key)].tensor;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::int64_t i = 0; i < t.numel(); ++i) set_f32(t, i, static_cast<float>(get_f32(t, i) * (1.0 + rel * u(rng))));
}

std::vector<std::string> act_keys(const TensorSet& s) {
  std::vector<std::string> out;
  for (std::size_t i : s.walk_order()) {
    if (kind_of_key(s.tensors[i].key) == TensorKind::act) out.push_back(s.tensors[i].key);
  }
  return out;
}

const RowResult& row_of(const Comparison& c, const std::string& name) {
  for (const auto& r : c.rows) {
    if (r.name == name) return r;
  }
  FAIL("no row " << name);
  return c.rows.front();
}

}  // namespace

TEST_CASE("a dump compared with itself has no failures in any profile", "[compare]") {
  const TensorSet b = reference_step();
  const TensorSet a = copy_of(b);
  for (Profile p : {Profile::migration_fp32, Profile::strict, Profile::msprobe}) {
    CAPTURE(profile_name(p));
    CompareOptions opt;
    opt.profile = p;
    const Comparison c = compare_sets(a, b, opt);
    CHECK(c.failed == 0);
    CHECK(c.passed == static_cast<std::int64_t>(b.tensors.size()));
    CHECK(c.all_pass());
    CHECK_FALSE(c.first_divergence);
  }
}

TEST_CASE("fp32-level noise on computed tensors is no alarm for migration-fp32", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  std::uint64_t seed = 1;
  for (const auto& t : b.tensors) {
    const TensorKind k = kind_of_key(t.key);
    if (t.tensor.dtype != wb::store::DType::F32) continue;
    if (k == TensorKind::act || k == TensorKind::loss) perturb(a, t.key, 1e-6, seed++);
    if (k == TensorKind::grad) perturb(a, t.key, 1e-2, seed++);
  }
  sgd_step(a, 1e-4f);  // a correct optimizer on the noisy gradients
  const Comparison c = compare_sets(a, b);
  CHECK(c.failed == 0);
  // The same noise fails torch.testing's fp32 tolerance.
  CompareOptions strict;
  strict.profile = Profile::strict;
  CHECK(compare_sets(a, b, strict).failed > 0);
}

TEST_CASE("a planted local fault is the first divergence, classified local, with its worst elements", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  const auto acts = act_keys(b);
  const std::string bad = "act.layer2.0.conv2";
  const auto at = std::find(acts.begin(), acts.end(), bad);
  REQUIRE(at != acts.end());
  // Tiny error before the fault; a 1e-2 error from the fault on, carried into everything after it.
  std::uint64_t seed = 10;
  for (auto it = acts.begin(); it != acts.end(); ++it) perturb(a, *it, it < at ? 1e-6 : 2e-2, seed++);
  // Three elements stand out.
  auto& t = a.tensors[*a.position(bad)].tensor;
  set_f32(t, 17, get_f32(t, 17) + 50.0f);
  set_f32(t, 3, get_f32(t, 3) - 40.0f);
  set_f32(t, 200, get_f32(t, 200) + 30.0f);

  const Comparison c = compare_sets(a, b);
  REQUIRE(c.first_divergence);
  const FirstDivergence& d = *c.first_divergence;
  CHECK(d.name == bad);
  CHECK(d.kind == TensorKind::act);
  CHECK(d.local);
  CHECK_FALSE(d.optimizer_only);
  CHECK(d.input_name == *(at - 1));
  REQUIRE(d.jump);
  CHECK(*d.jump >= kLocalJump);
  REQUIRE(d.worst.size() == 5);
  CHECK(d.worst[0].index == 17);
  CHECK(d.worst[1].index == 3);
  CHECK(d.worst[2].index == 200);
  const auto& shape = b.find(bad)->tensor.shape;
  CHECK(d.worst[0].coord == unravel_index(17, shape));
  CHECK_THAT(d.worst[0].abs_err, Catch::Matchers::WithinRel(50.0, 1e-3));
  CHECK(d.summary.find("local") != std::string::npos);
  CHECK(c.failed > 1);  // the later activations fail too, but they are not the first
}

TEST_CASE("an error growing slowly along the depth is classified inherited", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  const auto acts = act_keys(b);
  // rel error 1e-5 * 1.25^k: crosses the 1e-3 activation limit somewhere, 1.25x above its input.
  double rel = 1e-5;
  std::uint64_t seed = 100;
  std::string first_over;
  for (const auto& k : acts) {
    perturb(a, k, rel, seed++);
    rel *= 1.25;
  }
  const Comparison c = compare_sets(a, b);
  REQUIRE(c.first_divergence);
  const FirstDivergence& d = *c.first_divergence;
  CHECK(d.kind == TensorKind::act);
  CHECK_FALSE(d.local);
  REQUIRE(d.jump);
  CHECK(*d.jump < kLocalJump);
  CHECK(d.jump.value() > 1.0);
  CHECK(d.summary.find("inherited") != std::string::npos);
  // It is the first activation over the limit.
  for (const auto& r : c.rows) {
    if (r.name == d.name) break;
    CHECK_FALSE(r.failed());
  }
}

TEST_CASE("gradients passing but an update failing is an optimizer-only divergence", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  // Weight decay 10x too large for layer3.1.conv2: the update changes, the gradients do not.
  const std::string name = "layer3.1.conv2.weight";
  const auto& p = b.find("param." + name)->tensor;
  const auto& g = b.find("grad." + name)->tensor;
  auto& pa = a.tensors[*a.position("param_after." + name)].tensor;
  auto& m = a.tensors[*a.position("momentum." + name)].tensor;
  for (std::int64_t i = 0; i < p.numel(); ++i) {
    const float mom = get_f32(g, i) + 1.0f * get_f32(p, i);
    set_f32(m, i, mom);
    set_f32(pa, i, get_f32(p, i) - 0.1f * mom);
  }
  const Comparison c = compare_sets(a, b);
  REQUIRE(c.first_divergence);
  const FirstDivergence& d = *c.first_divergence;
  CHECK(d.name == "param_after." + name);
  CHECK(d.optimizer_only);
  CHECK(d.input_name == "grad." + name);
  CHECK(d.summary.find("Optimizer-only") != std::string::npos);
  const RowResult& row = row_of(c, "param_after." + name);
  REQUIRE(row.update_metrics);
  CHECK(row.update_metrics->rel_l2 > 0.5);
  CHECK(row_of(c, "momentum." + name).failed());
  for (const auto& r : c.rows) {
    if (r.kind == TensorKind::grad) CHECK_FALSE(r.failed());
  }
}

TEST_CASE("a missing weight decay is caught through momentum - grad as optimizer-only", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  sgd_step(a, 0.0f);
  const Comparison c = compare_sets(a, b);
  REQUIRE(c.first_divergence);
  const FirstDivergence& d = *c.first_divergence;
  CHECK(d.kind == TensorKind::momentum);
  CHECK(d.optimizer_only);
  CHECK(d.reason.rfind("momentum-grad rel-L2", 0) == 0);  // the values alone pass
  for (const auto& r : c.rows) {
    if (r.kind == TensorKind::param_after || r.kind == TensorKind::grad) CHECK_FALSE(r.failed());
  }
}

TEST_CASE("initial weights that are not bit-exact diverge first", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  auto& w = a.tensors[*a.position("param.layer1.0.conv1.weight")].tensor;
  set_f32(w, 5, std::nextafter(get_f32(w, 5), 10.0f));  // one ulp
  const Comparison c = compare_sets(a, b);
  REQUIRE(c.first_divergence);
  CHECK(c.first_divergence->name == "param.layer1.0.conv1.weight");
  CHECK(c.first_divergence->reason.find("bit-exact") != std::string::npos);
  CHECK(c.failed == 1);
  // msprobe's rule does not ask for bit-exactness.
  CompareOptions ms;
  ms.profile = Profile::msprobe;
  CHECK(compare_sets(a, b, ms).failed == 0);
}

TEST_CASE("shape mismatches, missing names and NaN are reported per tensor", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  a.tensors.erase(a.tensors.begin() + static_cast<std::ptrdiff_t>(*a.position("act.fc")));
  a.tensors.push_back({"act.extra", 10'000, wb::store::HostTensor{"act.extra", wb::store::DType::F32, {3}, std::vector<std::byte>(12)}});
  auto& shaped = a.tensors[*a.position("act.layer1.0.conv1")].tensor;
  shaped.shape = {static_cast<std::int64_t>(shaped.numel())};  // flattened
  auto& nan_t = a.tensors[*a.position("act.layer3.0.bn1")].tensor;
  set_f32(nan_t, 7, std::numeric_limits<float>::quiet_NaN());
  a.index();

  CompareOptions opt;
  opt.auto_match = false;
  const Comparison c = compare_sets(a, b, opt);
  CHECK(row_of(c, "act.fc").status == RowStatus::missing_a);
  CHECK(row_of(c, "act.extra").status == RowStatus::missing_b);
  CHECK(row_of(c, "act.layer1.0.conv1").status == RowStatus::shape_mismatch);
  CHECK(row_of(c, "act.layer1.0.conv1").reason.find("shape mismatch") != std::string::npos);
  const RowResult& nan_row = row_of(c, "act.layer3.0.bn1");
  CHECK(nan_row.status == RowStatus::fail);
  REQUIRE(nan_row.metrics);
  CHECK(nan_row.metrics->a.nan_count == 1);
  CHECK_FALSE(nan_row.metrics->nonfinite_positions_match());
  CHECK(c.missing_a == 1);
  CHECK(c.missing_b == 1);
  CHECK(c.failed == 2);
  REQUIRE(c.first_divergence);
  CHECK(c.first_divergence->name == "act.layer1.0.conv1");  // the shape mismatch comes first in the walk
  CHECK(c.first_divergence->local);
}

TEST_CASE("thresholds from the mapping file override the profile per tensor", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  perturb(a, "act.layer4.0.bn2", 5e-3, 9);
  REQUIRE(compare_sets(a, b).failed == 1);
  const MappingFile map = parse_mapping(nlohmann::json::parse(R"({"thresholds": [
      {"match": "^act\\.layer4\\.0\\.bn2$", "rel_l2_max": 1e-2, "cosine_min": 0.999}]})"), "inline");
  CompareOptions opt;
  opt.mapping = &map;
  const Comparison c = compare_sets(a, b, opt);
  CHECK(c.failed == 0);
  const RowResult& r = row_of(c, "act.layer4.0.bn2");
  REQUIRE(r.thresholds.rel_l2_max);
  CHECK(*r.thresholds.rel_l2_max == 1e-2);
  CHECK(*row_of(c, "act.layer4.0.bn1").thresholds.rel_l2_max == 1e-3);
  const MappingFile bad = parse_mapping(nlohmann::json::parse(R"({"thresholds": [{"match": "act", "cos_min": 1}]})"), "inline");
  opt.mapping = &bad;
  REQUIRE_THROWS_AS(compare_sets(a, b, opt), CompareError);
}

TEST_CASE("profiles judge the same differences differently", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  // Activations perturbed 1e-5 relative: fine for migration-fp32 and msprobe, too much for fp32 assert_close.
  std::uint64_t seed = 1000;
  for (const auto& k : act_keys(b)) perturb(a, k, 1e-5, seed++);
  auto failed = [&](Profile p) {
    CompareOptions o;
    o.profile = p;
    return compare_sets(a, b, o).failed;
  };
  CHECK(failed(Profile::migration_fp32) == 0);
  CHECK(failed(Profile::msprobe) == 0);
  CHECK(failed(Profile::strict) > 0);
  // A max abs error over 1 fails msprobe even with a cosine near 1.
  auto& t = a.tensors[*a.position("act.layer4.2.bn3")].tensor;
  set_f32(t, 0, get_f32(t, 0) + 1.5f);
  CHECK(failed(Profile::msprobe) == 1);
  REQUIRE_THROWS_AS(profile_from_name("fp16"), CompareError);
}

TEST_CASE("nothing matching at all is bad input", "[compare]") {
  const TensorSet b = wb::compare::testing::make_set({{"act.x", {2, 2}}}, 1, "B");
  const TensorSet a = wb::compare::testing::make_set({{"act.y", {3}}}, 1, "A");
  REQUIRE_THROWS_AS(compare_sets(a, b), CompareError);
}

TEST_CASE("int32 labels against int64 ones, and a 0-d loss against a [1] one, pass with a note", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  for (auto& t : a.tensors) {
    if (t.key == "label") {  // PyTorch's int64 labels as a port's int32 ones, the same values
      REQUIRE(t.tensor.dtype == wb::store::DType::I64);
      std::vector<std::byte> narrow(t.tensor.data.size() / 2);
      for (std::size_t i = 0; i < narrow.size() / 4; ++i) {
        std::int64_t v;
        std::memcpy(&v, t.tensor.data.data() + 8 * i, 8);
        const auto w = static_cast<std::int32_t>(v);
        std::memcpy(narrow.data() + 4 * i, &w, 4);
      }
      t.tensor.dtype = wb::store::DType::I32;
      t.tensor.data = narrow;
    }
    if (t.key == "loss") {
      REQUIRE(t.tensor.shape.empty());
      t.tensor.shape = {1};
    }
  }
  const Comparison c = compare_sets(a, b);
  CHECK(c.failed == 0);
  CHECK_FALSE(c.first_divergence);
  const RowResult& label = row_of(c, "label");
  CHECK(label.status == wb::compare::RowStatus::pass);
  CHECK(label.reason.find("dtypes differ: I32 vs I64") != std::string::npos);
  const RowResult& loss = row_of(c, "loss");
  CHECK(loss.status == wb::compare::RowStatus::pass);
  CHECK(loss.reason.find("hold one value each") != std::string::npos);

  // A different label is still a failure, whatever the widths.
  for (auto& t : a.tensors) {
    if (t.key == "label") t.tensor.data[0] = std::byte{static_cast<unsigned char>(std::to_integer<int>(t.tensor.data[0]) ^ 1)};
  }
  CHECK(row_of(compare_sets(a, b), "label").status == wb::compare::RowStatus::fail);
}

namespace {

// The set's tensors as files write them: keys in alphabetical order, no recorded execution order.
TensorSet alphabetical(const TensorSet& s, const std::string& source) {
  TensorSet out = s;
  out.source = source;
  std::sort(out.tensors.begin(), out.tensors.end(), [](const NamedTensor& x, const NamedTensor& y) { return x.key < y.key; });
  for (std::size_t i = 0; i < out.tensors.size(); ++i) out.tensors[i].exec_order = static_cast<std::int64_t>(i);
  out.order_source = OrderSource::derived;
  out.order_origin = "alphabetical keys";
  out.index();
  return out;
}

}  // namespace

TEST_CASE("the walk follows the side that recorded an execution order, never a file's key order", "[compare]") {
  TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  a.order_source = OrderSource::recorded;
  a.order_origin = "the run file's exec_order";
  // An early fault carried into every later activation: alphabetically act.avgpool comes first.
  const auto acts = act_keys(b);
  const auto at = std::find(acts.begin(), acts.end(), "act.layer1.0.conv1");
  REQUIRE(at != acts.end());
  std::uint64_t seed = 300;
  for (auto it = at; it != acts.end(); ++it) perturb(a, *it, 2e-2, seed++);
  const TensorSet b_alpha = alphabetical(b, "B");

  const Comparison c = compare_sets(a, b_alpha);
  CHECK(c.order_side == "A");
  CHECK(c.order_note.find("the run file's exec_order") != std::string::npos);
  REQUIRE(c.first_divergence);
  CHECK(c.first_divergence->name == "act.layer1.0.conv1");
  CHECK(c.first_divergence->local);

  // With the sides swapped the reference's recorded order leads, and the answer is the same.
  TensorSet a_alpha = alphabetical(a, "A");
  TensorSet b_rec = b;
  b_rec.order_source = OrderSource::recorded;
  b_rec.order_origin = "__metadata__";
  const Comparison swapped = compare_sets(a_alpha, b_rec);
  CHECK(swapped.order_side == "B");
  REQUIRE(swapped.first_divergence);
  CHECK(swapped.first_divergence->name == "act.layer1.0.conv1");

  // Neither side recorded one: loaded from files with alphabetical keys, the ResNet-50 module order
  // known from the names puts every activation in forward order, and the output says so.
  TempDir dir;
  auto save = [&](const TensorSet& s, const std::string& name) {
    std::vector<wb::store::HostTensor> tensors;
    for (const auto& t : alphabetical(s, name).tensors) {
      tensors.push_back(t.tensor);
      tensors.back().name = t.key;
    }
    wb::store::write_safetensors(dir.path() / name, tensors);
    return load_tensor_set(dir.path() / name);
  };
  const TensorSet fa = save(a, "a.safetensors"), fb = save(b, "b.safetensors");
  CHECK(fa.order_source == OrderSource::derived);
  const Comparison none = compare_sets(fa, fb);
  CHECK(none.order_side == "none");
  CHECK(none.order_note.find("neither side recorded one") != std::string::npos);
  REQUIRE(none.first_divergence);
  CHECK(none.first_divergence->name == "act.layer1.0.conv1");
  std::vector<std::string> walked;
  for (const auto& r : none.rows) {
    if (r.kind == TensorKind::act) walked.push_back(r.name);
  }
  CHECK(walked == acts);
}

TEST_CASE("the ResNet-50 forward order is known from the names alone", "[compare]") {
  // The trainer's activation names in the order it runs them (as tests/test_compare_reference.cpp
  // lists them), and the state in torchvision's state_dict order.
  std::vector<std::string> names = {"conv1", "bn1", "relu", "maxpool"};
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    for (int blk = 0; blk < blocks[stage]; ++blk) {
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(blk);
      for (const char* s : {".conv1", ".bn1", ".relu.0", ".conv2", ".bn2", ".relu.1", ".conv3", ".bn3"}) names.push_back(p + s);
      if (blk == 0) {
        names.push_back(p + ".downsample.0");
        names.push_back(p + ".downsample.1");
      }
      names.push_back(p + ".relu.2");
      names.push_back(p);
    }
  }
  names.push_back("avgpool");
  names.push_back("fc");
  std::vector<std::int64_t> ranks;
  for (const auto& n : names) {
    CAPTURE(n);
    const auto r = resnet50_forward_rank(n);
    REQUIRE(r);
    ranks.push_back(*r);
  }
  CHECK(std::is_sorted(ranks.begin(), ranks.end()));
  CHECK(std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end());
  std::vector<std::int64_t> state;
  for (const auto& e : wb::compare::testing::resnet50_state(10)) state.push_back(*resnet50_forward_rank(base_name(e.key)));
  CHECK(std::is_sorted(state.begin(), state.end()));
  for (const char* other : {"encoder.0", "layer5.0.conv1", "layer1.0.conv9", "layer1.x.conv1", "fc.weight.extra", ""}) {
    CAPTURE(other);
    CHECK_FALSE(resnet50_forward_rank(other));
  }
}

TEST_CASE("a 1% scale hidden in gradient noise is a systematic-scale divergence", "[compare]") {
  const TensorSet b = reference_step();
  TensorSet a = copy_of(b);
  std::uint64_t seed = 500;
  for (const auto& t : b.tensors) {
    if (kind_of_key(t.key) == TensorKind::grad) perturb(a, t.key, 1e-2, seed++);
  }
  const std::string scaled = "grad.layer3.0.conv2.weight";
  auto& g = a.tensors[*a.position(scaled)].tensor;
  for (std::int64_t i = 0; i < g.numel(); ++i) set_f32(g, i, 1.01f * get_f32(g, i));
  sgd_step(a, 1e-4f);
  const Comparison c = compare_sets(a, b);
  const RowResult& row = row_of(c, scaled);
  REQUIRE(row.metrics);
  CHECK(row.metrics->rel_l2 < 0.1);  // within the gradient limit: rel-L2 and cosine cannot see it
  CHECK(row.metrics->cosine > 0.995);
  CHECK_THAT(row.metrics->scale, Catch::Matchers::WithinAbs(1.01, 2e-3));
  CHECK(row.status == RowStatus::fail);
  CHECK(row.reason.find("scaled by 1.01 (systematic)") != std::string::npos);
  REQUIRE(c.first_divergence);
  CHECK(c.first_divergence->name == scaled);
  CHECK(c.first_divergence->local);
  CHECK(c.first_divergence->summary.find("scaled by 1.01 (systematic)") != std::string::npos);
  // The noise alone flags no other gradient.
  for (const auto& r : c.rows) {
    if (r.kind == TensorKind::grad && r.name != scaled) CHECK(r.status == RowStatus::pass);
  }
}
