// bench/view_frame: how fast wb-view opens a big run and draws the timeline. A synthetic run of 5M host
// ranges across 8 ranks (store::Writer, merged) is opened as the app opens it, then the timeline is
// drawn headless (ImGui NewFrame to Render, no GPU) zoomed out, mid and in.
//   full:     every row read and the timeline levels built (the first frame can draw), then the
//             analyses. Goals: open < 3 s, frame < 10 ms.
//   windowed: the run without its events and the summary's coarse levels (the first frame can draw);
//             each zoom then waits until its rows, or a summary fine enough, are read in the background;
//             the other views draw the analyses of a sample of steps, read after the timeline is ready.
//             Goals at 100M ranges: open < 2 s, the Overview complete < 3 s, a zoom shows in < 100 ms,
//             frame < 10 ms, peak RSS <= 1 GB (run with --keep on a written file, so the writing is not in
//             the peak). The synthetic run has about 600 ranges a step and rank unless --steps says.
//
//   view_frame [--ranges N] [--ranks R] [--steps S] [--file PATH] [--keep] [--mode full|windowed|both]
//              [--unsummarised]   (--keep reuses PATH when it exists; --unsummarised drops the file's
//                                  summary first, to time the one-time build an older file gets)
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <string>

#include <imgui.h>

#include "app/model/run_model.hpp"
#include "app/model/synthetic_run.hpp"
#include "app/view/app.hpp"
#include "store/db.hpp"

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

