// The Precision view's data: a comparison saved in a run read back without the reference, the
// sides of a stored comparison located, per-channel errors and heat maps, and a tensor's detail, each
// with known answers.
#include <catch2/catch.hpp>

#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <imgui.h>

#include "app/model/child_process.hpp"
#include "app/model/layer_timing.hpp"
#include "app/model/ops_logic.hpp"
#include "app/model/synthetic_run.hpp"
#include "app/model/timeline_logic.hpp"
#include "app/view/app.hpp"
#include "compare/report.hpp"
#include "compare/stored_comparison.hpp"
#include "profiler/analysis/split_model.hpp"
#include "store/db.hpp"
#include "store_test_util.hpp"
#include "view_test_util.hpp"
#include "app/model/precision_model.hpp"
#include "app/model/run_model.hpp"
#include "compare/compare.hpp"

using wb::test::Headless;
using namespace wb::app_model;
using namespace wb::view;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

wb::store::HostTensor f32(const std::string& name, std::vector<std::int64_t> shape, const std::vector<float>& values) {
  wb::store::HostTensor t;
  t.name = name;
  t.dtype = wb::store::DType::F32;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(float));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

// A small step dump: input, two activations, the loss and a gradient, as a dumper names them.
wb::compare::TensorSet dump(const std::string& source, float act2_error) {
  wb::compare::TensorSet s;
  s.source = source;
  std::vector<float> input(2 * 3 * 4 * 4), act1(2 * 4 * 4 * 4), act2(2 * 4 * 2 * 2), grad(4 * 3 * 3 * 3);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < act1.size(); ++i) act1[i] = std::cos(0.11f * static_cast<float>(i)) + 0.5f;
  for (std::size_t i = 0; i < act2.size(); ++i) act2[i] = 1.0f + 0.01f * static_cast<float>(i);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = 0.001f * static_cast<float>(i % 7) - 0.003f;
  // A planted local fault: act.layer1 departs from the reference by act2_error (relative) in element 5.
  act2[5] *= 1.0f + act2_error;
  s.tensors.push_back({"input", 0, f32("input", {2, 3, 4, 4}, input)});
  s.tensors.push_back({"act.conv1", 1, f32("act.conv1", {2, 4, 4, 4}, act1)});
  s.tensors.push_back({"act.layer1", 2, f32("act.layer1", {2, 4, 2, 2}, act2)});
  s.tensors.push_back({"loss", 3, f32("loss", {}, {2.302585f})});
  s.tensors.push_back({"grad.conv1.weight", 4, f32("grad.conv1.weight", {4, 3, 3, 3}, grad)});
  s.index();
  return s;
}

}  // namespace

TEST_CASE("a comparison saved in a run reads back equal, without the reference", "[app]") {
  wb::test::TempDir dir;
  const auto run = dir / "run.sqlite";
  SyntheticRun spec;
  spec.ranks = 1;
  spec.steps = 2;
  spec.ranges_per_rank = 50;
  write_synthetic_run(run, spec);
  const auto a = dump("A", 0.2f), b = dump("B", 0.0f);
  const auto computed = wb::compare::compare_sets(a, b);
  REQUIRE(computed.first_divergence);
  REQUIRE(computed.failed >= 1);
  const std::int64_t id = wb::compare::save_to_run(run, computed);

  wb::compare::StoredComparison stored = wb::compare::read_stored_comparison(run, id);
  const auto& c = stored.comparison;
  CHECK(stored.header.id == id);
  REQUIRE(c.rows.size() == computed.rows.size());
  CHECK(c.passed == computed.passed);
  CHECK(c.failed == computed.failed);
  CHECK(c.missing_a == computed.missing_a);
  CHECK(c.missing_b == computed.missing_b);
  CHECK(c.profile == computed.profile);
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    CAPTURE(i, computed.rows[i].name);
    const auto& r = c.rows[i];
    const auto& e = computed.rows[i];
    CHECK(r.name == e.name);
    CHECK(r.kind == e.kind);
    CHECK(r.status == e.status);
    CHECK(r.b_shape == e.b_shape);
    CHECK(r.reason == e.reason);
    REQUIRE(r.metrics.has_value() == e.metrics.has_value());
    if (e.metrics) {
      CHECK_THAT(r.metrics->rel_l2, WithinRel(e.metrics->rel_l2, 1e-12) || WithinAbs(e.metrics->rel_l2, 1e-300));
      CHECK_THAT(r.metrics->cosine, WithinRel(e.metrics->cosine, 1e-12));
      CHECK_THAT(r.metrics->max_abs, WithinRel(e.metrics->max_abs, 1e-12) || WithinAbs(e.metrics->max_abs, 1e-300));
      CHECK(r.metrics->max_abs_index == e.metrics->max_abs_index);
    }
    CHECK(r.thresholds.rel_l2_max == e.thresholds.rel_l2_max);
    CHECK(r.thresholds.cosine_min == e.thresholds.cosine_min);
    CHECK_FALSE(r.a_index.has_value());  // no tensors attached yet
  }
  REQUIRE(c.first_divergence);
  CHECK(c.first_divergence->name == "act.layer1");
  CHECK(c.first_divergence->name == computed.first_divergence->name);
  CHECK(c.first_divergence->row == computed.first_divergence->row);
  CHECK(c.first_divergence->local == computed.first_divergence->local);
  REQUIRE(c.first_divergence->worst.size() == computed.first_divergence->worst.size());
  CHECK(c.first_divergence->worst.front().index == 5);

  // Linking the rows to tensors again makes the detail computable.
  auto linked = c;
  wb::compare::attach_sets(linked, a, b);
  for (const auto& r : linked.rows) {
    CHECK(r.a_index == a.position(r.a_key));
    CHECK(r.b_index == b.position(r.b_key));
  }

  REQUIRE_THROWS_AS(wb::compare::read_stored_comparison(run, id + 5), wb::compare::CompareError);
  REQUIRE_THROWS_AS(wb::compare::read_stored_comparison(dir / "missing.sqlite", 1), wb::store::StoreError);
}

