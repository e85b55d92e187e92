// Memory: where a rank's memory goes at the peak of a step. The peak with the op at it, what is alive
// then by role (one stacked bar) and by holder (the layers and model-level buffers, each bar split by
// role), the live bytes over that step with the peak marked, and every step's peak. A step picker and
// a rank picker choose what is shown; the view opens on the step with the largest peak.
#include <algorithm>
#include <string>

#include <imgui.h>

#include "app/model/memory_logic.hpp"
#include "app/model/plot_logic.hpp"
#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"

namespace wb::view {

using app_model::Axis;
using app_model::nice_axis;
using app_model::RunModel;

namespace {

constexpr std::size_t kHolderRows = 24;

ImU32 role_color(int role) {
  static constexpr ImU32 kColors[store::kMemoryRoles] = {
      IM_COL32(80, 160, 235, 255),  IM_COL32(225, 110, 90, 255), IM_COL32(90, 190, 110, 255),
      IM_COL32(230, 170, 60, 255),  IM_COL32(160, 120, 220, 255), IM_COL32(70, 200, 200, 255),
      IM_COL32(140, 140, 150, 255)};
  return kColors[std::clamp(role, 0, store::kMemoryRoles - 1)];
}

// One horizontal bar of `bytes` split by role, `width` pixels for `scale` bytes.
void role_bar(const std::array<std::int64_t, store::kMemoryRoles>& by_role, double scale, float width, float height) {
  ImVec2 p = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  float x = p.x;
  for (int r = 0; r < store::kMemoryRoles; ++r) {
    const double b = static_cast<double>(by_role[static_cast<std::size_t>(r)]);
    if (b <= 0) continue;
    const float w = static_cast<float>(b / std::max(scale, 1.0)) * width;
    dl->AddRectFilled(ImVec2(x, p.y), ImVec2(x + std::max(w, 1.0f), p.y + height), role_color(r));
    x += w;
  }
  ImGui::Dummy(ImVec2(width, height));
}

void role_legend() {
  for (int r = 0; r < store::kMemoryRoles; ++r) {
    if (r) ImGui::SameLine(0, 14);
    ImVec2 p = ImGui::GetCursorScreenPos();
    const float h = ImGui::GetTextLineHeight();
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 3), ImVec2(p.x + h - 6, p.y + h - 3), role_color(r));
    ImGui::Dummy(ImVec2(h - 4, h));
    ImGui::SameLine(0, 4);
    ImGui::TextUnformatted(std::string(store::memory_role_name(r)).c_str());
  }
}

void holders_table(const analysis::StepMemory& m) {
  const auto rows = app_model::top_holders(m, kHolderRows);
  const double top = rows.empty() ? 1.0 : static_cast<double>(std::max_element(rows.begin(), rows.end(), [](auto& a, auto& b) {
                                                                 return a.bytes < b.bytes;
                                                               })->bytes);
  if (ImGui::BeginTable("##holders", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchProp |
                                            ImGuiTableFlags_ScrollY)) {
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("holder", ImGuiTableColumnFlags_WidthStretch, 1.2f);
    ImGui::TableSetupColumn("bytes", ImGuiTableColumnFlags_WidthStretch, 0.6f);
    ImGui::TableSetupColumn("share", ImGuiTableColumnFlags_WidthStretch, 0.4f);
    ImGui::TableSetupColumn("by role", ImGuiTableColumnFlags_WidthStretch, 2.0f);
    ImGui::TableHeadersRow();
    for (const auto& h : rows) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(h.name.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_bytes(static_cast<double>(h.bytes)).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_pct(static_cast<double>(h.bytes) / std::max<double>(1, static_cast<double>(m.peak_bytes))).c_str());
      ImGui::TableNextColumn();
      role_bar(h.by_role, top, ImGui::GetContentRegionAvail().x, ImGui::GetTextLineHeight() - 2);
      if (ImGui::IsItemHovered()) {
        ImGui::BeginTooltip();
        ImGui::Text("%s: %s", h.name.c_str(), fmt_bytes(static_cast<double>(h.bytes)).c_str());
        for (int r = 0; r < store::kMemoryRoles; ++r)
          if (h.by_role[static_cast<std::size_t>(r)] > 0)
            ImGui::TextColored(to_vec4(role_color(r)), "%-10s %s", std::string(store::memory_role_name(r)).c_str(),
                               fmt_bytes(static_cast<double>(h.by_role[static_cast<std::size_t>(r)])).c_str());
        ImGui::EndTooltip();
      }
    }
    ImGui::EndTable();
  }
}

