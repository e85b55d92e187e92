// wb-view: the desktop workbench. `wb-view [RUN] [--view NAME] [--compare RUN2] [--reference REF]
// [--screenshot OUT.png [--size WxH]]` and the scripted options of kUsage. With --screenshot it renders
// until loading and every scripted action are done, writes the window's pixels as PNG and exits: 0
// when the run opened, 2 when the file could not be opened or an action failed (the PNG then shows the
// error popup), 1 when the window or the PNG could not be made.
#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>
#include <stb_image_write.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <charconv>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "allreduce/split_points.hpp"
#include "app/view/app.hpp"
#include "compare/tensor_set.hpp"

namespace {

struct Args {
  wb::view::App::Options app;
  std::string screenshot;
  int width = 1500;
  int height = 920;
  bool help = false;
  bool print_tuner = false;
  bool print_precision = false;
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage: wb-view [RUN.sqlite] [--view overview|timeline|ops|queue|allreduce|precision|memory]\n"
    "               [--compare RUN2.sqlite] [--reference REF.safetensors|.npz|.npy|DIR|RUN]\n"
    "               [--screenshot OUT.png [--size WxH]] [--full | --windowed]\n"
    "  --full                  hold every row in memory, however large the run (every view shows every step)\n"
    "  --windowed              read the timeline window by window from the run's summary, however small the\n"
    "                          run (the default above 20M ranges and kernels; the other views then show a\n"
    "                          sample of consecutive steps, and wb report gives every step)\n"
    "scripted actions (what a click would do, for scripts and tests):\n"
    "  --tuner-splits a,b,...  the AllReduce tuner's split points once the run is loaded ('none': one bucket)\n"
    "  --tuner-run             press \"Run with these splits\": wb-train re-runs with them, the new run opens\n"
    "                          with predicted against measured (a screenshot waits for all of it)\n"
    "  --tuner-try C,R,S       press \"Try the best candidates\": wb tune-split with C candidates, R rounds and\n"
    "                          S steps a trial; the run reopens with the measured trials\n"
    "  --tuner-drag FROM:TO    drag the tuner's handle of split point FROM to TO with injected mouse input\n"
    "  --comparison ID         show the comparison stored in the run file as ID (wb compare saves them)\n"
    "  --path-step N           Timeline: outline step N's critical path across ranks and zoom to the step\n"
    "  --color-by-ratio        Timeline: colour the layers by their time per step over the --compare run's\n"
    "  --layers                Ops: layer ranges only (against an imported PyTorch trace: layer by layer)\n"
    "  --precision-kind KIND   Precision: rows of one kind only (act, grad, param, ...)\n"
    "  --print-tuner           at exit, print the tuner's split, predicted and measured figures on stdout\n"
    "  --print-precision       at exit, print the Precision view's verdict counts and first divergence\n";

// "85,160" -> {85, 160}; "none" -> {} (one bucket): wb-train's --allreduce-split text.
std::vector<int> parse_split(const std::string& flag, const std::string& v) {
  try {
    return wb::allreduce::SplitPoints::parse(v, flag).points();
  } catch (const wb::allreduce::SplitError& e) {
    throw UsageError(e.what());
  }
}

Args parse(int argc, char** argv) {
  Args a;
  bool view_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw UsageError(std::string(flag) + ": expected a value");
      return argv[++i];
    };
    if (s == "--help" || s == "-h") {
      a.help = true;
    } else if (s == "--view") {
      std::string v = value("--view");
      auto id = wb::view::view_from_name(v);
      if (!id) throw UsageError("--view " + v + ": expected overview, timeline, ops, queue, allreduce, precision or memory");
      a.app.view = *id;
      view_given = true;
    } else if (s == "--screenshot") {
      a.screenshot = value("--screenshot");
    } else if (s == "--size") {
      std::string v = value("--size");
      if (std::sscanf(v.c_str(), "%dx%d", &a.width, &a.height) != 2 || a.width < 200 || a.height < 150 ||
          a.width > 8192 || a.height > 8192)
        throw UsageError("--size " + v + ": expected WxH, e.g. 1500x920");
    } else if (s == "--compare") {
      a.app.compare = value("--compare");
    } else if (s == "--reference") {
      a.app.reference = value("--reference");
    } else if (s == "--tuner-splits") {
      a.app.tuner_splits = parse_split(s, value("--tuner-splits"));
    } else if (s == "--tuner-run") {
      a.app.tuner_run = true;
    } else if (s == "--tuner-drag") {
      std::string v = value("--tuner-drag");
      int from = 0, to = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%d:%d%c", &from, &to, &tail) != 2) throw UsageError("--tuner-drag " + v + ": expected FROM:TO, e.g. 85:100");
      a.app.tuner_drag = std::make_pair(from, to);
    } else if (s == "--comparison") {
      std::string v = value("--comparison");
      long long id = 0;
      auto r = std::from_chars(v.data(), v.data() + v.size(), id);
      if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || id < 1)
        throw UsageError("--comparison " + v + ": expected the id of a stored comparison (1, 2, ...)");
      a.app.comparison = id;
    } else if (s == "--path-step") {
      std::string v = value("--path-step");
      int step = -1;
      auto r = std::from_chars(v.data(), v.data() + v.size(), step);
      if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || step < 0)
        throw UsageError("--path-step " + v + ": expected a step number (0, 1, ...)");
      a.app.path_step = step;
    } else if (s == "--tuner-try") {
      const std::string v = value("--tuner-try");
      std::array<int, 3> crs{};
      std::size_t at = 0;
      for (int k = 0; k < 3; ++k) {
        const std::size_t comma = k < 2 ? v.find(',', at) : v.size();
        const std::string part = comma == std::string::npos ? "" : v.substr(at, comma - at);
        auto r = std::from_chars(part.data(), part.data() + part.size(), crs[static_cast<std::size_t>(k)]);
        if (part.empty() || r.ec != std::errc() || r.ptr != part.data() + part.size() || crs[static_cast<std::size_t>(k)] < 1)
          throw UsageError("--tuner-try " + v + ": expected candidates,rounds,steps (e.g. 2,1,4)");
        at = comma + 1;
      }
      if (crs[2] < 2) throw UsageError("--tuner-try " + v + ": a trial needs at least 2 steps");
      a.app.tuner_try = crs;
    } else if (s == "--full") {
      a.app.open_mode = wb::app_model::OpenMode::full;
    } else if (s == "--windowed") {
      a.app.open_mode = wb::app_model::OpenMode::windowed;
    } else if (s == "--color-by-ratio") {
      a.app.color_by_ratio = true;
    } else if (s == "--layers") {
      a.app.layers_only = true;
    } else if (s == "--precision-kind") {
      std::string v = value("--precision-kind");
      auto kind = wb::compare::kind_from_name(v);
      if (!kind) throw UsageError("--precision-kind " + v + ": expected input, label, param, buffer, act, loss, grad, param_after, "
                                  "buffer_after, momentum or other");
      a.app.precision_kind = static_cast<int>(*kind);
    } else if (s == "--print-tuner") {
      a.print_tuner = true;
    } else if (s == "--print-precision") {
      a.print_precision = true;
    } else if (!s.empty() && s[0] == '-') {
      throw UsageError("unknown flag '" + s + "'");
    } else if (a.app.run.empty()) {
      a.app.run = s;
    } else {
      throw UsageError("unexpected argument '" + s + "' (one run file)");
    }
  }
  // Without --view, open where the scripted action shows its result.
  if (!view_given && (a.app.tuner_run || a.app.tuner_drag)) a.app.view = wb::view::ViewId::allreduce;
  else if (!view_given && a.app.comparison) a.app.view = wb::view::ViewId::precision;
  return a;
}