TEST_CASE("the sides of a stored comparison are found where they are, or reported gone", "[app]") {
  wb::test::TempDir dir;
  const auto run = dir / "run.sqlite";
  { std::ofstream(run) << "x"; }
  { std::ofstream(dir / "ref.safetensors") << "x"; }
  CHECK(wb::compare::locate_side((dir / "ref.safetensors").string(), run) == dir / "ref.safetensors");
  CHECK(wb::compare::locate_side("ref.safetensors", run) == dir / "ref.safetensors");  // relative to another directory: beside the run
  CHECK(wb::compare::locate_side("some/where/run.sqlite", run) == run);  // the run itself, moved
  CHECK_FALSE(wb::compare::locate_side((dir / "gone.safetensors").string(), run).has_value());
}

TEST_CASE("per-channel errors and heat maps have known answers", "[app]") {
  // (N=1, C=2, H=2, W=2): channel 0 differs by 1 at one element, channel 1 is equal.
  std::vector<double> b = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<double> a = b;
  a[3] = 5;  // channel 0, (1,1)
  auto ch = channel_errors(a, b, {1, 2, 2, 2}, 1);
  REQUIRE(ch.max_abs.size() == 2);
  CHECK_THAT(ch.max_abs[0], WithinAbs(1.0, 0.0));
  CHECK_THAT(ch.max_abs[1], WithinAbs(0.0, 0.0));
  CHECK_THAT(ch.rel_l2[0], WithinRel(1.0 / std::sqrt(1 + 4 + 9 + 16.0), 1e-12));
  CHECK_THAT(ch.rel_l2[1], WithinAbs(0.0, 0.0));
  auto h = heat_map(a, b, {1, 2, 2, 2}, 0, 0);
  CHECK(h.rows == 2);
  CHECK(h.cols == 2);
  CHECK(h.values == std::vector<double>{0, 0, 0, 1});
  CHECK_THAT(h.max, WithinAbs(1.0, 0.0));
  auto h1 = heat_map(a, b, {1, 2, 2, 2}, 0, 1);
  CHECK_THAT(h1.max, WithinAbs(0.0, 0.0));
  // A parameter (O=2, I=4): channels along axis 0, heat map of the whole matrix.
  CHECK(channel_axis(wb::compare::TensorKind::param, {2, 4}) == 0);
  CHECK(channel_axis(wb::compare::TensorKind::act, {8, 64, 4, 4}) == 1);
  CHECK(channel_axis(wb::compare::TensorKind::loss, {}) == -1);
  auto hp = heat_map(a, b, {2, 4}, 0, 0);
  CHECK(hp.rows == 2);
  CHECK(hp.cols == 4);
  CHECK_THAT(hp.values[3], WithinAbs(1.0, 0.0));
  // Error only in b-zero channel: +inf relative error.
  auto zero = channel_errors({1, 0}, {0, 0}, {2}, 0);
  CHECK(std::isinf(zero.rel_l2[0]));
}

TEST_CASE("a tensor's detail: histograms over a shared range, error bins, worst elements", "[app]") {
  auto make = [](const std::string& key, std::vector<float> v, std::vector<std::int64_t> shape) {
    wb::compare::NamedTensor t;
    t.key = key;
    t.tensor.name = key;
    t.tensor.dtype = wb::store::DType::F32;
    t.tensor.shape = std::move(shape);
    t.tensor.data.resize(v.size() * 4);
    std::memcpy(t.tensor.data.data(), v.data(), v.size() * 4);
    return t;
  };
  PrecisionData data;
  data.a.tensors.push_back(make("act.conv1", {0, 1, 2, 3, 4, 5, 6, 7.5f}, {1, 2, 2, 2}));
  data.b.tensors.push_back(make("act.conv1", {0, 1, 2, 3, 4, 5, 6, 7}, {1, 2, 2, 2}));
  data.a.index();
  data.b.index();
  data.comparison = wb::compare::compare_sets(data.a, data.b);
  REQUIRE(data.comparison.rows.size() == 1);
  auto d = tensor_detail(data, 0, 0, 1, 8);
  CHECK(d.equal == 7);
  CHECK(d.err_hist.counts.size() == 1);  // one unequal element: a one-bin range
  CHECK(d.a_hist.edges.front() == 0.0);
  CHECK_THAT(d.a_hist.edges.back(), WithinAbs(7.5, 1e-12));
  CHECK(d.b_hist.edges == d.a_hist.edges);
  REQUIRE_FALSE(d.worst.empty());
  CHECK(d.worst[0].index == 7);
  CHECK(d.worst[0].coord == std::vector<std::int64_t>{0, 1, 1, 1});
  CHECK_THAT(d.worst[0].abs_err, WithinAbs(0.5, 1e-6));
  CHECK_THAT(d.heat.values[3], WithinAbs(0.5, 1e-6));  // channel 1, (1,1)
  CHECK_THAT(d.channels.max_abs[1], WithinAbs(0.5, 1e-6));
  REQUIRE_THROWS_AS(tensor_detail(data, 5, 0, 0), wb::compare::CompareError);
}
