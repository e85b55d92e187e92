// Our own step's noise (compare/noise_estimate.hpp) on hand-built ResNet-50 step dumps: a "replay" that
// moves some tensors by a known amount. Every figure is recomputed here in double from the tensors; the
// replay of another step is refused; and a comparison whose reference records no noise judges A's rows
// within 5x A's estimate, the reference's own noise winning when it has one.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "compare/compare.hpp"
#include "compare/noise_estimate.hpp"
#include "compare/test_support/tensor_sets.hpp"

using namespace wb::compare;
using wb::compare::testing::get_f32;
using wb::compare::testing::set_f32;

namespace {

TensorSet dump_set() { return wb::compare::testing::make_set(wb::compare::testing::resnet50_step(2, 32, 10, 16), 7, "dump"); }

TensorSet copy_of(const TensorSet& s, const std::string& source) {
  TensorSet c = s;
  c.source = source;
  c.index();
  return c;
}

wb::store::HostTensor& tensor(TensorSet& s, const std::string& key) { return s.tensors[*s.position(key)].tensor; }

// Moves every element of one tensor by a seeded random amount of about `size`.
void jitter(TensorSet& s, const std::string& key, double size, std::uint64_t seed) {
  auto& t = tensor(s, key);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, size);
  for (std::int64_t i = 0; i < t.numel(); ++i) set_f32(t, i, static_cast<float>(get_f32(t, i) + n(rng)));
}

struct Expected {
  double l2 = 0, max_abs = 0, ref_l2 = 0;
};

// ||a - b||, max |a - b| and ||a|| in double, element by element.
Expected by_hand(const wb::store::HostTensor& a, const wb::store::HostTensor& b) {
  Expected e;
  double d2 = 0, a2 = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = get_f32(a, i), d = x - static_cast<double>(get_f32(b, i));
    d2 += d * d;
    a2 += x * x;
    e.max_abs = std::max(e.max_abs, std::abs(d));
  }
  e.l2 = std::sqrt(d2);
  e.ref_l2 = std::sqrt(a2);
  return e;
}

// The same of the updates (after - base) of both sides.
Expected update_by_hand(const wb::store::HostTensor& a, const wb::store::HostTensor& a0, const wb::store::HostTensor& b,
                        const wb::store::HostTensor& b0) {
  Expected e;
  double d2 = 0, a2 = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double ua = static_cast<double>(get_f32(a, i)) - get_f32(a0, i);
    const double ub = static_cast<double>(get_f32(b, i)) - get_f32(b0, i);
    d2 += (ua - ub) * (ua - ub);
    a2 += ua * ua;
  }
  e.l2 = std::sqrt(d2);
  e.ref_l2 = std::sqrt(a2);
  return e;
}

}  // namespace

