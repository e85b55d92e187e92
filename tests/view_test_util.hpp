#pragma once
// Shared by the wb-view tests: PNG screenshots read back as pixels, and a headless ImGui context that
// runs App frames without a window.
#include <catch2/catch.hpp>

#include <stb_image.h>

#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

#include <imgui.h>

namespace wb::test {

struct Image {
  int w = 0, h = 0;
  std::vector<unsigned char> rgb;
  std::size_t distinct() const {
    std::set<std::uint32_t> colours;
    for (std::size_t i = 0; i + 2 < rgb.size(); i += 3) colours.insert(rgb[i] << 16 | rgb[i + 1] << 8 | rgb[i + 2]);
    return colours.size();
  }
  // Share of pixels within tol of a colour on every channel.
  double share_near(int r, int g, int b, int tol) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i + 2 < rgb.size(); i += 3)
      if (std::abs(rgb[i] - r) <= tol && std::abs(rgb[i + 1] - g) <= tol && std::abs(rgb[i + 2] - b) <= tol) ++n;
    return static_cast<double>(n) / static_cast<double>(rgb.size() / 3);
  }
  // Pixels of strong red (the error popup's title text, anti-aliased onto the dark popup).
  std::size_t reds() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i + 2 < rgb.size(); i += 3)
      if (rgb[i] > 140 && rgb[i + 1] < 120 && rgb[i + 2] < 120) ++n;
    return n;
  }
};

inline Image load_png(const std::filesystem::path& p) {
  Image img;
  int n = 0;
  unsigned char* data = stbi_load(p.string().c_str(), &img.w, &img.h, &n, 3);
  REQUIRE(data != nullptr);
  img.rgb.assign(data, data + static_cast<std::size_t>(img.w) * static_cast<std::size_t>(img.h) * 3);
  stbi_image_free(data);
  return img;
}

// Share of pixels that differ between two screenshots (1 when their sizes differ).
inline double differing_fraction(const Image& a, const Image& b) {
  if (a.w != b.w || a.h != b.h) return 1.0;
  std::size_t diff = 0;
  for (std::size_t i = 0; i + 2 < a.rgb.size(); i += 3)
    if (a.rgb[i] != b.rgb[i] || a.rgb[i + 1] != b.rgb[i + 1] || a.rgb[i + 2] != b.rgb[i + 2]) ++diff;
  return static_cast<double>(diff) / static_cast<double>(a.rgb.size() / 3);
}

// An ImGui context with a font atlas and a display, as the window would give, but no backend.
struct Headless {
  ImGuiContext* ctx;
  Headless() {
    ctx = ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(1400, 900);
    unsigned char* pixels;
    int w, h;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
  }
  Headless(const Headless&) = delete;
  Headless& operator=(const Headless&) = delete;
  ~Headless() { ImGui::DestroyContext(ctx); }
  // Runs one frame of `app` (any type with inject_input() and frame()) and returns the vertices drawn.
  template <typename App>
  int frame(App& app, double dt = 1.0 / 60) {
    ImGui::GetIO().DeltaTime = static_cast<float>(dt);
    // Without a backend nothing else moves the mouse: park it outside unless a script moves it.
    ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
    app.inject_input();
    ImGui::NewFrame();
    app.frame();
    ImGui::Render();
    return ImGui::GetDrawData()->TotalVtxCount;
  }
};

}  // namespace wb::test
