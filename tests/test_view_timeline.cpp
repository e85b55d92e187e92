// The timeline's arithmetic with known answers: time <-> pixel mapping, zoom at the cursor, pan,
// sub-pixel merging (checked against a brute-force cover of the visible events), hit-testing, queue
// depth per pixel column, ticks, range-selection statistics and the step whose critical path is outlined.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "app/model/timeline_logic.hpp"

using namespace wb::app_model;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

Level make_level(const std::vector<std::pair<std::int64_t, std::int64_t>>& spans) {
  Level l;
  for (std::uint32_t i = 0; i < spans.size(); ++i) {
    l.spans.push_back({spans[i].first, spans[i].second});
    l.rows.push_back(i);
  }
  return l;
}

wb::store::RangeRow range(std::int64_t s, std::int64_t e, std::uint8_t depth, std::uint32_t name = 1, std::uint8_t cat = 0) {
  wb::store::RangeRow r;
  r.start_ns = s;
  r.end_ns = e;
  r.depth = depth;
  r.name = name;
  r.category = cat;
  return r;
}

}  // namespace

TEST_CASE("time and pixels map linearly both ways", "[app]") {
  TimeView v = fit_view(1000.0, 2000.0, 100.0, 0.0);
  CHECK_THAT(v.t0_ns, WithinAbs(1000.0, 1e-9));
  CHECK_THAT(v.t1_ns, WithinAbs(2000.0, 1e-9));
  CHECK_THAT(v.ns_per_px(), WithinAbs(10.0, 1e-12));
  CHECK_THAT(v.to_px(1500.0), WithinAbs(50.0, 1e-9));
  CHECK_THAT(v.to_time(25.0), WithinAbs(1250.0, 1e-9));
  CHECK_THAT(v.to_time(v.to_px(1234.5)), WithinAbs(1234.5, 1e-9));
  // A 2 % margin on each side.
  TimeView m = fit_view(0.0, 1000.0, 100.0);
  CHECK_THAT(m.t0_ns, WithinAbs(-20.0, 1e-9));
  CHECK_THAT(m.t1_ns, WithinAbs(1020.0, 1e-9));
}

TEST_CASE("zoom keeps the time under the cursor and respects its limits", "[app]") {
  TimeView v{0.0, 1000.0, 100.0};
  SECTION("zoom in 2x at 25 px") {
    TimeView z = zoom_at(v, 25.0, 2.0);
    CHECK_THAT(z.span_ns(), WithinAbs(500.0, 1e-9));
    CHECK_THAT(z.to_time(25.0), WithinAbs(250.0, 1e-9));
    CHECK_THAT(z.t0_ns, WithinAbs(125.0, 1e-9));
    CHECK_THAT(z.t1_ns, WithinAbs(625.0, 1e-9));
  }
  SECTION("zoom out 4x at the right edge") {
    TimeView z = zoom_at(v, 100.0, 0.25);
    CHECK_THAT(z.span_ns(), WithinAbs(4000.0, 1e-9));
    CHECK_THAT(z.t1_ns, WithinAbs(1000.0, 1e-9));
  }
  SECTION("in then out returns to the start") {
    TimeView z = zoom_at(zoom_at(v, 37.0, 3.0), 37.0, 1.0 / 3.0);
    CHECK_THAT(z.t0_ns, WithinAbs(0.0, 1e-6));
    CHECK_THAT(z.t1_ns, WithinAbs(1000.0, 1e-6));
  }
  SECTION("limits") {
    CHECK_THAT(zoom_at(v, 50.0, 1e12).span_ns(), WithinAbs(kMinSpanNs, 1e-9));
    CHECK_THAT(zoom_at(v, 50.0, 1e-12, 5000.0).span_ns(), WithinAbs(5000.0, 1e-9));
  }
}