void step_curve(const RunModel& model, const analysis::StepMemory& m, ImVec2 size) {
  const auto curve = analysis::memory_curve(model.run, m.rank, m.step);
  if (curve.empty()) return;
  double hi = 0;
  for (const auto& [t, b] : curve) hi = std::max(hi, static_cast<double>(b));
  const double mib = 1024.0 * 1024.0;
  Axis ay = nice_axis(0, hi / mib * 1.1 + 1e-9);
  const double t0 = static_cast<double>(m.start_ns);
  const double span_ms = std::max(1e-6, static_cast<double>(m.end_ns - m.start_ns) / 1e6);
  Plot plot("##curve", size, 0, span_ms, 0, ay.hi, "time in the step (ms)", "live (MiB)", false,
            [](double v) { return fmt_num(v, 4); }, [](double v) { return fmt_num(v, 4); });
  ImDrawList* dl = plot.draw_list();
  // Forward and backward ranges of the rank's main thread as bands, so the curve lines up with them.
  const auto& ranges = model.run.ranges_of(model.run.main_track(m.rank));
  for (const auto& r : ranges) {
    if (r.depth != 1 || r.step != m.step) continue;
    if (r.category != static_cast<std::uint8_t>(store::Category::forward) &&
        r.category != static_cast<std::uint8_t>(store::Category::backward))
      continue;
    dl->AddRectFilled(ImVec2(plot.x((static_cast<double>(r.start_ns) - t0) / 1e6), plot.max().y - 5),
                      ImVec2(plot.x((static_cast<double>(r.end_ns) - t0) / 1e6), plot.max().y),
                      with_alpha(category_color(r.category), 160));
  }
  const ImU32 c = IM_COL32(175, 120, 225, 255);
  for (std::size_t i = 0; i + 1 < curve.size(); ++i) {
    const float xa = plot.x((static_cast<double>(curve[i].first) - t0) / 1e6);
    const float xb = plot.x((static_cast<double>(curve[i + 1].first) - t0) / 1e6);
    const float ya = plot.y(static_cast<double>(curve[i].second) / mib), yb = plot.y(static_cast<double>(curve[i + 1].second) / mib);
    if (xb > xa) dl->AddRectFilled(ImVec2(xa, ya), ImVec2(xb, plot.y(0)), with_alpha(c, 70));
    dl->AddLine(ImVec2(xa, ya), ImVec2(xb, ya), c, 1.5f);
    dl->AddLine(ImVec2(xb, ya), ImVec2(xb, yb), c, 1.5f);
  }
  const float px = plot.x((static_cast<double>(m.peak_ns) - t0) / 1e6), py = plot.y(static_cast<double>(m.peak_bytes) / mib);
  dl->AddCircleFilled(ImVec2(px, py), 5, color::kWarn);
  const std::string label = analysis::concat("peak ", fmt_bytes(static_cast<double>(m.peak_bytes)), " at ", m.peak_op);
  const float w = ImGui::CalcTextSize(label.c_str()).x;
  // Left of the marker when the label would leave the plot on the right.
  const float lx = px + 8 + w > plot.max().x ? px - 8 - w : px + 8;
  dl->AddText(ImVec2(lx, py - 18), color::kText, label.c_str());
  if (plot.hovered()) {
    const double t = plot.x_value(plot.mouse().x) * 1e6 + t0;
    auto it = std::partition_point(curve.begin(), curve.end(), [&](const auto& p) { return static_cast<double>(p.first) <= t; });
    if (it != curve.begin()) ImGui::SetTooltip("t = %s   live %s", fmt_ns(t - t0).c_str(), fmt_bytes(static_cast<double>(std::prev(it)->second)).c_str());
  }
}

void peaks_plot(const analysis::MemoryAnalysis& mem, int rank, int selected, ImVec2 size) {
  const auto idx = app_model::memory_steps_of(mem, rank);
  if (idx.empty()) return;
  double hi = 0;
  int last = 0;
  for (std::size_t i : idx) {
    hi = std::max(hi, static_cast<double>(mem.steps[i].peak_bytes));
    last = std::max(last, mem.steps[i].step);
  }
  const double mib = 1024.0 * 1024.0;
  Axis ay = nice_axis(0, hi / mib * 1.1 + 1e-9);
  Plot plot("##peaks", size, -0.5, last + 0.5, 0, ay.hi, "step", "peak (MiB)", false,
            [](double v) { return std::abs(v - std::round(v)) < 1e-6 ? fmt_num(std::round(v) + 0.0, 6) : std::string(); },
            [](double v) { return fmt_num(v, 4); });
  ImDrawList* dl = plot.draw_list();
  for (std::size_t i : idx) {
    const auto& s = mem.steps[i];
    const ImU32 c = static_cast<int>(i) == selected ? color::kSelect : IM_COL32(175, 120, 225, 255);
    dl->AddRectFilled(ImVec2(plot.x(s.step - 0.4), plot.y(static_cast<double>(s.peak_bytes) / mib)), ImVec2(plot.x(s.step + 0.4), plot.y(0)), c);
    if (plot.hovered() && plot.mouse().x >= plot.x(s.step - 0.5) && plot.mouse().x < plot.x(s.step + 0.5))
      ImGui::SetTooltip("step %d: peak %s at %s", s.step, fmt_bytes(static_cast<double>(s.peak_bytes)).c_str(), s.peak_op.c_str());
  }
}

}  // namespace

