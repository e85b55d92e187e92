// Noise-aware verdicts on hand-built ResNet-50 step dumps: a tensor is judged against the reference's
// own float32 noise (wb.noise, NoiseScale) as max(floor, 5x noise), the fixed thresholds stay the
// floor of a well-conditioned tensor, the first-divergence reading counts in units of noise, the
// console lists failing rows and the rows nearest their bound, and a malformed wb.noise is one error.
// Every expected figure is recomputed here in double from the tensors, not read from the comparison.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <sstream>

#include "compare/compare.hpp"
#include "compare/load.hpp"
#include "compare/report.hpp"
#include "compare/test_support/tensor_sets.hpp"
#include "store/tensor_file.hpp"
#include "support/temp_dir.hpp"

using namespace wb::compare;
using wb::compare::testing::get_f32;
using wb::compare::testing::set_f32;
using wb::test::TempDir;

namespace {

TensorSet reference_set() {
  return wb::compare::testing::make_set(wb::compare::testing::resnet50_step(2, 32, 10, 16), 42, "B");
}

TensorSet copy_of(const TensorSet& b) {
  TensorSet a = b;
  a.source = "A";
  a.index();
  return a;
}

double norm_of(const wb::store::HostTensor& t) {
  double s = 0.0;
  for (std::int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(get_f32(t, i)) * get_f32(t, i);
  return std::sqrt(s);
}

double distance(const TensorSet& a, const TensorSet& b, const std::string& key) {
  const auto& x = a.find(key)->tensor;
  const auto& y = b.find(key)->tensor;
  double s = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double d = static_cast<double>(get_f32(x, i)) - get_f32(y, i);
    s += d * d;
  }
  return std::sqrt(s);
}

// Adds a random error of rel-L2 exactly `rel` (in double, before rounding to float) to one tensor.
void plant_error(TensorSet& s, const std::string& key, double rel, std::uint64_t seed) {
  auto& t = s.tensors[*s.position(key)].tensor;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> e(static_cast<std::size_t>(t.numel()));
  double en = 0.0;
  for (double& v : e) {
    v = n(rng);
    en += v * v;
  }
  const double scale = rel * norm_of(t) / std::sqrt(en);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    set_f32(t, i, static_cast<float>(get_f32(t, i) + scale * e[static_cast<std::size_t>(i)]));
  }
}

// Records a noise of rel-L2 `rel` on the reference's tensor `key`.
void set_noise(TensorSet& b, const std::string& key, double rel) {
  NoiseScale n;
  n.ref_l2 = norm_of(b.find(key)->tensor);
  n.l2 = rel * n.ref_l2;
  n.max_abs = n.l2;
  b.noise[key] = n;
  b.noise_method = "test";
}

const RowResult& row_of(const Comparison& c, const std::string& name) {
  for (const auto& r : c.rows) {
    if (r.name == name) return r;
  }
  FAIL("no row " << name);
  return c.rows.front();
}

}  // namespace