TEST_CASE("pan moves the window by pixels times ns per pixel and stays near the data", "[app]") {
  TimeView v{0.0, 1000.0, 100.0};
  TimeView p = pan_px(v, 10.0);  // drag right: earlier times come into view
  CHECK_THAT(p.t0_ns, WithinAbs(-100.0, 1e-9));
  CHECK_THAT(p.t1_ns, WithinAbs(900.0, 1e-9));
  TimeView far = pan_px(v, -100000.0);
  TimeView kept = keep_in(far, 0.0, 1000.0);
  CHECK_THAT(kept.span_ns(), WithinAbs(1000.0, 1e-9));
  CHECK(kept.t0_ns <= 1000.0 - 100.0 + 1e-9);  // at least a tenth of the window shows data
  TimeView kept2 = keep_in(pan_px(v, 100000.0), 0.0, 1000.0);
  CHECK(kept2.t1_ns >= 100.0 - 1e-9);
}

TEST_CASE("levels split a track's ranges by depth", "[app]") {
  std::vector<wb::store::RangeRow> rows = {range(0, 100, 0), range(10, 40, 1), range(15, 20, 2), range(50, 90, 1), range(200, 300, 0)};
  auto levels = build_levels(rows);
  REQUIRE(levels.size() == 3);
  CHECK(levels[0].rows == std::vector<std::uint32_t>{0, 4});
  CHECK(levels[1].rows == std::vector<std::uint32_t>{1, 3});
  CHECK(levels[2].rows == std::vector<std::uint32_t>{2});
  // Concurrent kernels go to the first level where they fit.
  std::vector<wb::store::KernelRow> ks(3);
  ks[0].start_ns = 0, ks[0].end_ns = 10;
  ks[1].start_ns = 5, ks[1].end_ns = 8;
  ks[2].start_ns = 10, ks[2].end_ns = 20;
  auto kl = build_levels(ks);
  REQUIRE(kl.size() == 2);
  CHECK(kl[0].rows == std::vector<std::uint32_t>{0, 2});
  CHECK(kl[1].rows == std::vector<std::uint32_t>{1});
}

TEST_CASE("sub-pixel events merge into runs; wide ones draw alone", "[app]") {
  // 100 events of 10 ns with 10 ns gaps over [0, 2000).
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;
  for (int i = 0; i < 100; ++i) spans.push_back({i * 20, i * 20 + 10});
  Level level = make_level(spans);
  std::vector<DrawRun> runs;
  SECTION("zoomed out: 1 px each, 1 px gaps -> one run of all 100") {
    visible_runs(level, TimeView{0.0, 2000.0, 200.0}, 3.0, runs);
    REQUIRE(runs.size() == 1);
    CHECK(runs[0].first == 0);
    CHECK(runs[0].count == 100);
    CHECK_THAT(runs[0].x0, WithinAbs(0.0, 1e-9));
    CHECK_THAT(runs[0].x1, WithinAbs(199.0, 1e-9));
  }
  SECTION("zoomed in: 10 px each -> every event alone") {
    visible_runs(level, TimeView{0.0, 2000.0, 2000.0}, 3.0, runs);
    REQUIRE(runs.size() == 100);
    for (std::uint32_t i = 0; i < 100; ++i) {
      CHECK(runs[i].first == i);
      CHECK(runs[i].count == 1);
      CHECK(runs[i].busy_ns == 10);
    }
  }
  SECTION("a window in the middle draws only what overlaps it") {
    visible_runs(level, TimeView{405.0, 615.0, 2100.0}, 3.0, runs);
    REQUIRE(runs.size() == 11);  // events 20 (400-410) .. 30 (600-610)
    CHECK(runs.front().first == 20);
    CHECK(runs.back().first == 30);
  }
  SECTION("a wide event splits the run") {
    spans[50] = {1000, 1015};
    spans.insert(spans.begin() + 51, {1015, 1300});  // wide: 28.5 px at 10 ns/px
    for (std::size_t i = 52; i < spans.size(); ++i) spans[i] = {spans[i].first + 300, spans[i].second + 300};
    Level l2 = make_level(spans);
    visible_runs(l2, TimeView{0.0, 2400.0, 240.0}, 3.0, runs);
    REQUIRE(runs.size() == 3);
    CHECK(runs[0].count == 51);
    CHECK(runs[1].count == 1);
    CHECK(runs[1].first == 51);
    CHECK(runs[2].count == 49);
  }
}