void draw_memory(App& app) {
  const RunModel& model = *app.model;
  const auto& mem = model.memory;
  auto& st = app.memory;
  if (!mem.recorded || mem.steps.empty()) {
    ImGui::TextColored(to_vec4(color::kDim),
                       "This run has no memory events (recorded with --no-memory-profile or --no-profile, or before "
                       "memory was recorded).");
    return;
  }
  const auto ranks = app_model::memory_ranks(mem);
  if (std::find(ranks.begin(), ranks.end(), st.rank) == ranks.end()) {
    st.rank = ranks.front();
    st.step_index = -1;
  }
  if (st.step_index < 0 || static_cast<std::size_t>(st.step_index) >= mem.steps.size() ||
      mem.steps[static_cast<std::size_t>(st.step_index)].rank != st.rank)
    st.step_index = app_model::peak_step_index(mem, st.rank);
  const auto idx = app_model::memory_steps_of(mem, st.rank);
  const analysis::StepMemory& m = mem.steps[static_cast<std::size_t>(st.step_index)];

  if (ranks.size() > 1) {
    ImGui::SetNextItemWidth(120);
    if (ImGui::BeginCombo("rank", std::to_string(st.rank).c_str())) {
      for (int r : ranks)
        if (ImGui::Selectable(std::to_string(r).c_str(), r == st.rank)) {
          st.rank = r;
          st.step_index = app_model::peak_step_index(mem, r);
        }
      ImGui::EndCombo();
    }
    ImGui::SameLine(0, 20);
  }
  int pos = static_cast<int>(std::find(idx.begin(), idx.end(), static_cast<std::size_t>(st.step_index)) - idx.begin());
  ImGui::SetNextItemWidth(260);
  if (ImGui::SliderInt("step", &pos, 0, static_cast<int>(idx.size()) - 1, analysis::concat("step ", std::to_string(m.step)).c_str()))
    st.step_index = static_cast<int>(idx[static_cast<std::size_t>(std::clamp(pos, 0, static_cast<int>(idx.size()) - 1))]);
  ImGui::SameLine(0, 20);
  if (ImGui::Button("largest peak")) st.step_index = app_model::peak_step_index(mem, st.rank);

  ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(IM_COL32(175, 120, 225, 255)));
  ImGui::SetWindowFontScale(1.4f);
  ImGui::Text("peak %s", fmt_bytes(static_cast<double>(m.peak_bytes)).c_str());
  ImGui::SetWindowFontScale(1.0f);
  ImGui::PopStyleColor();
  ImGui::SameLine(0, 20);
  std::string at = analysis::concat("at ", m.peak_op.empty() ? std::string("?") : m.peak_op, " (",
                                   store::memory_role_name(m.peak_role), ")");
  if (m.peak_op_step != m.step)
    at += m.peak_op_step < 0 ? std::string(" (allocated before training: the step allocated nothing above its start)")
                             : analysis::concat(" (allocated in step ", std::to_string(m.peak_op_step),
                                                ": the step allocated nothing above its start)");
  ImGui::TextUnformatted(analysis::concat("rank ", std::to_string(m.rank), ", step ", std::to_string(m.step), "  ", at).c_str());
  ImGui::TextColored(to_vec4(color::kDim), "started the step with %s; allocated %s (%lld), freed %s (%lld) during it",
                     fmt_bytes(static_cast<double>(m.start_bytes)).c_str(), fmt_bytes(static_cast<double>(m.allocated_bytes)).c_str(),
                     static_cast<long long>(m.allocations), fmt_bytes(static_cast<double>(m.freed_bytes)).c_str(),
                     static_cast<long long>(m.frees));
  section("Alive at the peak by role");
  role_bar(m.by_role, static_cast<double>(m.peak_bytes), ImGui::GetContentRegionAvail().x, 22);
  std::string parts;
  for (int r = 0; r < store::kMemoryRoles; ++r) {
    const auto b = m.by_role[static_cast<std::size_t>(r)];
    if (b > 0)
      parts += analysis::concat(parts.empty() ? "" : "   ", store::memory_role_name(r), " ", fmt_bytes(static_cast<double>(b)), " (",
                                fmt_pct(static_cast<double>(b) / std::max<double>(1, static_cast<double>(m.peak_bytes))), ")");
  }
  ImGui::TextUnformatted(parts.c_str());
  role_legend();

  const float avail_w = ImGui::GetContentRegionAvail().x;
  ImGui::BeginChild("##left", ImVec2(avail_w * 0.45f, 0), false);
  section("Alive at the peak by layer (module or buffer that allocated it)");
  holders_table(m);
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("##right", ImVec2(0, 0), false);
  section("Live bytes over the step (bands: forward, backward)");
  step_curve(model, m, ImVec2(-1, std::max(200.0f, ImGui::GetContentRegionAvail().y * 0.58f)));
  section("Peak per step");
  peaks_plot(mem, st.rank, st.step_index, ImVec2(-1, std::max(140.0f, ImGui::GetContentRegionAvail().y - 8)));
  ImGui::EndChild();
}

}  // namespace wb::view