void setup_style(float scale) {
  ImGui::StyleColorsDark();
  ImGuiStyle& st = ImGui::GetStyle();
  st.WindowPadding = ImVec2(8, 6);
  st.FramePadding = ImVec2(6, 3);
  st.ItemSpacing = ImVec2(8, 4);
  st.CellPadding = ImVec2(5, 2);
  st.FrameRounding = 3;
  st.TabRounding = 3;
  st.ScrollbarSize = 12;
  st.Colors[ImGuiCol_WindowBg] = ImVec4(0.11f, 0.115f, 0.13f, 1.0f);
  st.Colors[ImGuiCol_ChildBg] = ImVec4(0.11f, 0.115f, 0.13f, 0.0f);
  st.Colors[ImGuiCol_TableRowBgAlt] = ImVec4(1, 1, 1, 0.035f);
  st.ScaleAllSizes(scale);
  ImGuiIO& io = ImGui::GetIO();
  const char* font = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
  if (std::filesystem::exists(font)) {
    io.Fonts->AddFontFromFileTTF(font, 14.0f * scale);
  } else {
    ImFontConfig cfg;
    cfg.SizePixels = 13.0f * scale;
    io.Fonts->AddFontDefault(&cfg);
  }
}

bool write_png(const std::string& path, int w, int h) {
  std::vector<unsigned char> pixels(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * 3);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, w, h, GL_RGB, GL_UNSIGNED_BYTE, pixels.data());
  // OpenGL's rows run bottom-up, PNG's top-down.
  std::vector<unsigned char> flipped(pixels.size());
  const std::size_t row = static_cast<std::size_t>(w) * 3;
  for (int y = 0; y < h; ++y)
    std::memcpy(&flipped[static_cast<std::size_t>(y) * row], &pixels[static_cast<std::size_t>(h - 1 - y) * row], row);
  return stbi_write_png(path.c_str(), w, h, 3, flipped.data(), static_cast<int>(row)) != 0;
}

}  // namespace

