// Drawing helpers shared by the views: the palette (by category, by name), number formatting, and a
// small plot canvas with labelled axes, ticks, a legend and hover read-out.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <imgui.h>

#include "store/rows.hpp"

namespace wb::view {

namespace color {
inline constexpr ImU32 kText = IM_COL32(225, 225, 230, 255);
inline constexpr ImU32 kDim = IM_COL32(150, 150, 160, 255);
inline constexpr ImU32 kGrid = IM_COL32(70, 72, 80, 255);
inline constexpr ImU32 kAxis = IM_COL32(120, 122, 130, 255);
inline constexpr ImU32 kBg = IM_COL32(24, 25, 30, 255);
inline constexpr ImU32 kGood = IM_COL32(90, 190, 110, 255);
inline constexpr ImU32 kWarn = IM_COL32(230, 170, 60, 255);
inline constexpr ImU32 kBad = IM_COL32(225, 80, 75, 255);
inline constexpr ImU32 kAccent = IM_COL32(80, 160, 235, 255);
inline constexpr ImU32 kSelect = IM_COL32(255, 230, 90, 255);
}  // namespace color

ImU32 category_color(std::uint8_t category);
// A shade of the category colour picked by the name, so neighbouring ops differ (Tracy-like).
ImU32 op_color(std::uint8_t category, std::uint32_t name);
ImU32 with_alpha(ImU32 c, int alpha);
ImU32 scale_rgb(ImU32 c, float factor);
// A qualitative palette for series and ranks.
ImU32 series_color(int i);
ImVec4 to_vec4(ImU32 c);

std::string fmt_ns(double ns);          // "1.23 ms"
std::string fmt_bytes(double bytes);    // "12.3 MiB"
std::string fmt_num(double v, int precision = 3);  // %g-like with thousands kept readable
std::string fmt_pct(double fraction);   // "12.3 %"

// A titled section header line.
void section(const char* title);

// A rectangle with axes for custom plots. Construct, then map values with x()/y().
struct PlotSeries {
  std::string name;
  std::vector<double> xs;
  std::vector<double> ys;
  ImU32 color = 0;
};
class Plot {
 public:
  // Reserves `size` (negative x: fill width) in the current window and draws the frame, grid, ticks and
  // axis labels. y_log: logarithmic y axis (values <= 0 are clamped to the bottom).
  Plot(const char* id, ImVec2 size, double x_lo, double x_hi, double y_lo, double y_hi, const char* x_label,
       const char* y_label, bool y_log = false, std::function<std::string(double)> x_format = {},
       std::function<std::string(double)> y_format = {});
  float x(double v) const;
  float y(double v) const;
  double x_value(float px) const;
  ImVec2 min() const { return p0_; }
  ImVec2 max() const { return p1_; }
  ImDrawList* draw_list() const { return dl_; }
  bool hovered() const { return hovered_; }
  ImVec2 mouse() const;
  void line(const PlotSeries& s, float thickness = 1.5f) const;
  void points(const PlotSeries& s, float radius = 2.5f) const;
  void hline(double v, ImU32 c, const char* label = nullptr) const;
  // Legend box in the top-right corner.
  void legend(std::span<const std::pair<std::string, ImU32>> items) const;

 private:
  ImDrawList* dl_ = nullptr;
  ImVec2 p0_, p1_;  // the data area
  double x_lo_, x_hi_, y_lo_, y_hi_;
  bool y_log_ = false;
  bool hovered_ = false;
};

// A plot of lines over shared axes, fitted to the data, with a legend; hovering shows the nearest x.
void line_plot(const char* id, ImVec2 size, std::span<const PlotSeries> series, const char* x_label,
               const char* y_label, bool y_log = false, std::function<std::string(double)> y_format = {});

}  // namespace wb::view