TEST_CASE("merged runs cover exactly the visible events (against brute force)", "[app]") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    CAPTURE(trial);
    std::vector<std::pair<std::int64_t, std::int64_t>> spans;
    std::int64_t t = 0;
    std::uniform_int_distribution<int> kind(0, 9);
    for (int i = 0; i < 2000; ++i) {
      t += kind(rng) < 7 ? static_cast<std::int64_t>(rng() % 30) : static_cast<std::int64_t>(rng() % 3000);
      std::int64_t d = kind(rng) < 8 ? 1 + static_cast<std::int64_t>(rng() % 20) : 100 + static_cast<std::int64_t>(rng() % 5000);
      spans.push_back({t, t + d});
      t += d;
    }
    Level level = make_level(spans);
    double t0 = static_cast<double>(rng() % static_cast<std::uint64_t>(t / 2));
    double t1 = t0 + 1000.0 + static_cast<double>(rng() % static_cast<std::uint64_t>(t / 2));
    TimeView view{t0, t1, 800.0};
    std::vector<DrawRun> runs;
    visible_runs(level, view, 3.0, runs);
    // Brute force: the events overlapping the window, in order.
    std::vector<std::uint32_t> visible;
    for (std::uint32_t i = 0; i < spans.size(); ++i)
      if (static_cast<double>(spans[i].second) >= t0 && static_cast<double>(spans[i].first) <= t1) visible.push_back(i);
    std::vector<std::uint32_t> covered;
    for (const auto& r : runs) {
      for (std::uint32_t k = r.first; k < r.first + r.count; ++k) covered.push_back(k);
      if (r.count > 1) {
        for (std::uint32_t k = r.first; k < r.first + r.count; ++k)  // every merged event is under 3 px
          CHECK(view.to_px(static_cast<double>(spans[k].second)) - view.to_px(static_cast<double>(spans[k].first)) < 3.0);
      }
    }
    // Merged runs may reach one event past the window's end (the run decides when it closes), never
    // skip or repeat one.
    REQUIRE(covered.size() >= visible.size());
    for (std::size_t i = 0; i < visible.size(); ++i) CHECK(covered[i] == visible[i]);
    for (std::size_t i = 1; i < covered.size(); ++i) CHECK(covered[i] == covered[i - 1] + 1);
    // A frame costs the pixels, not the events.
    CHECK(runs.size() <= 2 * static_cast<std::size_t>(view.width_px / 3.0) + 4);
  }
}

TEST_CASE("a million tiny events draw as a few hundred boxes", "[app]") {
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;
  spans.reserve(1000000);
  for (std::int64_t i = 0; i < 1000000; ++i) spans.push_back({i * 100, i * 100 + 60});
  Level level = make_level(spans);
  std::vector<DrawRun> runs;
  visible_runs(level, TimeView{0.0, 1e8, 1000.0}, 3.0, runs);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].count == 1000000);
  visible_runs(level, TimeView{5e7, 5e7 + 5000.0, 1000.0}, 3.0, runs);
  CHECK(runs.size() == 51);  // 5 ns/px: each 60 ns event is 12 px wide
}

TEST_CASE("hit-testing finds the event under a time, or the nearest within tolerance", "[app]") {
  Level level = make_level({{0, 10}, {20, 30}, {100, 200}});
  CHECK(hit_test(level, 5.0) == std::optional<std::uint32_t>(0));
  CHECK(hit_test(level, 10.0) == std::optional<std::uint32_t>(0));
  CHECK(hit_test(level, 150.0) == std::optional<std::uint32_t>(2));
  CHECK_FALSE(hit_test(level, 15.0).has_value());
  CHECK(hit_test(level, 14.0, 5.0) == std::optional<std::uint32_t>(0));  // 4 ns after event 0
  CHECK(hit_test(level, 17.0, 5.0) == std::optional<std::uint32_t>(1));  // 3 ns before event 1
  CHECK_FALSE(hit_test(level, 60.0, 5.0).has_value());
  CHECK_FALSE(hit_test(level, -100.0, 5.0).has_value());
  CHECK(hit_test(level, -3.0, 5.0) == std::optional<std::uint32_t>(0));
  CHECK_FALSE(hit_test(Level{}, 0.0, 100.0).has_value());
  CHECK(first_at_or_after(level, 15.0) == 1);
  CHECK(first_at_or_after(level, 500.0) == 3);
}