TEST_CASE("an ill-conditioned tensor within 5x its reference noise passes; without the noise it fails",
          "[compare][noise]") {
  TensorSet b = reference_set();
  TensorSet a = copy_of(b);
  const std::string key = "act.layer4.2.bn3";
  plant_error(a, key, 2e-3, 1);

  const Comparison fixed = compare_sets(a, b);
  CHECK(row_of(fixed, key).status == RowStatus::fail);  // fixed rel-L2 <= 1e-3
  CHECK(fixed.noise_note.find("fixed thresholds") != std::string::npos);

  set_noise(b, key, 1e-3);  // PyTorch's own float32 result is 1e-3 from float64 here
  const Comparison noisy = compare_sets(a, b);
  const RowResult& r = row_of(noisy, key);
  CHECK(r.status == RowStatus::pass);
  CHECK(r.noise_applied);
  const double expected_ratio = distance(a, b, key) / b.noise.at(key).l2;
  CHECK(*r.noise_ratio == Approx(expected_ratio).epsilon(1e-9));
  CHECK(*r.noise_ratio == Approx(2.0).epsilon(1e-3));
  CHECK(*r.bounds.rel_l2_max == Approx(5e-3).epsilon(1e-6));
  CHECK(*r.bound_use == Approx(2e-3 / 5e-3).epsilon(1e-3));
  CHECK(*r.bounds.cosine_min == Approx(0.9999));  // the fixed cosine bound is the tighter one
  CHECK(noisy.all_pass());
  CHECK(noisy.noise_note.find("on 1 of") != std::string::npos);

  // The same error at 7x the noise fails, with the noise rule named.
  TensorSet far = copy_of(b);
  plant_error(far, key, 7e-3, 2);
  const Comparison c_f = compare_sets(far, b);
  const RowResult& f = row_of(c_f, key);
  CHECK(f.status == RowStatus::fail);
  CHECK(f.reason.find("rel-L2") != std::string::npos);
  CHECK(*f.bound_use > 1.0);
}

TEST_CASE("a well-conditioned tensor keeps the floor: a 1% error fails however small its noise", "[compare][noise]") {
  TensorSet b = reference_set();
  TensorSet a = copy_of(b);
  const std::string key = "act.layer1.0.conv1";
  plant_error(a, key, 1e-2, 3);
  set_noise(b, key, 1e-7);
  const Comparison c_r = compare_sets(a, b);
  const RowResult& r = row_of(c_r, key);
  CHECK(r.status == RowStatus::fail);
  CHECK(*r.bounds.rel_l2_max == Approx(1e-3));
  CHECK(*r.noise_ratio == Approx(1e5).epsilon(1e-3));
}

TEST_CASE("a gradient judged against its noise: its fixed 0.1 is the floor, an ill-conditioned one gets 5x its noise",
          "[compare][noise]") {
  TensorSet b = reference_set();
  const std::string key = "grad.layer3.0.conv2.weight";
  TensorSet a = copy_of(b);
  plant_error(a, key, 0.15, 4);

  CHECK(row_of(compare_sets(a, b), key).status == RowStatus::fail);  // fixed: rel-L2 <= 0.1, cos >= 0.995

  set_noise(b, key, 1e-4);  // well conditioned: the floor, max(0.1, 5e-4)
  const Comparison c_tight = compare_sets(a, b);
  const RowResult& tight = row_of(c_tight, key);
  CHECK(tight.status == RowStatus::fail);
  CHECK(*tight.bounds.rel_l2_max == Approx(0.1));
  CHECK(*tight.bounds.cosine_min == Approx(0.995));

  set_noise(b, key, 5e-2);  // ill conditioned: 0.25, and the cosine bound widens to sqrt(1 - 0.25^2)
  const Comparison c_loose = compare_sets(a, b);
  const RowResult& loose = row_of(c_loose, key);
  CHECK(loose.status == RowStatus::pass);
  CHECK(*loose.bounds.rel_l2_max == Approx(0.25));
  CHECK(*loose.bounds.cosine_min == Approx(std::sqrt(1.0 - 0.0625)));
}

TEST_CASE("a scale is systematic only when it stands 3x clear of the reference's noise", "[compare][noise]") {
  TensorSet b = reference_set();
  const std::string key = "grad.layer4.2.conv3.weight";
  TensorSet a = copy_of(b);
  auto& t = a.tensors[*a.position(key)].tensor;
  for (std::int64_t i = 0; i < t.numel(); ++i) set_f32(t, i, get_f32(t, i) * 1.05f);
  set_noise(b, key, 1e-3);  // 3e-3 of scale could be noise; 5e-2 cannot
  const Comparison c1 = compare_sets(a, b);
  CHECK(row_of(c1, key).status == RowStatus::fail);
  CHECK(row_of(c1, key).reason.find("(systematic)") != std::string::npos);
  set_noise(b, key, 2e-2);  // noise along b could reach 6e-2: a 5% scale is within it
  const Comparison c2 = compare_sets(a, b);
  CHECK(row_of(c2, key).status == RowStatus::pass);
  CHECK(*row_of(c2, key).bounds.scale_shift_min == Approx(6e-2));
}

