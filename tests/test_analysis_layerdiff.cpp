// wb diff's arithmetic on hand-built runs with known answers: per-layer time per step over the steps
// compared, kernels attributed through the launching range to its innermost layer, totals per op type,
// the step split, rows in execution order with a layer only B has in its place, ratio, time lost and
// the top list; runs without steps or layers are clear errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "profiler/analysis/layer_diff.hpp"
#include "profiler/analysis/run_data.hpp"
#include "store/writer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using namespace wb;
using store::Category;

namespace {

struct Layer {
  const char* name;
  Category dir;
  std::int64_t ns;  // duration in step s: ns + s * grow
  std::int64_t grow;
};

// Steps of 10 us; layers back to back from 1 us into the step, each with one child op; the conv
// layers' child ops launch `kernels` kernels of 700 ns each.
void write_run(const fs::path& path, const std::vector<Layer>& layers, int steps, int kernels) {
  store::WriterOptions o;
  o.path = path;
  o.handle_signals = false;
  store::Writer w(o);
  auto main = w.add_track(store::TrackKind::thread, "main");
  auto stream = w.add_track(store::TrackKind::stream, "stream 7");
  std::uint64_t corr = 1;
  for (int s = 0; s < steps; ++s) {
    const std::int64_t t0 = 1'000'000 + s * 100'000;
    w.add(store::RangeRow{main, w.intern("step"), t0, t0 + 90'000, static_cast<std::uint8_t>(Category::step), 0, s, 0});
    std::int64_t t = t0 + 1000;
    for (const auto& l : layers) {
      const std::int64_t d = l.ns + s * l.grow;
      std::string name = l.name;
      bool block = name == "layer1.0";
      std::uint8_t depth = block ? 1 : (name.rfind("layer1.0.", 0) == 0 ? 2 : 1);
      w.add(store::RangeRow{main, w.intern(l.name), t, t + d, static_cast<std::uint8_t>(l.dir), depth, s, 0});
      if (block) continue;  // its layers follow inside it
      bool conv = name.find("conv") != std::string::npos;
      std::uint64_t c = conv ? corr++ : 0;
      w.add(store::RangeRow{main, w.intern("aten::op"), t + 1, t + d - 1, static_cast<std::uint8_t>(l.dir),
                            static_cast<std::uint8_t>(depth + 1), s, c});
      for (int k = 0; conv && k < kernels; ++k) {
        store::KernelRow kr;
        kr.track = stream;
        kr.name = w.intern("kernel");
        kr.start_ns = t + 10 + k * 1000;
        kr.end_ns = kr.start_ns + 700;
        kr.corr_id = c;
        w.add(kr);
      }
      t += d;
    }
    store::StepRow sr;
    sr.step = s;
    sr.start_ns = t0;
    sr.end_ns = t0 + 90'000;
    sr.data_wait_ns = 5000;
    w.add(sr);
  }
  w.finish();
}

}  // namespace

TEST_CASE("layer times: means over the steps compared, kernels by launching range, totals per type", "[analysis]") {
  wb::test::TempDir dir;
  const std::vector<Layer> a_layers = {
      {"conv1", Category::forward, 3000, 100},     {"bn1", Category::forward, 1000, 0},
      {"layer1.0", Category::forward, 2000, 0},    {"layer1.0.conv1", Category::forward, 2000, 0},
      {"fc", Category::forward, 500, 0},           {"loss", Category::loss, 200, 0},
      {"fc", Category::backward, 900, 0},          {"conv1", Category::backward, 6000, 300},
      {"optimizer", Category::optimizer, 800, 0},
  };
  write_run(dir / "a.sqlite", a_layers, 4, 2);
  analysis::RunData run = analysis::load_run(dir / "a.sqlite");
  analysis::RunLayers got = analysis::layer_times(run);  // 4 steps: step 0 left out
  REQUIRE(got.steps == std::vector<int>{1, 2, 3});
  std::map<std::string, analysis::LayerTime> by;
  for (const auto& l : got.layers) by[l.name + "/" + std::string(store::category_name(l.direction))] = l;
  REQUIRE(by.size() == a_layers.size());
  // conv1 forward in steps 1..3: 3100, 3200, 3300
  CHECK(by["conv1/forward"].ns == 3200.0);
  CHECK(by["conv1/backward"].ns == 6600.0);
  CHECK(by["conv1/forward"].kernels == 2.0);
  CHECK(by["conv1/forward"].kernel_ns == 1400.0);
  CHECK(by["layer1.0.conv1/forward"].kernels == 2.0);
  CHECK(by["layer1.0/forward"].kernels == 0.0);  // the innermost layer takes the kernels
  CHECK(by["bn1/forward"].kernels == 0.0);
  CHECK(by["conv1/forward"].method == "name");
  CHECK(got.gpu);
  // order: forward by start, then loss, backward, optimizer
  std::vector<std::string> order;
  for (const auto& l : got.layers) order.push_back(l.name);
  CHECK(order == std::vector<std::string>{"conv1", "bn1", "layer1.0", "layer1.0.conv1", "fc", "loss", "fc", "conv1", "optimizer"});
  // conv: 3200 + 2000 + 6600; the block is no type's; other = step - leaf layers
  CHECK(got.type_ns[analysis::OpType::conv] == 11800.0);
  CHECK(got.type_ns[analysis::OpType::fc] == 1400.0);
  CHECK(got.type_ns[analysis::OpType::bn] == 1000.0);
  CHECK(got.type_ns[analysis::OpType::loss] == 200.0);
  CHECK(got.type_ns[analysis::OpType::optimizer] == 800.0);
  CHECK(got.type_ns[analysis::OpType::other] == 90000.0 - (11800 + 1400 + 1000 + 200 + 800));
  CHECK(got.split.step_ns == 90000.0);
  CHECK(got.split.data_wait_ns == 5000.0);

  analysis::LayerOptions all;
  all.skip_steps = 0;
  CHECK(analysis::layer_times(run, all).layers.front().ns == 3150.0);  // 3000..3300
  all.skip_steps = 4;
  CHECK_THROWS_AS(analysis::layer_times(run, all), analysis::AnalysisError);
  all.skip_steps = 0;
  all.rank = 3;
  CHECK_THROWS_AS(analysis::layer_times(run, all), analysis::AnalysisError);
}

TEST_CASE("layer diff: ratio, time lost, the top list, and a layer only B has in its place", "[analysis]") {
  wb::test::TempDir dir;
  write_run(dir / "a.sqlite",
            {{"conv1", Category::forward, 3000, 0}, {"bn1", Category::forward, 1000, 0}, {"fc", Category::forward, 500, 0},
             {"fc", Category::backward, 900, 0}, {"conv1", Category::backward, 6000, 0}},
            2, 0);
  write_run(dir / "b.sqlite",
            {{"conv1", Category::forward, 1000, 0}, {"bn1", Category::forward, 1000, 0}, {"relu", Category::forward, 300, 0},
             {"fc", Category::forward, 1000, 0}, {"fc", Category::backward, 900, 0}, {"conv1", Category::backward, 2000, 0}},
            2, 0);
  auto a = analysis::layer_times(analysis::load_run(dir / "a.sqlite"));
  auto b = analysis::layer_times(analysis::load_run(dir / "b.sqlite"));
  auto d = analysis::diff_layers(a, b, 3);
  std::vector<std::string> rows;
  for (const auto& r : d.rows) rows.push_back(r.name + "/" + std::string(store::category_name(r.direction)));
  CHECK(rows == std::vector<std::string>{"conv1/forward", "bn1/forward", "relu/forward", "fc/forward", "fc/backward",
                                         "conv1/backward"});
  CHECK(d.rows[0].ratio() == 3.0);
  CHECK(d.rows[0].lost_ns() == 2000.0);
  CHECK(!d.rows[2].a);
  CHECK(std::isnan(d.rows[2].ratio()));
  CHECK(d.rows[3].lost_ns() == -500.0);
  REQUIRE(d.top_lost.size() == 3);
  CHECK(d.rows[d.top_lost[0]].name == "conv1");  // backward: 4000 lost
  CHECK(d.rows[d.top_lost[0]].direction == Category::backward);
  CHECK(d.rows[d.top_lost[1]].lost_ns() == 2000.0);
  CHECK(d.rows[d.top_lost[2]].lost_ns() == 0.0);
  auto j = analysis::to_json(d);
  CHECK(j["layers"][2]["a"].is_null());
  CHECK(j["layers"][0]["ratio"] == 3.0);
  auto csv = analysis::to_csv(d);
  CHECK(csv.find("conv1,backward,conv,6000.000000,2000.000000,3.000000,4000") != std::string::npos);
  auto text = analysis::to_text(d, false);
  CHECK(text.find("Top 3 layers by time lost") != std::string::npos);
}

TEST_CASE("a run without layer ranges is a clear error", "[analysis]") {
  wb::test::TempDir dir;
  write_run(dir / "x.sqlite", {{"aten::conv2d", Category::forward, 100, 0}}, 1, 0);
  CHECK_THROWS_WITH(analysis::layer_times(analysis::load_run(dir / "x.sqlite")),
                    Catch::Contains("no layer ranges in the steps compared"));
}