TEST_CASE("estimate_noise: per tensor the replay's distance to the dump, computed by hand", "[compare][noise]") {
  const TensorSet dump = dump_set();
  TensorSet replay = copy_of(dump, "replay");
  jitter(replay, "act.layer4.2.bn3", 1e-3, 1);
  jitter(replay, "grad.layer1.0.conv1.weight", 1e-4, 2);
  jitter(replay, "param_after.fc.weight", 1e-5, 3);
  jitter(replay, "momentum.fc.weight", 1e-5, 4);
  jitter(replay, "grad.fc.weight", 1e-5, 5);

  const NoiseEstimate est = estimate_noise(dump, {&replay}, "test replay");
  const auto& t = est.json.at("tensors");
  CHECK(est.json.at("version") == 1);
  CHECK(est.json.at("method") == "test replay");
  CHECK(est.moved == 5);
  CHECK(t.size() == 5);
  // Every float tensor but the step's inputs (input, label, param, buffer) was looked at.
  std::int64_t outputs = 0;
  for (const auto& nt : dump.tensors) {
    const TensorKind k = kind_of_key(nt.key);
    outputs += k != TensorKind::input && k != TensorKind::label && k != TensorKind::param && k != TensorKind::buffer &&
               !nt.stats_only() && nt.tensor.dtype == wb::store::DType::F32;
  }
  CHECK(est.tensors == outputs);
  for (const char* key : {"act.layer4.2.bn3", "grad.layer1.0.conv1.weight", "param_after.fc.weight", "momentum.fc.weight",
                          "grad.fc.weight"}) {
    CAPTURE(key);
    const Expected e = by_hand(dump.find(key)->tensor, replay.find(key)->tensor);
    REQUIRE(t.contains(key));
    CHECK(t.at(key).at("l2").get<double>() == Approx(e.l2).epsilon(1e-12));
    CHECK(t.at(key).at("max_abs").get<double>() == Approx(e.max_abs).epsilon(1e-12));
    CHECK(t.at(key).at("ref_l2").get<double>() == Approx(e.ref_l2).epsilon(1e-12));
    CHECK(e.l2 > 0.0);
  }
  // A tensor the replay left unchanged is not recorded: it measured nothing and keeps the fixed bounds.
  CHECK_FALSE(t.contains("act.layer1.0.conv1"));
  // The updates: param_after - param (the params are equal, so the update moved as param_after did), and
  // momentum - grad (both moved).
  const auto& u = est.json.at("updates");
  const Expected pa = update_by_hand(dump.find("param_after.fc.weight")->tensor, dump.find("param.fc.weight")->tensor,
                                     replay.find("param_after.fc.weight")->tensor, replay.find("param.fc.weight")->tensor);
  const Expected mo = update_by_hand(dump.find("momentum.fc.weight")->tensor, dump.find("grad.fc.weight")->tensor,
                                     replay.find("momentum.fc.weight")->tensor, replay.find("grad.fc.weight")->tensor);
  CHECK(u.at("param_after.fc.weight").at("l2").get<double>() == Approx(pa.l2).epsilon(1e-12));
  CHECK(u.at("param_after.fc.weight").at("ref_l2").get<double>() == Approx(pa.ref_l2).epsilon(1e-12));
  CHECK(u.at("momentum.fc.weight").at("l2").get<double>() == Approx(mo.l2).epsilon(1e-12));
  CHECK(u.at("momentum.fc.weight").at("ref_l2").get<double>() == Approx(mo.ref_l2).epsilon(1e-12));
}

TEST_CASE("estimate_noise keeps the largest distance of several replays", "[compare][noise]") {
  const TensorSet dump = dump_set();
  TensorSet small = copy_of(dump, "small"), large = copy_of(dump, "large");
  jitter(small, "grad.fc.weight", 1e-5, 21);
  jitter(small, "act.fc", 1e-3, 22);  // act.fc: the first replay moves it more
  jitter(large, "grad.fc.weight", 1e-3, 23);
  jitter(large, "act.fc", 1e-5, 24);
  const NoiseEstimate est = estimate_noise(dump, {&small, &large}, "two");
  const auto& t = est.json.at("tensors");
  CHECK(est.moved == 2);
  const Expected g_small = by_hand(dump.find("grad.fc.weight")->tensor, small.find("grad.fc.weight")->tensor);
  const Expected g_large = by_hand(dump.find("grad.fc.weight")->tensor, large.find("grad.fc.weight")->tensor);
  const Expected a_small = by_hand(dump.find("act.fc")->tensor, small.find("act.fc")->tensor);
  const Expected a_large = by_hand(dump.find("act.fc")->tensor, large.find("act.fc")->tensor);
  REQUIRE(g_large.l2 > g_small.l2);
  REQUIRE(a_small.l2 > a_large.l2);
  CHECK(t.at("grad.fc.weight").at("l2").get<double>() == Approx(g_large.l2).epsilon(1e-12));
  CHECK(t.at("grad.fc.weight").at("max_abs").get<double>() == Approx(std::max(g_small.max_abs, g_large.max_abs)).epsilon(1e-12));
  CHECK(t.at("act.fc").at("l2").get<double>() == Approx(a_small.l2).epsilon(1e-12));
  // One replay alone gives its own distance: the order of the replays does not matter.
  const NoiseEstimate reversed = estimate_noise(dump, {&large, &small}, "two");
  CHECK(reversed.json.at("tensors") == t);
}

