#include "app/view/draw_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "app/model/plot_logic.hpp"
#include "app/model/timeline_logic.hpp"
#include "profiler/analysis/memory.hpp"

namespace wb::view {

using app_model::Axis;
using app_model::log_decades;
using app_model::nice_axis;
using app_model::nice_step;
using app_model::ticks;

ImU32 category_color(std::uint8_t category) {
  switch (static_cast<store::Category>(category)) {
    case store::Category::forward: return IM_COL32(70, 140, 215, 255);
    case store::Category::backward: return IM_COL32(225, 130, 60, 255);
    case store::Category::optimizer: return IM_COL32(150, 105, 205, 255);
    case store::Category::loss: return IM_COL32(215, 80, 140, 255);
    case store::Category::data: return IM_COL32(75, 175, 95, 255);
    case store::Category::h2d: return IM_COL32(40, 180, 180, 255);
    case store::Category::comm: return IM_COL32(215, 195, 70, 255);
    case store::Category::step: return IM_COL32(95, 100, 115, 255);
  }
  return IM_COL32(128, 128, 128, 255);
}

ImU32 scale_rgb(ImU32 c, float f) {
  auto ch = [&](int shift) {
    float v = static_cast<float>((c >> shift) & 0xFF) * f;
    return static_cast<ImU32>(std::clamp(v, 0.0f, 255.0f)) << shift;
  };
  return ch(IM_COL32_R_SHIFT) | ch(IM_COL32_G_SHIFT) | ch(IM_COL32_B_SHIFT) | (c & IM_COL32_A_MASK);
}

ImU32 op_color(std::uint8_t category, std::uint32_t name) {
  std::uint32_t h = name * 2654435761u;
  float f = 0.78f + static_cast<float>((h >> 16) % 9) * 0.05f;
  return scale_rgb(category_color(category), f);
}

ImU32 with_alpha(ImU32 c, int alpha) {
  return (c & ~IM_COL32_A_MASK) | (static_cast<ImU32>(std::clamp(alpha, 0, 255)) << IM_COL32_A_SHIFT);
}

ImU32 series_color(int i) {
  static const ImU32 palette[] = {IM_COL32(80, 160, 235, 255),  IM_COL32(235, 140, 60, 255),
                                  IM_COL32(95, 190, 100, 255),  IM_COL32(220, 85, 85, 255),
                                  IM_COL32(165, 120, 220, 255), IM_COL32(200, 180, 70, 255),
                                  IM_COL32(60, 190, 190, 255),  IM_COL32(225, 120, 180, 255)};
  return palette[static_cast<std::size_t>(i) % std::size(palette)];
}

ImVec4 to_vec4(ImU32 c) { return ImGui::ColorConvertU32ToFloat4(c); }

std::string fmt_ns(double ns) {
  char buf[48];
  double a = std::abs(ns);
  if (!std::isfinite(ns)) return "-";
  if (a >= 1e9) std::snprintf(buf, sizeof buf, "%.3f s", ns / 1e9);
  else if (a >= 1e6) std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  else if (a >= 1e3) std::snprintf(buf, sizeof buf, "%.2f us", ns / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  return buf;
}

std::string fmt_bytes(double b) { return analysis::format_bytes(b); }

std::string fmt_num(double v, int precision) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

std::string fmt_pct(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", fraction * 100.0);
  return buf;
}

void section(const char* title) {
  ImGui::Spacing();
  ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(color::kAccent));
  ImGui::TextUnformatted(title);
  ImGui::PopStyleColor();
  ImGui::Separator();
}

Plot::Plot(const char* id, ImVec2 size, double x_lo, double x_hi, double y_lo, double y_hi, const char* x_label,
           const char* y_label, bool y_log, std::function<std::string(double)> x_format,
           std::function<std::string(double)> y_format)
    : x_lo_(x_lo), x_hi_(x_hi), y_lo_(y_lo), y_hi_(y_hi), y_log_(y_log) {
  if (size.x <= 0) size.x = std::max(ImGui::GetContentRegionAvail().x + size.x, 50.0f);
  ImVec2 origin = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(id, size);
  hovered_ = ImGui::IsItemHovered();
  dl_ = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight();
  const float left = lh * 4.2f, bottom = lh * 2.4f, top = lh * 0.6f, right = lh * 0.8f;
  p0_ = ImVec2(origin.x + left, origin.y + top);
  p1_ = ImVec2(origin.x + size.x - right, origin.y + size.y - bottom);
  if (x_hi_ <= x_lo_) x_hi_ = x_lo_ + 1.0;
  if (y_log_) {
    y_lo_ = std::max(y_lo_, 1e-30);
    if (y_hi_ <= y_lo_) y_hi_ = y_lo_ * 10.0;
  } else if (y_hi_ <= y_lo_) {
    y_hi_ = y_lo_ + 1.0;
  }
  dl_->AddRectFilled(p0_, p1_, color::kBg);
  auto xf = x_format ? x_format : [](double v) { return fmt_num(v, 4); };
  auto yf = y_format ? y_format : [](double v) { return fmt_num(v, 6); };
  // x ticks
  double xs = nice_step(x_hi_ - x_lo_, std::max(2.0, (p1_.x - p0_.x) / (lh * 7.0)));
  for (double t : ticks(x_lo_, x_hi_, xs)) {
    float px = x(t);
    dl_->AddLine(ImVec2(px, p0_.y), ImVec2(px, p1_.y), color::kGrid);
    std::string s = xf(t);
    float w = ImGui::CalcTextSize(s.c_str()).x;
    dl_->AddText(ImVec2(px - w * 0.5f, p1_.y + 2), color::kDim, s.c_str());
  }
  // y ticks
  if (y_log_) {
    for (double d : log_decades(y_lo_, y_hi_)) {
      if (d < y_lo_ * 0.999 || d > y_hi_ * 1.001) continue;
      float py = y(d);
      dl_->AddLine(ImVec2(p0_.x, py), ImVec2(p1_.x, py), color::kGrid);
      char buf[32];
      std::snprintf(buf, sizeof buf, "1e%d", static_cast<int>(std::lround(std::log10(d))));
      float w = ImGui::CalcTextSize(buf).x;
      dl_->AddText(ImVec2(p0_.x - w - 4, py - lh * 0.5f), color::kDim, buf);
    }
  } else {
    double ys = nice_step(y_hi_ - y_lo_, std::max(2.0, (p1_.y - p0_.y) / (lh * 2.5)));
    for (double t : ticks(y_lo_, y_hi_, ys)) {
      float py = y(t);
      dl_->AddLine(ImVec2(p0_.x, py), ImVec2(p1_.x, py), color::kGrid);
      std::string s = yf(t);
      float w = ImGui::CalcTextSize(s.c_str()).x;
      dl_->AddText(ImVec2(p0_.x - w - 4, py - lh * 0.5f), color::kDim, s.c_str());
    }
  }
  dl_->AddRect(p0_, p1_, color::kAxis);
  if (x_label && *x_label) {
    float w = ImGui::CalcTextSize(x_label).x;
    dl_->AddText(ImVec2((p0_.x + p1_.x - w) * 0.5f, p1_.y + lh * 1.2f), color::kText, x_label);
  }
  if (y_label && *y_label) dl_->AddText(ImVec2(origin.x + 2, origin.y - lh * 0.1f), color::kText, y_label);
}

float Plot::x(double v) const {
  return p0_.x + static_cast<float>((v - x_lo_) / (x_hi_ - x_lo_)) * (p1_.x - p0_.x);
}

float Plot::y(double v) const {
  double f;
  if (y_log_) {
    v = std::max(v, y_lo_);
    f = (std::log10(v) - std::log10(y_lo_)) / (std::log10(y_hi_) - std::log10(y_lo_));
  } else {
    f = (v - y_lo_) / (y_hi_ - y_lo_);
  }
  return p1_.y - static_cast<float>(std::clamp(f, -0.05, 1.05)) * (p1_.y - p0_.y);
}

double Plot::x_value(float px) const { return x_lo_ + (px - p0_.x) / (p1_.x - p0_.x) * (x_hi_ - x_lo_); }

ImVec2 Plot::mouse() const { return ImGui::GetIO().MousePos; }

void Plot::line(const PlotSeries& s, float thickness) const {
  std::vector<ImVec2> pts;
  pts.reserve(s.xs.size());
  for (std::size_t i = 0; i < s.xs.size() && i < s.ys.size(); ++i)
    if (std::isfinite(s.ys[i])) pts.emplace_back(x(s.xs[i]), y(s.ys[i]));
  dl_->PushClipRect(p0_, p1_, true);
  if (pts.size() >= 2) dl_->AddPolyline(pts.data(), static_cast<int>(pts.size()), s.color, 0, thickness);
  if (pts.size() <= 40)
    for (const auto& p : pts) dl_->AddCircleFilled(p, thickness + 1.0f, s.color);
  dl_->PopClipRect();
}

void Plot::points(const PlotSeries& s, float radius) const {
  dl_->PushClipRect(p0_, p1_, true);
  for (std::size_t i = 0; i < s.xs.size() && i < s.ys.size(); ++i)
    if (std::isfinite(s.ys[i])) dl_->AddCircleFilled(ImVec2(x(s.xs[i]), y(s.ys[i])), radius, s.color);
  dl_->PopClipRect();
}

void Plot::hline(double v, ImU32 c, const char* label) const {
  float py = y(v);
  for (float px = p0_.x; px < p1_.x; px += 8.0f)
    dl_->AddLine(ImVec2(px, py), ImVec2(std::min(px + 4.0f, p1_.x), py), c, 1.5f);
  if (label) dl_->AddText(ImVec2(p1_.x - ImGui::CalcTextSize(label).x - 4, py - ImGui::GetTextLineHeight() - 1), c, label);
}

void Plot::legend(std::span<const std::pair<std::string, ImU32>> items) const {
  if (items.empty()) return;
  const float lh = ImGui::GetTextLineHeight();
  float w = 0;
  for (const auto& [name, c] : items) w = std::max(w, ImGui::CalcTextSize(name.c_str()).x);
  ImVec2 a(p1_.x - w - lh * 2.0f, p0_.y + 4);
  ImVec2 b(p1_.x - 4, a.y + lh * static_cast<float>(items.size()) + 6);
  dl_->AddRectFilled(a, b, IM_COL32(20, 20, 24, 220), 3.0f);
  float yy = a.y + 3;
  for (const auto& [name, c] : items) {
    dl_->AddRectFilled(ImVec2(a.x + 4, yy + 3), ImVec2(a.x + lh - 2, yy + lh - 3), c, 2.0f);
    dl_->AddText(ImVec2(a.x + lh + 2, yy), color::kText, name.c_str());
    yy += lh;
  }
}

void line_plot(const char* id, ImVec2 size, std::span<const PlotSeries> series, const char* x_label,
               const char* y_label, bool y_log, std::function<std::string(double)> y_format) {
  double xl = std::numeric_limits<double>::infinity(), xh = -xl, yl = xl, yh = -xl;
  for (const auto& s : series) {
    for (double v : s.xs) {
      xl = std::min(xl, v);
      xh = std::max(xh, v);
    }
    for (double v : s.ys) {
      if (!std::isfinite(v) || (y_log && v <= 0)) continue;
      yl = std::min(yl, v);
      yh = std::max(yh, v);
    }
  }
  if (!(xh >= xl)) xl = 0, xh = 1;
  if (!(yh >= yl)) yl = y_log ? 1 : 0, yh = y_log ? 10 : 1;
  if (y_log) {
    yl = std::pow(10.0, std::floor(std::log10(yl)));
    yh = std::pow(10.0, std::ceil(std::log10(yh)));
  } else {
    Axis ax = nice_axis(std::min(yl, 0.0), yh + (yh - std::min(yl, 0.0)) * 0.05);
    yl = ax.lo;
    yh = ax.hi;
  }
  if (xh == xl) xh = xl + 1;
  Plot plot(id, size, xl, xh, yl, yh, x_label, y_label, y_log, {}, std::move(y_format));
  std::vector<std::pair<std::string, ImU32>> items;
  for (const auto& s : series) {
    plot.line(s);
    items.emplace_back(s.name, s.color);
  }
  if (series.size() > 1) plot.legend(items);
  if (plot.hovered()) {
    double xv = plot.x_value(plot.mouse().x);
    ImGui::BeginTooltip();
    for (const auto& s : series) {
      std::size_t best = 0;
      double bd = std::numeric_limits<double>::infinity();
      for (std::size_t i = 0; i < s.xs.size(); ++i)
        if (std::abs(s.xs[i] - xv) < bd) bd = std::abs(s.xs[i] - xv), best = i;
      if (best < s.ys.size()) ImGui::Text("%s  x=%s  %s", s.name.c_str(), fmt_num(s.xs[best], 5).c_str(), fmt_num(s.ys[best], 5).c_str());
    }
    ImGui::EndTooltip();
  }
}

}  // namespace wb::view