bool open_and_draw(const std::filesystem::path& file, wb::app_model::OpenMode open_mode) {
  using clock = std::chrono::steady_clock;
  // Open as the app does; CPU time tells contention on a shared machine apart from work.
  auto t_open = clock::now();
  const bool windowed = open_mode == wb::app_model::OpenMode::windowed;
  double cpu0 = cpu_seconds(), cpu_ready = 0.0;
  auto model = wb::app_model::load_run_model(
      file, nullptr, [&](const std::shared_ptr<const wb::app_model::RunModel>&) { cpu_ready = cpu_seconds(); }, open_mode);
  double total_open = std::chrono::duration<double>(clock::now() - t_open).count();
  const double goal_open = windowed ? 2.0 : 3.0;
  std::printf("%s open: %lld ranges, timeline ready in %.3f s wall, %.3f s CPU (goal < %.0f s); analyses %.3f s more; %.3f s in all\n",
              windowed ? "windowed" : "full", static_cast<long long>(model->range_count), model->open_seconds, cpu_ready - cpu0,
              goal_open, windowed ? total_open - model->open_seconds : model->analysis_seconds, total_open);
  bool ok = model->open_seconds < goal_open;
  if (windowed) {  // the analyses of a sample of steps: the Overview and the other views are complete
    auto sample = model->window->sample();
    if (sample && sample->sample) {
      const auto& s = *sample->sample;
      std::printf("windowed analyses: steps %d-%d (%d of %d steps, %lld of %lld ranges and kernels) in %.3f s; "
                  "the Overview complete %.3f s after the open began (goal < 3 s)\n",
                  s.first_step, s.last_step, s.steps, s.run_steps, static_cast<long long>(s.rows),
                  static_cast<long long>(s.run_rows), s.seconds, total_open);
      ok = ok && total_open < 3.0;
    } else {
      std::printf("windowed analyses: none (%s)\n", model->window->sample_status().c_str());
      ok = false;
    }
  }

  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;
  io.DisplaySize = ImVec2(1600, 1000);
  io.BackendFlags |= ImGuiBackendFlags_RendererHasVtxOffset;  // as wb-view's OpenGL 3.2 renderer
  unsigned char* pixels;
  int w, h;
  io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
  wb::view::App::Options opt;
  opt.persist_recent = false;
  opt.view = wb::view::ViewId::timeline;
  wb::view::App app(opt);
  app.set_model(model);
  auto frame = [&] {
    io.DeltaTime = 1.0f / 60.0f;
    ImGui::NewFrame();
    app.frame();
    ImGui::Render();
    return ImGui::GetDrawData()->TotalVtxCount;
  };
  for (int i = 0; i < 3; ++i) frame();  // lanes built, view fitted

  const double full = static_cast<double>(model->t_max_ns - model->t_min_ns);
  const double mid = static_cast<double>(model->t_min_ns) + full * 0.5;
  struct Zoom {
    const char* name;
    double span;
    double pan = 0.0;  // then panned by this many windows
  } zooms[] = {{"zoomed out (whole run)", full * 1.04},
               {"mid (1/50 of the run)", full / 50},
               {"1/2000 of the run", full / 2000},
               {"1/20000 of the run", full / 20000},
               {"panned a window right", full / 20000, 1.0},
               {"in (50 us)", 50'000.0}};
  for (const auto& z : zooms) {
    app.timeline.view.t0_ns = mid - z.span / 2 + z.pan * z.span;
    app.timeline.view.t1_ns = mid + z.span / 2 + z.pan * z.span;
    auto t_zoom = clock::now();
    frame();
    if (windowed) {  // until the window's rows, or a summary fine enough, are read and drawn
      const auto& v = app.timeline.view;
      while (!app.model->window->shows(v.t0_ns, v.t1_ns, v.width_px) &&
             std::chrono::duration<double>(clock::now() - t_zoom).count() < 30.0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        frame();
      }
      frame();
      const double ms = std::chrono::duration<double>(clock::now() - t_zoom).count() * 1e3;
      const bool rows = app.model->rows_t0_ns <= v.t0_ns && app.model->rows_t1_ns >= v.t1_ns;
      std::printf("zoom  %-24s shows %s in %7.1f ms (goal < 100 ms)\n", z.name, rows ? "its rows" : "the summary", ms);
      ok = ok && ms < 100.0;
    }
    const int n = 60;
    double c0 = cpu_seconds();
    int vtx = 0;
    for (int i = 0; i < n; ++i) vtx = frame();
    double per = (cpu_seconds() - c0) / n * 1e3;
    std::printf("frame %-24s %7.3f ms CPU (NewFrame..Render), %d vertices (goal < 10 ms)\n", z.name, per, vtx);
    ok = ok && per < 10.0;
  }
  for (auto v : {wb::view::ViewId::overview, wb::view::ViewId::ops}) {
    app.show_view(v);
    for (int i = 0; i < 3; ++i) frame();
    const int n = 20;
    double c0 = cpu_seconds();
    int vtx = 0;
    for (int i = 0; i < n; ++i) vtx = frame();
    double per = (cpu_seconds() - c0) / n * 1e3;
    std::printf("frame %-24s %7.3f ms CPU (NewFrame..Render), %d vertices (goal < 10 ms)\n",
                v == wb::view::ViewId::overview ? "Overview" : "Operators", per, vtx);
    ok = ok && per < 10.0;
  }
  ImGui::DestroyContext();
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  wb::app_model::tune_allocator_for_viewer();
  std::int64_t ranges = 5'000'000;
  int ranks = 8;
  int steps = 0;  // 0: about 600 ranges a step and rank, as a profiled training step has
  std::filesystem::path file = std::filesystem::temp_directory_path() / "wb-view-bench.sqlite";
  bool keep = false, unsummarised = false;
  std::string mode;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ranges" && i + 1 < argc) ranges = std::atoll(argv[++i]);
    else if (a == "--ranks" && i + 1 < argc) ranks = std::atoi(argv[++i]);
    else if (a == "--file" && i + 1 < argc) file = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--keep") keep = true;
    else if (a == "--unsummarised") unsummarised = true;
    else if (a == "--mode" && i + 1 < argc) mode = argv[++i];
    else {
      std::fprintf(stderr,
                   "view_frame: unknown argument '%s' (--ranges N --ranks R --steps S --file PATH --keep "
                   "--mode full|windowed|both --unsummarised)\n",
                   a.c_str());
      return 2;
    }
  }
  using clock = std::chrono::steady_clock;
  if (!keep || !std::filesystem::exists(file)) {
    auto t0 = clock::now();
    wb::app_model::SyntheticRun spec;
    spec.ranks = ranks;
    spec.steps = steps > 0 ? steps : static_cast<int>(std::max<std::int64_t>(8, ranges / ranks / 600));
    spec.ranges_per_rank = ranges / ranks;
    spec.params = 161;
    std::int64_t written = wb::app_model::write_synthetic_run(file, spec);
    std::printf("wrote %lld ranges across %d ranks to %s in %.1f s\n", static_cast<long long>(written), ranks, file.string().c_str(),
                std::chrono::duration<double>(clock::now() - t0).count());
  }

  if (mode.empty()) mode = ranges > wb::app_model::kWindowedEvents ? "windowed" : "both";
  if (mode != "full" && mode != "windowed" && mode != "both") {
    std::fprintf(stderr, "view_frame: --mode %s: expected full, windowed or both\n", mode.c_str());
    return 2;
  }
  if (unsummarised) {
    wb::store::Db db(file, wb::store::OpenMode::read_write);
    db.exec("DELETE FROM meta WHERE key = 'summary_version'; DROP TABLE IF EXISTS summary_bucket; DROP TABLE IF EXISTS summary_track;");
  }
  bool ok = true;
  if (mode != "windowed") ok = open_and_draw(file, wb::app_model::OpenMode::full) && ok;
  if (mode != "full") ok = open_and_draw(file, wb::app_model::OpenMode::windowed) && ok;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak RSS %.2f GB%s\n", static_cast<double>(ru.ru_maxrss) / (1024.0 * 1024.0),
              keep ? "" : " (the writing included: run again with --keep for the viewer's own)");
  // Wall times depend on what else the machine runs; the load average says how busy it was.
  std::ifstream load("/proc/loadavg");
  std::string load1;
  load >> load1;
  std::printf("%s (load average %s on %u cores)\n", ok ? "goals met" : "goals NOT met", load1.c_str(), std::thread::hardware_concurrency());
  return 0;
}