TEST_CASE("the loss's absolute bound grows to 5x its noise, never under 1e-4", "[compare][noise]") {
  TensorSet b = reference_set();
  TensorSet a = copy_of(b);
  auto& loss = a.tensors[*a.position("loss")].tensor;
  set_f32(loss, 0, get_f32(loss, 0) + 3e-4f);
  CHECK(row_of(compare_sets(a, b), "loss").status == RowStatus::fail);
  NoiseScale n;
  n.l2 = n.max_abs = 1e-4;
  n.ref_l2 = std::fabs(get_f32(b.find("loss")->tensor, 0));
  b.noise["loss"] = n;
  const Comparison c_r = compare_sets(a, b);
  const RowResult& r = row_of(c_r, "loss");
  CHECK(r.status == RowStatus::pass);
  CHECK(*r.bounds.max_abs_max == Approx(5e-4));
  n.l2 = n.max_abs = 1e-8;
  b.noise["loss"] = n;
  CHECK(row_of(compare_sets(a, b), "loss").status == RowStatus::fail);
}

TEST_CASE("first divergence in units of noise: growing as the noise grows is inherited, outgrowing it is local",
          "[compare][noise]") {
  TensorSet b = reference_set();
  const std::string input = "act.layer4.2.conv3", key = "act.layer4.2.bn3";
  set_noise(b, input, 1e-3);
  set_noise(b, key, 1e-3);

  TensorSet inherited = copy_of(b);
  plant_error(inherited, input, 3e-3, 5);  // 3x its noise: passes
  plant_error(inherited, key, 6e-3, 6);    // 6x: fails, but only 2x its input's ratio
  const Comparison c1 = compare_sets(inherited, b);
  REQUIRE(c1.first_divergence);
  CHECK(c1.first_divergence->name == key);
  const double jump1 = (distance(inherited, b, key) / b.noise.at(key).l2) /
                       (distance(inherited, b, input) / b.noise.at(input).l2);
  CHECK(*c1.first_divergence->jump == Approx(jump1).epsilon(1e-9));
  CHECK_FALSE(c1.first_divergence->local);
  CHECK(c1.first_divergence->summary.find("inherited") != std::string::npos);

  TensorSet local = copy_of(b);
  plant_error(local, input, 1e-3, 7);  // 1x its noise
  plant_error(local, key, 5e-2, 8);    // 50x
  const Comparison c2 = compare_sets(local, b);
  REQUIRE(c2.first_divergence);
  CHECK(c2.first_divergence->name == key);
  CHECK(c2.first_divergence->local);
  CHECK(*c2.first_divergence->jump == Approx(50.0).epsilon(1e-2));
  CHECK(c2.first_divergence->summary.find("likely cause") != std::string::npos);
}

TEST_CASE("a noise-dominated reference is not judged, nor what its error feeds", "[compare][noise]") {
  TensorSet b = reference_set();
  TensorSet a = copy_of(b);
  plant_error(a, "act.fc", 0.7, 10);
  auto& loss = a.tensors[*a.position("loss")].tensor;
  set_f32(loss, 0, get_f32(loss, 0) + 0.5f);
  set_noise(b, "act.fc", 0.8);  // PyTorch's own logits are mostly rounding noise
  const Comparison c = compare_sets(a, b);
  const RowResult& fc = row_of(c, "act.fc");
  CHECK(fc.status == RowStatus::skipped);
  CHECK(fc.reason.find("ill-conditioned") != std::string::npos);
  const RowResult& l = row_of(c, "loss");  // its own noise is unknown, but its input is noise
  CHECK(l.status == RowStatus::skipped);
  CHECK(l.reason.find("its input act.fc") != std::string::npos);
  CHECK(row_of(c, "grad.fc.weight").status == RowStatus::skipped);  // the backward starts from the loss
  CHECK(row_of(c, "act.avgpool").status == RowStatus::pass);        // before it, judged as ever
  CHECK(c.all_pass());
  CHECK(c.noise_note.find("not judged at all") != std::string::npos);
}

