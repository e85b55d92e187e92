// The Overview: a captured window clicked there shows its steps in the Timeline.
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

using wb::test::Headless;
using namespace wb::app_model;
using namespace wb::view;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

TEST_CASE("a captured window clicked in the Overview shows its steps in the Timeline", "[app]") {
  wb::test::TempDir dir;
  const auto file = dir / "captured.sqlite";
  SyntheticRun spec;
  spec.ranks = 1;
  spec.steps = 12;
  spec.ranges_per_rank = 600;
  write_synthetic_run(file, spec);
  std::int64_t t0 = 0, t1 = 0;
  {
    // Two windows as wb-train --capture writes them, and the times the second one covers.
    wb::store::Db db(file, wb::store::OpenMode::read_write);
    db.exec("INSERT INTO capture_window VALUES (0, 2, 4, 'slow', 3, 'step 3: 40.0 ms, 4.0x the running median (10.0 ms)');"
            "INSERT INTO capture_window VALUES (0, 8, 10, 'slow', 9, 'step 9: 50.0 ms, 5.0x the running median (10.0 ms)');"
            "INSERT OR REPLACE INTO meta VALUES ('capture', 'slow:3 (window 1)');");
    t0 = db.query_int64("SELECT start_ns FROM step WHERE step = 8");
    t1 = db.query_int64("SELECT end_ns FROM step WHERE step = 10");
  }
  Headless h;
  App::Options opt;
  opt.run = file.string();
  opt.persist_recent = false;
  App app(opt);
  for (int i = 0; i < 3000 && app.busy(); ++i) {
    h.frame(app);
    if (app.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE_FALSE(app.busy());
  REQUIRE(app.model);
  REQUIRE(app.model->run.capture_windows.size() == 2);
  h.frame(app);
  REQUIRE(app.current == ViewId::overview);
  REQUIRE(app.capture_rows.size() == 2);
  // A click on the second window's row, as a hand would: hover, press, release.
  const float x = app.capture_rows[1].first, y = app.capture_rows[1].second;
  auto frame_with_mouse = [&](bool down) {
    ImGuiIO& io = ImGui::GetIO();
    io.DeltaTime = 1.0f / 60;
    io.MousePos = ImVec2(x, y);
    io.MouseDown[0] = down;
    ImGui::NewFrame();
    app.frame();
    ImGui::Render();
  };
  frame_with_mouse(false);
  frame_with_mouse(true);
  frame_with_mouse(false);
  CHECK(app.current == ViewId::timeline);
  h.frame(app);  // the Timeline draws and takes the request
  CHECK_FALSE(app.timeline.zoom_to.has_value());
  const double pad = 0.02 * static_cast<double>(t1 - t0);
  CHECK_THAT(app.timeline.view.t0_ns, Catch::Matchers::WithinAbs(static_cast<double>(t0) - pad, 1.0));
  CHECK_THAT(app.timeline.view.t1_ns, Catch::Matchers::WithinAbs(static_cast<double>(t1) + pad, 1.0));
}
