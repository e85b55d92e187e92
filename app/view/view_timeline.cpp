// Timeline: per rank a group of lanes (host threads, GPU streams, data queues, allreduce buckets) over
// a shared time axis with step boundaries. Wheel zooms at the cursor, drag pans, shift+drag selects a
// time range (statistics below), click selects an event (details below), find steps through an op's
// occurrences. Each lane draws only what is visible, merging sub-pixel events.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <unordered_set>

#include <imgui.h>

#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"
#include "app/view/timeline_lanes.hpp"

namespace wb::view {

namespace {

bool contains_ci(std::string_view hay, std::string_view needle) {
  if (needle.empty()) return false;
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b)); });
  return it != hay.end();
}

// Occurrences of host ranges whose name matches, ordered by start.
void find_occurrences(const RunModel& m, TimelineState& st) {
  st.occurrences.clear();
  st.occurrence = -1;
  std::vector<bool> match(m.run.strings.size(), false);
  bool any = false;
  if (st.highlight) {
    if (st.highlight->first < match.size()) match[st.highlight->first] = any = true;
  } else {
    for (std::size_t i = 0; i < m.run.strings.size(); ++i)
      if (contains_ci(m.run.strings[i], st.find)) match[i] = any = true;
  }
  if (!any) return;
  std::vector<std::pair<std::int64_t, EventRef>> found;
  for (const auto& [track, rows] : m.run.ranges) {
    for (std::uint32_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      if (r.name < match.size() && match[r.name] && (!st.highlight || st.highlight->second == r.category))
        found.push_back({r.start_ns, EventRef{track, i, false}});
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  st.occurrences.reserve(found.size());
  for (const auto& f : found) st.occurrences.push_back(f.second);
}

void go_to(const RunModel& m, TimelineState& st, const EventRef& ref) {
  auto [s, e] = extent_of(m, ref);
  double span = std::max<double>(static_cast<double>(e - s) * 4.0, 20000.0);
  double mid = 0.5 * static_cast<double>(s + e);
  st.view.t0_ns = mid - span * 0.5;
  st.view.t1_ns = mid + span * 0.5;
  st.selected = ref;
}

void toolbar(App& app, TimelineState& st, const RunModel& m) {
  if (ImGui::Button("Fit all")) st.fitted = false;
  ImGui::SameLine();
  // Steps of the first rank, to jump to one.
  std::vector<const store::StepRow*> steps;
  int first_rank = m.run.steps.empty() ? 0 : m.run.steps.front().rank;
  for (const auto& s : m.run.steps)
    if (s.rank == first_rank) steps.push_back(&s);
  ImGui::SetNextItemWidth(110);
  if (ImGui::BeginCombo("##step", "Zoom to step")) {
    for (const auto* s : steps) {
      std::string label = "step " + std::to_string(s->step) + "  (" + fmt_ns(static_cast<double>(s->end_ns - s->start_ns)) + ")";
      if (ImGui::Selectable(label.c_str())) {
        double pad = static_cast<double>(s->end_ns - s->start_ns) * 0.02;
        st.view.t0_ns = static_cast<double>(s->start_ns) - pad;
        st.view.t1_ns = static_cast<double>(s->end_ns) + pad;
      }
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine(0, 20);
  ImGui::SetNextItemWidth(200);
  if (ImGui::InputTextWithHint("##find", "find op by name", st.find, sizeof st.find)) st.highlight.reset();
  if (st.find_done != st.find) {
    st.find_done = st.find;
    find_occurrences(m, st);
  }
  ImGui::SameLine();
  const int n = static_cast<int>(st.occurrences.size());
  if (ImGui::ArrowButton("##prev", ImGuiDir_Left) && n > 0) {
    st.occurrence = st.occurrence <= 0 ? n - 1 : st.occurrence - 1;
    go_to(m, st, st.occurrences[static_cast<std::size_t>(st.occurrence)]);
  }
  ImGui::SameLine();
  if (ImGui::ArrowButton("##next", ImGuiDir_Right) && n > 0) {
    st.occurrence = (st.occurrence + 1) % n;
    go_to(m, st, st.occurrences[static_cast<std::size_t>(st.occurrence)]);
  }
  ImGui::SameLine();
  if (st.find[0] || st.highlight) ImGui::Text("%d / %d", st.occurrence + 1, n);
  else ImGui::TextColored(to_vec4(color::kDim), "-");
  ImGui::SameLine(0, 20);
  ImGui::TextColored(to_vec4(color::kDim), "window %s   wheel: zoom   drag: pan   shift+drag: select range   click: select",
                     fmt_ns(st.view.span_ns()).c_str());
  (void)app;
}

void details_panel(TimelineState& st, const RunModel& m) {
  if (st.range_sel) {
    auto [a, b] = *st.range_sel;
    ImGui::TextColored(to_vec4(color::kSelect), "Selected range %s .. %s  (%s)", fmt_ns(static_cast<double>(a - m.t_min_ns)).c_str(),
                       fmt_ns(static_cast<double>(b - m.t_min_ns)).c_str(), fmt_ns(static_cast<double>(b - a)).c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("zoom to it")) {
      st.view.t0_ns = static_cast<double>(a);
      st.view.t1_ns = static_cast<double>(b);
    }
    ImGui::SameLine();
    if (ImGui::SmallButton("clear")) {
      st.range_sel.reset();
      return;
    }
    if (ImGui::BeginTable("##selstats", 5, ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_BordersInnerV,
                          ImVec2(0, ImGui::GetContentRegionAvail().y))) {
      ImGui::TableSetupScrollFreeze(0, 1);
      for (const char* h : {"op", "category", "count", "time inside", "% of range"}) ImGui::TableSetupColumn(h);
      ImGui::TableHeadersRow();
      ImGuiListClipper clip;
      clip.Begin(static_cast<int>(st.range_stats.size()));
      while (clip.Step())
        for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
          const auto& s = st.range_stats[static_cast<std::size_t>(i)];
          ImGui::TableNextRow();
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(m.run.name(s.name).c_str());
          ImGui::TableNextColumn();
          ImGui::TextColored(to_vec4(category_color(s.category)), "%s",
                             std::string(store::category_name(static_cast<store::Category>(s.category))).c_str());
          ImGui::TableNextColumn();
          ImGui::Text("%lld", static_cast<long long>(s.count));
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(fmt_ns(static_cast<double>(s.inside_ns)).c_str());
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(fmt_pct(static_cast<double>(s.inside_ns) / std::max<double>(1.0, static_cast<double>(b - a))).c_str());
        }
      ImGui::EndTable();
    }
    return;
  }
  if (!st.selected) {
    ImGui::TextColored(to_vec4(color::kDim), "Click an event for its details; shift+drag across lanes for statistics of a time range.");
    return;
  }
  const EventRef& ref = *st.selected;
  if (ref.kernel) {
    const auto& k = m.kernels.at(ref.track)[ref.row];
    ImGui::TextColored(to_vec4(color::kSelect), "%s", m.run.name(k.name).c_str());
    ImGui::Text("device activity  %s   start %s   %s", fmt_ns(static_cast<double>(k.end_ns - k.start_ns)).c_str(),
                fmt_ns(static_cast<double>(k.start_ns - m.t_min_ns)).c_str(), k.bytes ? fmt_bytes(static_cast<double>(k.bytes)).c_str() : "");
    if (k.corr_id)
      for (const auto& [track, rows] : m.run.ranges)
        for (const auto& r : rows)
          if (r.corr_id == k.corr_id) ImGui::Text("launched by %s (step %d)", m.run.name(r.name).c_str(), r.step);
    return;
  }
  const auto& rows = m.run.ranges_of(ref.track);
  const auto& r = rows[ref.row];
  ImGui::TextColored(to_vec4(color::kSelect), "%s", m.run.name(r.name).c_str());
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(category_color(r.category)), "[%s]", std::string(store::category_name(static_cast<store::Category>(r.category))).c_str());
  // Children: ranges one level deeper inside this one.
  std::int64_t child_ns = 0;
  int children = 0;
  for (std::size_t i = ref.row + 1; i < rows.size() && rows[i].start_ns < r.end_ns; ++i)
    if (rows[i].depth == r.depth + 1) {
      child_ns += rows[i].end_ns - rows[i].start_ns;
      ++children;
    }
  const double dur = static_cast<double>(r.end_ns - r.start_ns);
  ImGui::Text("duration %s   self %s   children %d   start %s   step %d   depth %d", fmt_ns(dur).c_str(),
              fmt_ns(dur - static_cast<double>(child_ns)).c_str(), children, fmt_ns(static_cast<double>(r.start_ns - m.t_min_ns)).c_str(),
              r.step, r.depth);
  // The op's statistics over the run (the analyses may still be running right after opening).
  const analysis::OpStat* stat = nullptr;
  if (m.ready())
    for (const auto& op : m.ops.by_name)
      if (op.name == m.run.name(r.name) && static_cast<std::uint8_t>(op.category) == r.category) stat = &op;
  if (stat) {
    ImGui::Text("this op over the run: %lld calls, mean %s, p50 %s, p95 %s, max %s", static_cast<long long>(stat->count),
                fmt_ns(stat->mean_ns).c_str(), fmt_ns(static_cast<double>(stat->p50_ns)).c_str(),
                fmt_ns(static_cast<double>(stat->p95_ns)).c_str(), fmt_ns(static_cast<double>(stat->max_ns)).c_str());
    if (dur > static_cast<double>(stat->p95_ns) && stat->count >= 20) {
      ImGui::SameLine();
      ImGui::TextColored(to_vec4(color::kWarn), "(slower than p95)");
    }
  }
  if (r.corr_id) {
    int n = 0;
    for (const auto& [track, ks] : m.kernels)
      for (const auto& k : ks)
        if (k.corr_id == r.corr_id && n++ < 8)
          ImGui::BulletText("kernel %s  %s", m.run.name(k.name).c_str(), fmt_ns(static_cast<double>(k.end_ns - k.start_ns)).c_str());
  }
}

}  // namespace

void draw_timeline(App& app) {
  const RunModel& m = *app.model;
  TimelineState& st = app.timeline;
  if (st.lanes_for != &m) {
    st.lanes = make_lanes(m);
    st.lanes_for = &m;
  }
  toolbar(app, st, m);

  const float details_h = (st.selected || st.range_sel) ? 170.0f : ImGui::GetTextLineHeightWithSpacing() + 8;
  ImVec2 avail = ImGui::GetContentRegionAvail();
  ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImVec2 size(avail.x, std::max(100.0f, avail.y - details_h));
  ImGui::InvisibleButton("##timeline", size, ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  const bool hovered = ImGui::IsItemHovered();
  const bool active = ImGui::IsItemActive();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight();
  const float label_w = std::clamp(size.x * 0.13f, 130.0f, 220.0f);
  const float ruler_h = lh * 2.2f;
  const float x0 = p0.x + label_w;
  const float width = std::max(10.0f, size.x - label_w - 6.0f);
  const float row_h = lh + 5.0f;

  if (!st.fitted) {
    st.view = fit_view(static_cast<double>(m.t_min_ns), static_cast<double>(m.t_max_ns), width);
    st.fitted = true;
  }
  st.view.width_px = width;
  const double full = static_cast<double>(std::max<std::int64_t>(m.t_max_ns - m.t_min_ns, 1000));

  // Input: zoom at the cursor, pan, select.
  ImGuiIO& io = ImGui::GetIO();
  const ImVec2 mouse = io.MousePos;
  const bool in_lanes = hovered && mouse.x >= x0 && mouse.y > p0.y + ruler_h;
  if (hovered && io.MouseWheel != 0.0f) {
    if (io.KeyShift) {
      st.scroll_y -= io.MouseWheel * row_h * 3.0f;
    } else {
      st.view = zoom_at(st.view, std::clamp(mouse.x - x0, 0.0f, width), std::pow(1.25, io.MouseWheel), full * 4.0);
    }
  }
  if (active && ImGui::IsMouseClicked(ImGuiMouseButton_Left) && io.KeyShift)
    st.drag_anchor_ns = st.view.to_time(mouse.x - x0);
  if (active && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 2.0f)) {
    if (st.drag_anchor_ns) {
      double t = st.view.to_time(mouse.x - x0);
      auto a = static_cast<std::int64_t>(std::min(*st.drag_anchor_ns, t));
      auto b = static_cast<std::int64_t>(std::max(*st.drag_anchor_ns, t));
      st.range_sel = std::make_pair(a, b);
    } else {
      st.view = pan_px(st.view, io.MouseDelta.x);
      st.scroll_y -= io.MouseDelta.y;
    }
  }
  if (active && ImGui::IsMouseDragging(ImGuiMouseButton_Right, 2.0f)) st.view = pan_px(st.view, io.MouseDelta.x);
  st.view = keep_in(st.view, static_cast<double>(m.t_min_ns), static_cast<double>(m.t_max_ns));
  if (ImGui::IsItemDeactivated() && st.drag_anchor_ns) {
    st.drag_anchor_ns.reset();
    if (st.range_sel) {
      SelectionStats stats(st.range_sel->first, st.range_sel->second);
      for (const auto& [track, levels] : m.levels) {
        if (m.kernels.count(track)) continue;
        for (const auto& level : levels) stats.add(level, m.run.ranges_of(track));
      }
      st.range_stats = stats.result();
      st.selected.reset();
    }
  }

  dl->PushClipRect(p0, ImVec2(p0.x + size.x, p0.y + size.y), true);
  dl->AddRectFilled(p0, ImVec2(p0.x + size.x, p0.y + size.y), IM_COL32(20, 21, 25, 255));

  // Lanes, scrolled vertically under the ruler.
  float total_h = 0;
  std::vector<int> ranks_seen;
  for (const auto& lane : st.lanes) {
    if (std::find(ranks_seen.begin(), ranks_seen.end(), lane->rank()) == ranks_seen.end()) {
      ranks_seen.push_back(lane->rank());
      total_h += row_h + 2;
    }
    if (std::find(st.collapsed.begin(), st.collapsed.end(), lane->rank()) == st.collapsed.end()) total_h += lane->height(row_h) + 3;
  }
  const float lanes_top = p0.y + ruler_h;
  const float lanes_h = size.y - ruler_h;
  st.scroll_y = std::clamp(st.scroll_y, 0.0f, std::max(0.0f, total_h - lanes_h + row_h));

  static std::vector<DrawRun> scratch;  // reused across frames: no per-frame allocation
  LaneContext ctx{m, st, dl, st.view, x0, row_h, mouse, in_lanes, scratch, std::nullopt, 0};
  if (st.selected) ctx.linked_corr = corr_of(m, *st.selected);
  if (st.hovered && corr_of(m, *st.hovered) != 0) ctx.linked_corr = corr_of(m, *st.hovered);

  dl->PushClipRect(ImVec2(p0.x, lanes_top), ImVec2(p0.x + size.x, p0.y + size.y), true);
  float y = lanes_top - st.scroll_y;
  int current_rank = INT32_MIN;
  std::vector<std::pair<float, float>> rank_spans;  // y extent of each rank's lanes, for step lines
  std::vector<int> rank_ids;
  for (const auto& lane : st.lanes) {
    if (lane->rank() != current_rank) {
      current_rank = lane->rank();
      bool folded = std::find(st.collapsed.begin(), st.collapsed.end(), current_rank) != st.collapsed.end();
      dl->AddRectFilled(ImVec2(p0.x, y), ImVec2(p0.x + size.x, y + row_h), IM_COL32(38, 40, 48, 255));
      std::string head = std::string(folded ? "+ " : "- ") + "rank " + std::to_string(current_rank);
      for (const auto& r : m.run.ranks)
        if (r.rank == current_rank) head += "   " + r.device + " @ " + r.host;
      dl->AddText(ImVec2(p0.x + 6, y + 2), color::kText, head.c_str());
      if (hovered && ImGui::IsMouseClicked(ImGuiMouseButton_Left) && mouse.y >= y && mouse.y < y + row_h && mouse.x < x0) {
        if (folded) std::erase(st.collapsed, current_rank);
        else st.collapsed.push_back(current_rank);
      }
      y += row_h + 2;
      rank_spans.push_back({y, y});
      rank_ids.push_back(current_rank);
    }
    if (std::find(st.collapsed.begin(), st.collapsed.end(), lane->rank()) != st.collapsed.end()) continue;
    float h = lane->height(row_h);
    if (y + h >= lanes_top && y <= p0.y + size.y) {
      dl->AddRectFilled(ImVec2(p0.x, y), ImVec2(x0 - 2, y + h), IM_COL32(30, 31, 37, 255));
      std::string label = lane->label();
      dl->PushClipRect(ImVec2(p0.x, y), ImVec2(x0 - 4, y + h), true);
      dl->AddText(ImVec2(p0.x + 14, y + 3), color::kText, label.c_str());
      dl->PopClipRect();
      dl->PushClipRect(ImVec2(x0, std::max(y, lanes_top)), ImVec2(x0 + width, y + h), true);
      lane->draw(ctx, y);
      dl->PopClipRect();
    }
    y += h + 3;
    dl->AddLine(ImVec2(p0.x, y - 2), ImVec2(p0.x + size.x, y - 2), IM_COL32(45, 47, 55, 255));
    rank_spans.back().second = y;
  }
  // Step boundaries across each rank's lanes, with the step number.
  for (std::size_t i = 0; i < rank_ids.size(); ++i) {
    for (const auto& s : m.run.steps) {
      if (s.rank != rank_ids[i]) continue;
      float sx = x0 + static_cast<float>(st.view.to_px(static_cast<double>(s.start_ns)));
      if (sx < x0 || sx > x0 + width) continue;
      dl->AddLine(ImVec2(sx, rank_spans[i].first - row_h - 2), ImVec2(sx, rank_spans[i].second), IM_COL32(255, 255, 255, 70), 1.0f);
      std::string t = "step " + std::to_string(s.step);
      dl->AddText(ImVec2(sx + 3, rank_spans[i].first - row_h), IM_COL32(255, 255, 255, 150), t.c_str());
    }
  }
  dl->PopClipRect();

  // The ruler: ticks relative to the start of the run, occurrence markers, the selection.
  dl->AddRectFilled(p0, ImVec2(p0.x + size.x, lanes_top), IM_COL32(30, 31, 37, 255));
  const double step = nice_step(st.view.span_ns(), width / (lh * 8.0));
  const double origin = static_cast<double>(m.t_min_ns);
  for (double t : ticks(st.view.t0_ns - origin, st.view.t1_ns - origin, step)) {
    float tx = x0 + static_cast<float>(st.view.to_px(t + origin));
    dl->AddLine(ImVec2(tx, lanes_top - lh * 0.7f), ImVec2(tx, lanes_top), color::kAxis);
    dl->AddLine(ImVec2(tx, lanes_top), ImVec2(tx, p0.y + size.y), IM_COL32(255, 255, 255, 14));
    std::string s = format_tick(t, step);
    dl->AddText(ImVec2(tx + 3, p0.y + 2), color::kDim, s.c_str());
  }
  dl->AddText(ImVec2(p0.x + 6, p0.y + 2), color::kDim, "time since start");
  if (!st.occurrences.empty()) {
    float last = -1;
    // Markers from the first occurrence in the window, at most one per pixel.
    auto first = std::partition_point(st.occurrences.begin(), st.occurrences.end(), [&](const EventRef& e) {
      return static_cast<double>(extent_of(m, e).second) < st.view.t0_ns;
    });
    for (auto it = first; it != st.occurrences.end(); ++it) {
      auto [s, e] = extent_of(m, *it);
      float ox = x0 + static_cast<float>(st.view.to_px(static_cast<double>(s)));
      if (ox > x0 + width) break;
      if (ox - last < 1.0f) continue;
      last = ox;
      dl->AddRectFilled(ImVec2(ox, lanes_top - 6), ImVec2(ox + 2, lanes_top), color::kSelect);
    }
  }
  if (st.range_sel) {
    float a = x0 + static_cast<float>(st.view.to_px(static_cast<double>(st.range_sel->first)));
    float b = x0 + static_cast<float>(st.view.to_px(static_cast<double>(st.range_sel->second)));
    dl->AddRectFilled(ImVec2(a, p0.y), ImVec2(b, p0.y + size.y), IM_COL32(255, 230, 90, 35));
    dl->AddLine(ImVec2(a, p0.y), ImVec2(a, p0.y + size.y), color::kSelect);
    dl->AddLine(ImVec2(b, p0.y), ImVec2(b, p0.y + size.y), color::kSelect);
    std::string s = fmt_ns(static_cast<double>(st.range_sel->second - st.range_sel->first));
    dl->AddText(ImVec2(a + 4, lanes_top - lh - 1), color::kSelect, s.c_str());
  }
  if (in_lanes) dl->AddLine(ImVec2(mouse.x, lanes_top), ImVec2(mouse.x, p0.y + size.y), IM_COL32(255, 255, 255, 60));
  dl->AddLine(ImVec2(x0 - 1, p0.y), ImVec2(x0 - 1, p0.y + size.y), color::kGrid);
  dl->PopClipRect();

  // Click without drag: select what is under the mouse (or clear).
  st.hovered = ctx.hovered;
  if (ImGui::IsItemDeactivated() && io.MouseDragMaxDistanceSqr[ImGuiMouseButton_Left] < 9.0f && mouse.x >= x0) {
    st.selected = ctx.hovered;
    if (ctx.hovered) st.range_sel.reset();
  }

  ImGui::BeginChild("##details", ImVec2(0, 0), false);
  details_panel(st, m);
  ImGui::EndChild();
}

}  // namespace wb::view