TEST_CASE("the console lists the failing rows and the passing rows nearest their bound; --all lists every row",
          "[compare][noise]") {
  TensorSet b = reference_set();
  TensorSet a = copy_of(b);
  plant_error(a, "act.layer2.0.conv2", 5e-2, 9);
  const Comparison c = compare_sets(a, b);
  std::ostringstream brief, all;
  print_table(brief, c);
  TableOptions every;
  every.all = true;
  print_table(all, c, every);
  const std::string s = brief.str(), t = all.str();
  CHECK(s.find("failing (") != std::string::npos);
  CHECK(s.find("nearest their bound (10 of") != std::string::npos);
  CHECK(s.find("act.layer2.0.conv2") != std::string::npos);
  // Per kind counts, and far fewer lines than rows.
  CHECK(s.find("nearest its bound") != std::string::npos);
  const auto lines = [](const std::string& x) { return std::count(x.begin(), x.end(), '\n'); };
  CHECK(lines(s) < 80);
  CHECK(lines(t) > static_cast<long>(c.rows.size()));
  // One line per row in --all (status PASS or FAIL here: nothing is missing), against 1 + 10 by default.
  const auto status_lines = [](const std::string& x) {
    std::istringstream in(x);
    long n = 0;
    for (std::string line; std::getline(in, line);) n += line.find("  PASS  ") != std::string::npos || line.find("  FAIL  ") != std::string::npos;
    return n;
  };
  CHECK(status_lines(t) == static_cast<long>(c.rows.size()));
  CHECK(status_lines(s) == 11);
}

TEST_CASE("wb.noise in a reference is read, and a malformed one is one error naming the file", "[compare][noise]") {
  TempDir dir("wb-noise");
  const TensorSet b = reference_set();
  std::vector<wb::store::HostTensor> tensors;
  for (const auto& t : b.tensors) {
    tensors.push_back(t.tensor);
    tensors.back().name = t.key;
  }
  const auto path = dir.path() / "ref.safetensors";
  wb::store::write_safetensors(
      path, tensors,
      {{"wb.noise", R"({"version": 1, "method": "float64 replay", "tensors": {"loss": {"l2": 1e-7, "max_abs": 1e-7,
        "ref_l2": 2.3, "flip_l2": 2e-7, "input_l2": 3e-6}, "param_after.fc.bias": {"l2": 1e-9, "max_abs": 1e-9, "ref_l2": 0.5}},
        "updates": {"param_after.fc.bias": {"l2": 2e-9, "ref_l2": 0.01}}})"}});
  const TensorSet loaded = load_tensor_set(path);
  REQUIRE(loaded.noise.size() == 2);
  CHECK(loaded.noise.at("loss").l2 == 1e-7);
  CHECK(loaded.noise.at("loss").value_l2() == 3e-6);  // the largest of rounding, flips and the input's
  CHECK(loaded.noise.at("param_after.fc.bias").update_l2 == 2e-9);
  CHECK(loaded.noise_method == "float64 replay");

  for (const std::string bad : {R"({"version": 2, "tensors": {}})", R"({"tensors": {"loss": {"l2": -1}}})",
                                R"({"tensors": []})", "not json"}) {
    CAPTURE(bad);
    wb::store::write_safetensors(path, tensors, {{"wb.noise", bad}});
    try {
      load_tensor_set(path);
      FAIL("no error");
    } catch (const CompareError& e) {
      const std::string what = e.what();
      CHECK(what.find(path.string()) != std::string::npos);
      CHECK(what.find("wb.noise") != std::string::npos);
      CHECK(what.find('\n') == std::string::npos);
    }
  }
}