TEST_CASE("queue depth per pixel column keeps each column's min and max", "[app]") {
  std::vector<wb::store::CounterRow> samples;
  auto add = [&](std::int64_t t, double v) {
    wb::store::CounterRow c;
    c.t_ns = t;
    c.value = v;
    samples.push_back(c);
  };
  add(10, 1);
  add(12, 3);
  add(15, 0);
  add(35, 2);
  // 4 columns of 10 ns over [0, 40).
  auto cols = counter_columns(samples, TimeView{0.0, 40.0, 4.0}, 4);
  REQUIRE(cols.size() == 4);
  CHECK(std::isnan(cols[0].hi));  // before the first sample
  CHECK_THAT(cols[1].lo, WithinAbs(0.0, 0.0));
  CHECK_THAT(cols[1].hi, WithinAbs(3.0, 0.0));
  CHECK_THAT(cols[2].lo, WithinAbs(0.0, 0.0));  // holds 0 from t=15
  CHECK_THAT(cols[2].hi, WithinAbs(0.0, 0.0));
  CHECK_THAT(cols[3].lo, WithinAbs(0.0, 0.0));
  CHECK_THAT(cols[3].hi, WithinAbs(2.0, 0.0));
}

TEST_CASE("ticks step by 1-2-5 and label with the step's precision", "[app]") {
  CHECK_THAT(nice_step(1000.0, 5.0), WithinRel(200.0, 1e-12));
  CHECK_THAT(nice_step(7.0, 10.0), WithinRel(0.5, 1e-12));
  CHECK_THAT(nice_step(3e9, 6.0), WithinRel(5e8, 1e-12));
  auto t = ticks(0.1, 1.0, 0.25);
  REQUIRE(t.size() == 4);
  CHECK_THAT(t[0], WithinAbs(0.25, 1e-12));
  CHECK_THAT(t[3], WithinAbs(1.0, 1e-12));
  CHECK(format_tick(1.5e6, 5e5) == "1.5 ms");
  CHECK(format_tick(2e9, 1e9) == "2 s");
  CHECK(format_tick(-1e-3, 5e5) == "0.0 ms");
  CHECK(format_tick(250.0, 50.0) == "250 ns");
}

TEST_CASE("range-selection statistics clip events to the selection", "[app]") {
  std::vector<wb::store::RangeRow> rows = {range(0, 100, 0, 1, 7), range(10, 40, 1, 2, 0), range(50, 90, 1, 2, 0), range(60, 70, 2, 3, 1),
                                           range(200, 300, 0, 1, 7)};
  auto levels = build_levels(rows);
  SelectionStats stats(30, 65);
  for (const auto& l : levels) stats.add(l, rows);
  auto out = stats.result();
  REQUIRE(out.size() == 3);
  CHECK(out[0].name == 1);  // step 0: 35 ns inside
  CHECK(out[0].inside_ns == 35);
  CHECK(out[0].count == 1);
  CHECK(out[1].name == 2);  // [30,40) + [50,65) = 25 ns over two events
  CHECK(out[1].inside_ns == 25);
  CHECK(out[1].count == 2);
  CHECK(out[2].name == 3);  // [60,65)
  CHECK(out[2].inside_ns == 5);
}

TEST_CASE("the Timeline outlines the critical path of the step under the cursor, or of the pinned step", "[app]") {
  wb::analysis::CriticalPath cp;
  for (int s = 0; s < 3; ++s) {
    wb::analysis::StepPath p;
    p.step = s + 4;
    p.start_ns = 100 * s;
    p.end_ns = 100 * s + 90;  // 10 ns between steps
    cp.steps.push_back(p);
  }
  CHECK(path_step_at(cp, -1, 150.0)->step == 5);
  CHECK(path_step_at(cp, -1, 100.0)->step == 5);
  CHECK(path_step_at(cp, -1, 95.0) == nullptr);   // between steps
  CHECK(path_step_at(cp, -1, 1000.0) == nullptr);  // after the last
  CHECK(path_step_at(cp, 6, 10.0)->step == 6);     // pinned wins over the cursor
  CHECK(path_step_at(cp, 3, 10.0) == nullptr);     // a step without a path
  CHECK(path_step_at(wb::analysis::CriticalPath{}, -1, 10.0) == nullptr);
}