TEST_CASE("estimate_noise refuses a replay that is not the same step", "[compare][noise]") {
  const TensorSet dump = dump_set();
  for (const char* key : {"input", "param.layer3.0.conv2.weight", "buffer.bn1.running_var"}) {
    CAPTURE(key);
    TensorSet replay = copy_of(dump, "replay");
    auto& t = tensor(replay, key);
    set_f32(t, 0, get_f32(t, 0) + 1e-6f);
    try {
      estimate_noise(dump, {&replay}, "test");
      FAIL("accepted a replay whose " << key << " differs");
    } catch (const CompareError& e) {
      const std::string what = e.what();
      CHECK(what.find(key) != std::string::npos);
      CHECK(what.find("not the same step") != std::string::npos);
    }
  }
}

TEST_CASE("compare judges A's rows within 5x A's own noise when the reference records none", "[compare][noise]") {
  const TensorSet dump = dump_set();
  TensorSet replay = copy_of(dump, "replay");
  const std::string key = "act.layer4.2.bn3";
  jitter(replay, key, 2e-3, 11);  // our own noise on that tensor, rel-L2 r
  const NoiseEstimate est = estimate_noise(dump, {&replay}, "test replay");
  const double noise = est.json.at("tensors").at(key).at("l2").get<double>();
  const double ref_l2 = est.json.at("tensors").at(key).at("ref_l2").get<double>();
  REQUIRE(noise / ref_l2 > 1e-3);  // over the fixed 1e-3 bound of activations

  // A: the dump with its estimate; B: a reference 2x our noise away on that tensor (rel-L2 over 1e-3).
  TensorSet a = copy_of(dump, "A");
  NoiseScale n;
  n.l2 = noise;
  n.max_abs = est.json.at("tensors").at(key).at("max_abs").get<double>();
  n.ref_l2 = ref_l2;
  a.noise[key] = n;
  a.noise_method = "test replay";
  TensorSet b = copy_of(dump, "B");
  jitter(b, key, 4e-3, 12);

  CompareOptions o;
  const Comparison with_ours = compare_sets(a, b, o);
  const RowResult* row = nullptr;
  for (const auto& r : with_ours.rows)
    if (r.name == key) row = &r;
  REQUIRE(row != nullptr);
  CHECK(row->noise_applied);
  CHECK(row->status == RowStatus::pass);
  CHECK(with_ours.noise_note.find("our own step's float32 noise (test replay") != std::string::npos);
  CHECK(with_ours.noise_source == "ours");

  // Planted error: without the estimate the same row fails the fixed bound.
  TensorSet plain = copy_of(dump, "A");
  const Comparison fixed = compare_sets(plain, b, o);
  CHECK(fixed.noise_source.empty());
  for (const auto& r : fixed.rows)
    if (r.name == key) CHECK(r.status == RowStatus::fail);

  // The reference's own noise, when it records one, is used instead of ours.
  TensorSet b_noisy = b;
  NoiseScale tiny = n;
  tiny.l2 = 1e-9 * ref_l2;
  b_noisy.noise[key] = tiny;
  b_noisy.noise_method = "float64";
  const Comparison theirs = compare_sets(a, b_noisy, o);
  for (const auto& r : theirs.rows)
    if (r.name == key) CHECK(r.status == RowStatus::fail);
  CHECK(theirs.noise_note.find("the reference's own float32 noise (float64)") != std::string::npos);
  CHECK(theirs.noise_source == "reference");
}