int main(int argc, char** argv) {
  wb::app_model::tune_allocator_for_viewer();
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "wb-view: " << e.what() << "\n" << kUsage;
    return 2;
  }
  if (args.help) {
    std::cout << kUsage;
    return 0;
  }
  const bool shot = !args.screenshot.empty();
  glfwSetErrorCallback([](int code, const char* text) { std::cerr << "wb-view: GLFW error " << code << ": " << text << "\n"; });
  if (!glfwInit()) {
    std::cerr << "wb-view: cannot initialise GLFW (is DISPLAY set? use xvfb-run for headless screenshots)\n";
    return 1;
  }
  // OpenGL 3.2 core where there is one: its renderer draws a window's lanes past 65,536 vertices
  // (ImGuiBackendFlags_RendererHasVtxOffset); OpenGL 3.0 otherwise.
  const char* glsl = "#version 150";
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 2);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  if (shot) glfwWindowHint(GLFW_RESIZABLE, GLFW_FALSE);
  GLFWwindow* window = glfwCreateWindow(args.width, args.height, "wb-view", nullptr, nullptr);
  if (!window) {
    glfwDefaultWindowHints();
    glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
    glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
    if (shot) glfwWindowHint(GLFW_RESIZABLE, GLFW_FALSE);
    glsl = "#version 130";
    window = glfwCreateWindow(args.width, args.height, "wb-view", nullptr, nullptr);
  }
  if (!window) {
    std::cerr << "wb-view: cannot create an OpenGL 3.0 window\n";
    glfwTerminate();
    return 1;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(shot ? 0 : 1);
  float xscale = 1.0f, yscale = 1.0f;
  glfwGetWindowContentScale(window, &xscale, &yscale);
  const float scale = std::clamp(std::max(xscale, yscale), 1.0f, 4.0f);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;
  io.ConfigFlags |= ImGuiConfigFlags_NavEnableKeyboard;
  setup_style(scale);
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init(glsl);

  int rc = 0;
  {
    args.app.persist_recent = !shot;
    wb::view::App app(args.app);
    int settled = 0;
    const auto started = std::chrono::steady_clock::now();
    for (int frame = 0; !glfwWindowShouldClose(window); ++frame) {
      if (shot) glfwPollEvents();
      else glfwWaitEventsTimeout(app.busy() ? 0.03 : 0.25);
      ImGui_ImplOpenGL3_NewFrame();
      ImGui_ImplGlfw_NewFrame();
      // Xvfb's pointer sits mid-screen; a screenshot shows no hover effects.
      if (shot) io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
      // Fades (the modal popup's dimmed background) advance with DeltaTime: in a screenshot every frame
      // counts as 100 ms, so the picture does not depend on how fast this machine renders.
      if (shot) io.DeltaTime = 0.1f;
      app.inject_input();
      ImGui::NewFrame();
      app.frame();
      ImGui::Render();
      int fw = 0, fh = 0;
      glfwGetFramebufferSize(window, &fw, &fh);
      glViewport(0, 0, fw, fh);
      glClearColor(0.09f, 0.09f, 0.1f, 1.0f);
      glClear(GL_COLOR_BUFFER_BIT);
      ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
      if (shot) {
        // A few frames after loading settles so layouts that depend on the previous frame converge.
        settled = app.busy() ? 0 : settled + 1;
        if (settled >= 6) {
          if (!write_png(args.screenshot, fw, fh)) {
            std::cerr << "wb-view: cannot write " << args.screenshot << "\n";
            rc = 1;
          } else if (app.error_shown()) {
            std::cerr << "wb-view: " << app.error() << "\n";
            rc = 2;
          }
          break;
        }
        if (app.busy()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (std::chrono::steady_clock::now() - started > std::chrono::seconds(600)) {
          std::cerr << "wb-view: gave up waiting for loading to finish\n";
          rc = 1;
          break;
        }
      }
      glfwSwapBuffers(window);
    }
    if (args.print_tuner) std::cout << app.tuner_report();
    if (args.print_precision) std::cout << app.precision_report();
    std::cout.flush();
  }
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return rc;
}
