// Timeline: per rank a group of lanes (host threads, GPU streams, data queues, allreduce buckets; a
// pipeline run's stage first, its micro-batches coloured and arrows for the messages) over
// a shared time axis with step boundaries. Wheel zooms at the cursor, drag pans, shift+drag selects a
// time range (statistics below), click selects an event (details below), find steps through an op's
// occurrences. Each lane draws only what is visible, merging sub-pixel events. A second run (File > Open
// second run, --compare) gets its own group of lanes below, shifted so both runs' step N start at the
// same x (by default the first steady step; a toggle and the step are in the toolbar).
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <unordered_set>

#include <imgui.h>

#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"
#include "app/view/timeline_lanes.hpp"

namespace wb::view {

using app_model::align_runs;
using app_model::Alignment;
using app_model::DrawRun;
using app_model::first_steady_step;
using app_model::fit_view;
using app_model::format_tick;
using app_model::keep_in;
using app_model::nice_step;
using app_model::pan_px;
using app_model::RunModel;
using app_model::SelectionStats;
using app_model::shifted;
using app_model::ticks;
using app_model::zoom_at;

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

void second_run_controls(App& app, TimelineState& st, const RunModel& m);
void path_panel(TimelineState& st, const RunModel& m);

// The critical path the Timeline outlines: the run's, or a windowed run's sample's (its steps only).
const analysis::CriticalPath& critical_path(const TimelineState& st, const RunModel& m) {
  return st.path_sample ? st.path_sample->critical : m.critical;
}

void toolbar(App& app, TimelineState& st, const RunModel& m) {
  if (ImGui::Button("Fit all")) st.fitted = false;
  ImGui::SameLine();
  // Steps of the first rank, to jump to one.
  std::vector<const store::StepRow*> steps;
  int first_rank = m.steps().empty() ? 0 : m.steps().front().rank;
  for (const auto& s : m.steps())
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
  second_run_controls(app, st, m);
  if (!critical_path(st, m).steps.empty()) {
    ImGui::SameLine(0, 20);
    ImGui::Checkbox("critical path", &st.show_path);
  }
  ImGui::SameLine(0, 20);
  ImGui::TextColored(to_vec4(color::kDim), "window %s   wheel: zoom   drag: pan   shift+drag: select range   click: select",
                     fmt_ns(st.view.span_ns()).c_str());
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
    if (st.path_shown >= 0) {
      path_panel(st, m);
      return;
    }
    ImGui::TextColored(to_vec4(color::kDim), "Click an event for its details; shift+drag across lanes for statistics of a time range.");
    return;
  }
  const EventRef& ref = *st.selected;
  if (ref.kernel) {
    const auto& k = m.run.kernels.at(ref.track)[ref.row];
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
    for (const auto& [track, ks] : m.run.kernels)
      for (const auto& k : ks)
        if (k.corr_id == r.corr_id && n++ < 8)
          ImGui::BulletText("kernel %s  %s", m.run.name(k.name).c_str(), fmt_ns(static_cast<double>(k.end_ns - k.start_ns)).c_str());
  }
}

// One run's lanes in the timeline: the run, its lanes, the key its ranks fold under in
// TimelineState::collapsed, and the shift from the first run's clock to its own (t2 = t1 + offset).
constexpr int kSecondRunRanks = 1 << 20;
struct LaneGroup {
  const RunModel* model;
  const std::vector<std::shared_ptr<Lane>>* lanes;
  int collapse_base;
  double offset_ns;
  std::string title;  // drawn as a header when not empty
};

// The geometry every group draws into this frame.
struct GroupFrame {
  ImDrawList* dl;
  ImVec2 p0, size;
  float x0, width, row_h, lanes_top;
  ImVec2 mouse;
  bool in_lanes, hovered;
};

bool folded(const TimelineState& st, int key) { return std::find(st.collapsed.begin(), st.collapsed.end(), key) != st.collapsed.end(); }

float group_height(const LaneGroup& g, const TimelineState& st, float row_h) {
  float h = g.title.empty() ? 0.0f : row_h + 2;
  std::vector<int> ranks_seen;
  for (const auto& lane : *g.lanes) {
    if (std::find(ranks_seen.begin(), ranks_seen.end(), lane->rank()) == ranks_seen.end()) {
      ranks_seen.push_back(lane->rank());
      h += row_h + 2;
    }
    if (!folded(st, g.collapse_base + lane->rank())) h += lane->height(row_h) + 3;
  }
  return h;
}

// Draws a group from y (rank headers that fold on click, lanes, step boundaries); returns the y below.
float draw_group(const LaneGroup& g, LaneContext& ctx, TimelineState& st, const GroupFrame& f, float y) {
  ImDrawList* dl = f.dl;
  const RunModel& m = *g.model;
  if (!g.title.empty()) {
    const bool is_second = g.collapse_base != 0;
    dl->AddRectFilled(ImVec2(f.p0.x, y), ImVec2(f.p0.x + f.size.x, y + f.row_h), is_second ? IM_COL32(58, 44, 74, 255) : IM_COL32(40, 52, 70, 255));
    dl->AddText(ImVec2(f.p0.x + 6, y + 2), is_second ? IM_COL32(225, 195, 255, 255) : IM_COL32(190, 215, 255, 255), g.title.c_str());
    y += f.row_h + 2;
  }
  int current_rank = INT32_MIN;
  std::vector<std::pair<float, float>> rank_spans;  // y extent of each rank's lanes, for step lines
  std::vector<int> rank_ids;
  for (const auto& lane : *g.lanes) {
    const int key = g.collapse_base + lane->rank();
    if (lane->rank() != current_rank) {
      current_rank = lane->rank();
      const bool is_folded = folded(st, key);
      dl->AddRectFilled(ImVec2(f.p0.x, y), ImVec2(f.p0.x + f.size.x, y + f.row_h), IM_COL32(38, 40, 48, 255));
      std::string head = std::string(is_folded ? "+ " : "- ") + "rank " + std::to_string(current_rank);
      for (const auto& r : m.run.ranks)
        if (r.rank == current_rank) head += "   " + r.device + " @ " + r.host;
      if (m.pipeline_plan && m.pipeline_plan->stages > 0) {  // rank = replica * stages + stage
        const int stage = current_rank % m.pipeline_plan->stages;
        head += "   pipeline stage " + std::to_string(stage);
        if (stage < static_cast<int>(m.pipeline_plan->stage_names.size()))
          head += " (" + m.pipeline_plan->stage_names[static_cast<std::size_t>(stage)] + ")";
        if (m.pipeline_plan->replicas > 1) head += ", replica " + std::to_string(current_rank / m.pipeline_plan->stages);
      }
      dl->AddText(ImVec2(f.p0.x + 6, y + 2), color::kText, head.c_str());
      if (f.hovered && ImGui::IsMouseClicked(ImGuiMouseButton_Left) && f.mouse.y >= y && f.mouse.y < y + f.row_h && f.mouse.x < f.x0) {
        if (is_folded) std::erase(st.collapsed, key);
        else st.collapsed.push_back(key);
      }
      y += f.row_h + 2;
      rank_spans.push_back({y, y});
      rank_ids.push_back(current_rank);
    }
    if (folded(st, key)) continue;
    float h = lane->height(f.row_h);
    if (lane->track_id() != 0) ctx.state.lane_y[lane->track_id()] = y;
    if (y + h >= f.lanes_top && y <= f.p0.y + f.size.y) {
      dl->AddRectFilled(ImVec2(f.p0.x, y), ImVec2(f.x0 - 2, y + h), IM_COL32(30, 31, 37, 255));
      std::string label = lane->label();
      dl->PushClipRect(ImVec2(f.p0.x, y), ImVec2(f.x0 - 4, y + h), true);
      dl->AddText(ImVec2(f.p0.x + 14, y + 3), color::kText, label.c_str());
      dl->PopClipRect();
      dl->PushClipRect(ImVec2(f.x0, std::max(y, f.lanes_top)), ImVec2(f.x0 + f.width, y + h), true);
      lane->draw(ctx, y);
      dl->PopClipRect();
    }
    y += h + 3;
    dl->AddLine(ImVec2(f.p0.x, y - 2), ImVec2(f.p0.x + f.size.x, y - 2), IM_COL32(45, 47, 55, 255));
    rank_spans.back().second = y;
  }
  // Step boundaries across each rank's lanes, with the step number: at most a line every 4 px and a label
  // where the last one ends (a long run zoomed out has a step or more a pixel), in one pass over the steps.
  std::vector<float> last_line(rank_ids.size(), -1e9f), last_label(rank_ids.size(), -1e9f);
  for (const auto& s : m.steps()) {
    const auto at = std::find(rank_ids.begin(), rank_ids.end(), s.rank);
    if (at == rank_ids.end()) continue;
    const auto i = static_cast<std::size_t>(at - rank_ids.begin());
    float sx = f.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(s.start_ns)));
    if (sx < f.x0 || sx > f.x0 + f.width || std::abs(sx - last_line[i]) < 4.0f) continue;
    last_line[i] = sx;
    dl->AddLine(ImVec2(sx, rank_spans[i].first - f.row_h - 2), ImVec2(sx, rank_spans[i].second), IM_COL32(255, 255, 255, 70),
                1.0f);
    if (sx < last_label[i]) continue;  // on the last label
    std::string t = "step " + std::to_string(s.step);
    dl->AddText(ImVec2(sx + 3, rank_spans[i].first - f.row_h), IM_COL32(255, 255, 255, 150), t.c_str());
    last_label[i] = sx + 3 + ImGui::CalcTextSize(t.c_str()).x + 6;
  }
  return y;
}

// "time vs second run": the heat of each layer of the first run, by (name id, category).
void ratio_controls(App& app, TimelineState& st, const RunModel& m) {
  ImGui::SameLine();
  ImGui::Checkbox("time vs second run", &st.color_by_ratio);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Colour this run's layers by their time per step over the second run's (wb diff):\n"
                      "green at least 2x faster, grey equal, red at least 2x slower; other ranges grey");
  if (!st.color_by_ratio || st.ratio_model == &m) return;
  const app_model::LayerTiming* timing = app.layer_timing();
  if (!timing) {
    if (!app.layer_timing_error().empty()) {
      ImGui::SameLine();
      ImGui::TextColored(to_vec4(color::kWarn), "%s", app.layer_timing_error().c_str());
    }
    return;
  }
  st.ratio_heat.clear();
  for (const auto& row : timing->diff.rows) {
    if (!row.a || !row.b) continue;
    if (auto id = m.find_name(row.name)) st.ratio_heat[{*id, static_cast<std::uint8_t>(row.direction)}] = app_model::ratio_heat(row.ratio());
  }
  st.ratio_model = &m;
}

void second_run_controls(App& app, TimelineState& st, const RunModel& m) {
  if (!app.second) return;
  ImGui::SameLine(0, 20);
  ratio_controls(app, st, m);
  ImGui::SameLine();
  ImGui::Checkbox("second run", &st.show_second);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Show %s's lanes below this run's", app.second->title().c_str());
  if (!st.show_second) return;
  ImGui::SameLine();
  ImGui::Checkbox("align at step", &st.align);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Shift the second run so its step N starts where this run's does (else: run starts)");
  ImGui::SameLine();
  if (st.align_step < 0) st.align_step = first_steady_step(m.steps()).value_or(0);
  ImGui::SetNextItemWidth(90);
  ImGui::InputInt("##alignstep", &st.align_step);
  st.align_step = std::max(st.align_step, 0);
}

// The timeline's place this frame (the label column on the left, the ruler on top, the lanes below)
// and the mouse over it.
struct TimelineFrame {
  ImDrawList* dl;
  ImVec2 p0, size;
  float lh, ruler_h, x0, width, row_h, lanes_top;
  ImVec2 mouse;
  bool hovered, active, in_lanes;
};

// Fits the view to the run on first show, takes a window another view asked for, and sets its width.
void place_view(TimelineState& st, const RunModel& m, float width) {
  if (!st.fitted) {
    st.view = fit_view(static_cast<double>(m.t_min_ns), static_cast<double>(m.t_max_ns), width);
    st.fitted = true;
  }
  if (st.zoom_to) {  // another view asked for this window (the Overview's captured windows)
    st.view.t0_ns = st.zoom_to->first;
    st.view.t1_ns = st.zoom_to->second;
    st.zoom_to.reset();
  }
  st.view.width_px = width;
}

// Input: zoom at the cursor, pan, select (a shift+drag time range gets its statistics on release).
void handle_input(TimelineState& st, const RunModel& m, const TimelineFrame& f) {
  const double full = static_cast<double>(std::max<std::int64_t>(m.t_max_ns - m.t_min_ns, 1000));
  ImGuiIO& io = ImGui::GetIO();
  const ImVec2 mouse = f.mouse;
  if (f.hovered && io.MouseWheel != 0.0f) {
    if (io.KeyShift) {
      st.scroll_y -= io.MouseWheel * f.row_h * 3.0f;
    } else {
      st.view = zoom_at(st.view, std::clamp(mouse.x - f.x0, 0.0f, f.width), std::pow(1.25, io.MouseWheel), full * 4.0);
    }
  }
  if (f.active && ImGui::IsMouseClicked(ImGuiMouseButton_Left) && io.KeyShift)
    st.drag_anchor_ns = st.view.to_time(mouse.x - f.x0);
  if (f.active && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 2.0f)) {
    if (st.drag_anchor_ns) {
      double t = st.view.to_time(mouse.x - f.x0);
      auto a = static_cast<std::int64_t>(std::min(*st.drag_anchor_ns, t));
      auto b = static_cast<std::int64_t>(std::max(*st.drag_anchor_ns, t));
      st.range_sel = std::make_pair(a, b);
    } else {
      st.view = pan_px(st.view, io.MouseDelta.x);
      st.scroll_y -= io.MouseDelta.y;
    }
  }
  if (f.active && ImGui::IsMouseDragging(ImGuiMouseButton_Right, 2.0f)) st.view = pan_px(st.view, io.MouseDelta.x);
  st.view = keep_in(st.view, static_cast<double>(m.t_min_ns), static_cast<double>(m.t_max_ns));
  if (ImGui::IsItemDeactivated() && st.drag_anchor_ns) {
    st.drag_anchor_ns.reset();
    if (st.range_sel) {
      SelectionStats stats(st.range_sel->first, st.range_sel->second);
      for (const auto& [track, levels] : m.levels) {
        if (m.run.kernels.count(track)) continue;
        for (const auto& level : levels) stats.add(level, m.run.ranges_of(track));
      }
      st.range_stats = stats.result();
      st.selected.reset();
    }
  }
}

// The run's lane group, and a second run's (when shown) shifted to line up with it.
std::array<LaneGroup, 2> lane_groups(TimelineState& st, const RunModel& m, const RunModel* second) {
  Alignment alignment;
  if (second) {
    if (st.second_for != second) {
      st.second_lanes = make_lanes(*second);
      st.second_for = second;
    }
    std::optional<int> step;
    if (st.align) step = st.align_step >= 0 ? std::optional<int>(st.align_step) : first_steady_step(m.steps());
    alignment = align_runs(m.steps(), m.t_min_ns, second->steps(), second->t_min_ns, step);
  }
  std::array<LaneGroup, 2> groups{{{&m, &st.lanes, 0, 0.0, ""}, {second, &st.second_lanes, kSecondRunRanks, alignment.offset_ns, ""}}};
  if (second) {
    groups[0].title = "this run: " + m.title();
    groups[1].title = "second run: " + second->title() +
                      (alignment.step ? "   (step " + std::to_string(*alignment.step) + " starts where this run's does)"
                                      : "   (aligned at the start of the runs)");
  }
  return groups;
}

// Lanes, scrolled vertically under the ruler: the run's, then a second run's in its own group.
// Returns the event of the run under the mouse.
std::optional<EventRef> draw_lanes(const std::array<LaneGroup, 2>& groups, int group_count, TimelineState& st,
                                   const RunModel& m, const TimelineFrame& f) {
  ImDrawList* dl = f.dl;
  float total_h = 0;
  for (int g = 0; g < group_count; ++g) total_h += group_height(groups[g], st, f.row_h);
  const float lanes_h = f.size.y - f.ruler_h;
  st.scroll_y = std::clamp(st.scroll_y, 0.0f, std::max(0.0f, total_h - lanes_h + f.row_h));

  static std::vector<DrawRun> scratch;  // reused across frames: no per-frame allocation
  std::optional<EventRef> hovered_event;
  std::uint64_t linked = 0;
  if (st.selected) linked = corr_of(m, *st.selected);
  if (st.hovered && corr_of(m, *st.hovered) != 0) linked = corr_of(m, *st.hovered);

  dl->PushClipRect(ImVec2(f.p0.x, f.lanes_top), ImVec2(f.p0.x + f.size.x, f.p0.y + f.size.y), true);
  st.lane_y.clear();
  float y = f.lanes_top - st.scroll_y;
  GroupFrame frame{dl, f.p0, f.size, f.x0, f.width, f.row_h, f.lanes_top, f.mouse, f.in_lanes, f.hovered};
  for (int g = 0; g < group_count; ++g) {
    // The second run has its own string and track ids: nothing of the first run's selection applies.
    TimelineState unrelated;
    TimelineState& gs = g == 0 ? st : unrelated;
    LaneContext ctx{*groups[g].model, gs, dl, shifted(st.view, groups[g].offset_ns), f.x0, f.row_h, f.mouse, f.in_lanes, scratch, std::nullopt,
                    g == 0 ? linked : 0};
    y = draw_group(groups[g], ctx, st, frame, y);
    if (g == 0) hovered_event = ctx.hovered;
  }
  dl->PopClipRect();
  return hovered_event;
}

// The ruler's ticks, relative to the start of the run, with grid lines down the lanes.
void draw_ticks(const TimelineState& st, const RunModel& m, const TimelineFrame& f) {
  ImDrawList* dl = f.dl;
  dl->AddRectFilled(f.p0, ImVec2(f.p0.x + f.size.x, f.lanes_top), IM_COL32(30, 31, 37, 255));
  const double step = nice_step(st.view.span_ns(), f.width / (f.lh * 8.0));
  const double origin = static_cast<double>(m.t_min_ns);
  for (double t : ticks(st.view.t0_ns - origin, st.view.t1_ns - origin, step)) {
    float tx = f.x0 + static_cast<float>(st.view.to_px(t + origin));
    dl->AddLine(ImVec2(tx, f.lanes_top - f.lh * 0.7f), ImVec2(tx, f.lanes_top), color::kAxis);
    dl->AddLine(ImVec2(tx, f.lanes_top), ImVec2(tx, f.p0.y + f.size.y), IM_COL32(255, 255, 255, 14));
    std::string s = format_tick(t, step);
    dl->AddText(ImVec2(tx + 3, f.p0.y + 2), color::kDim, s.c_str());
  }
  dl->AddText(ImVec2(f.p0.x + 6, f.p0.y + 2), color::kDim, "time since start");
}

// Markers on the ruler at the found occurrences, from the first one in the window, at most one per pixel.
void draw_occurrence_markers(const TimelineState& st, const RunModel& m, const TimelineFrame& f) {
  if (st.occurrences.empty()) return;
  float last = -1;
  auto first = std::partition_point(st.occurrences.begin(), st.occurrences.end(), [&](const EventRef& e) {
    return static_cast<double>(extent_of(m, e).second) < st.view.t0_ns;
  });
  for (auto it = first; it != st.occurrences.end(); ++it) {
    auto [s, e] = extent_of(m, *it);
    float ox = f.x0 + static_cast<float>(st.view.to_px(static_cast<double>(s)));
    if (ox > f.x0 + f.width) break;
    if (ox - last < 1.0f) continue;
    last = ox;
    f.dl->AddRectFilled(ImVec2(ox, f.lanes_top - 6), ImVec2(ox + 2, f.lanes_top), color::kSelect);
  }
}

// The selected time range, shaded over the lanes with its length on the ruler.
void draw_range_selection(const TimelineState& st, const TimelineFrame& f) {
  if (!st.range_sel) return;
  ImDrawList* dl = f.dl;
  float a = f.x0 + static_cast<float>(st.view.to_px(static_cast<double>(st.range_sel->first)));
  float b = f.x0 + static_cast<float>(st.view.to_px(static_cast<double>(st.range_sel->second)));
  dl->AddRectFilled(ImVec2(a, f.p0.y), ImVec2(b, f.p0.y + f.size.y), IM_COL32(255, 230, 90, 35));
  dl->AddLine(ImVec2(a, f.p0.y), ImVec2(a, f.p0.y + f.size.y), color::kSelect);
  dl->AddLine(ImVec2(b, f.p0.y), ImVec2(b, f.p0.y + f.size.y), color::kSelect);
  std::string s = fmt_ns(static_cast<double>(st.range_sel->second - st.range_sel->first));
  dl->AddText(ImVec2(a + 4, f.lanes_top - f.lh - 1), color::kSelect, s.c_str());
}

constexpr ImU32 kPathColor = IM_COL32(255, 150, 40, 255);


// The critical path of one step over the main-thread lanes: each segment outlined on its rank's op row
// (depth 1), a line where the path passes from one rank to another, and its length by the ruler.
void draw_critical_path(TimelineState& st, const RunModel& m, const TimelineFrame& f) {
  st.path_shown = -1;
  const analysis::CriticalPath& critical = critical_path(st, m);
  if (!st.show_path || !m.ready() || critical.steps.empty()) return;
  const double t = f.in_lanes ? st.view.to_time(f.mouse.x - f.x0) : 0.5 * (st.view.t0_ns + st.view.t1_ns);
  const analysis::StepPath* p = app_model::path_step_at(critical, st.path_step, t);
  if (p == nullptr) return;
  st.path_shown = p->step;
  ImDrawList* dl = f.dl;
  dl->PushClipRect(ImVec2(f.x0, f.lanes_top), ImVec2(f.x0 + f.width, f.p0.y + f.size.y), true);
  // Segments under a pixel merge with their neighbours on the same row (a step can have 100,000s), and
  // those out of the window are skipped: the path costs the pixels, not the segments.
  struct Box {
    float x0, x1, y0, y1;
    bool idle;
  };
  std::optional<Box> box;
  std::optional<ImVec2> prev;  // the end of the previous box, mid-height
  const float left = f.x0 - 4.0f, right = f.x0 + f.width + 4.0f;
  auto flush = [&] {
    if (!box) return;
    const Box& b = *box;
    if (b.x1 >= left && b.x0 <= right) {
      const float x0 = std::max(b.x0, left), x1 = std::min(b.x1, right);
      if (b.idle) {
        dl->AddLine(ImVec2(x0, (b.y0 + b.y1) * 0.5f), ImVec2(x1, (b.y0 + b.y1) * 0.5f), kPathColor, 2.0f);
      } else {
        dl->AddRectFilled(ImVec2(x0, b.y0), ImVec2(x1, b.y1), with_alpha(kPathColor, 60));
        dl->AddRect(ImVec2(x0 - 1, b.y0 - 1), ImVec2(x1 + 1, b.y1 + 1), kPathColor, 0, 0, 2.0f);
      }
      const ImVec2 start(x0, (b.y0 + b.y1) * 0.5f);
      if (prev && std::abs(prev->y - start.y) > 1.0f) dl->AddLine(*prev, start, kPathColor, 2.0f);
    }
    prev = ImVec2(std::clamp(b.x1, left, right), (b.y0 + b.y1) * 0.5f);
    box.reset();
  };
  for (const auto& seg : p->segments) {
    // A GPU trace's path names its thread or stream; the others run on their rank's main thread.
    std::uint32_t lane = seg.track;
    if (lane == 0) {
      auto track = m.main_tracks.find(seg.rank);
      if (track == m.main_tracks.end()) continue;
      lane = track->second;
    }
    auto ly = st.lane_y.find(lane);
    if (ly == st.lane_y.end()) {
      flush();
      prev.reset();
      continue;  // the rank is folded
    }
    // Under the step row on a thread; a stream's activities are on its first row.
    const store::TrackRow* tr = m.run.track(lane);
    const float row = tr != nullptr && tr->kind == store::TrackKind::stream ? 0.0f : 1.0f;
    const float y0 = ly->second + 2.0f + row * f.row_h, y1 = y0 + f.row_h - 1.0f;
    const float x0 = f.x0 + static_cast<float>(st.view.to_px(static_cast<double>(seg.start_ns)));
    const float x1 = std::max(f.x0 + static_cast<float>(st.view.to_px(static_cast<double>(seg.end_ns))), x0 + 1.0f);
    const bool idle = seg.kind == "gap" || seg.kind == "comm";  // gaps and hand-offs: a thin line
    // A segment (or a box so far) under 2 px joins its neighbour on the row; wider ones keep their own
    // outline, so each op on the path reads as one when zoomed in.
    if (box && box->y0 == y0 && x0 <= box->x1 + 1.0f && (x1 - x0 < 2.0f || box->x1 - box->x0 < 2.0f)) {
      box->x1 = std::max(box->x1, x1);
      box->idle = box->idle && idle;
      continue;
    }
    flush();
    box = Box{x0, x1, y0, y1, idle};
  }
  flush();
  dl->PopClipRect();
}

// On the ruler (drawn after it): which step's path is outlined.
void draw_path_label(const TimelineState& st, const RunModel& m, const TimelineFrame& f) {
  const analysis::StepPath* p =
      st.path_shown >= 0 ? app_model::path_step_at(critical_path(st, m), st.path_shown, 0.0) : nullptr;
  if (p == nullptr) return;
  const std::string label = "critical path, step " + std::to_string(p->step) + ": " +
                            fmt_ns(static_cast<double>(p->end_ns - p->start_ns)) +
                            (st.path_step >= 0 ? " (pinned)" : " (the step under the cursor)");
  const ImVec2 size = ImGui::CalcTextSize(label.c_str());
  const ImVec2 at(f.x0 + f.width - size.x - 6, f.p0.y + 2);
  f.dl->AddRectFilled(ImVec2(at.x - 6, f.p0.y), ImVec2(at.x + size.x + 6, at.y + size.y + 2), IM_COL32(30, 31, 37, 255));
  f.dl->AddText(at, kPathColor, label.c_str());
}

// The outlined step's path segment by segment; a click on a row pins the step and zooms to the segment.
void path_panel(TimelineState& st, const RunModel& m) {
  const analysis::StepPath* p = app_model::path_step_at(critical_path(st, m), st.path_shown, 0.0);
  if (p == nullptr) return;
  const double total = static_cast<double>(std::max<std::int64_t>(1, p->end_ns - p->start_ns));
  ImGui::TextColored(to_vec4(kPathColor), "Critical path of step %d: %s, %zu segments (the chain of work that set the step's end)",
                     p->step, fmt_ns(total).c_str(), p->segments.size());
  ImGui::SameLine();
  if (st.path_step >= 0 && ImGui::SmallButton("unpin")) st.path_step = -1;
  if (!ImGui::BeginTable("##path", 5, ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_BordersInnerV,
                         ImVec2(0, ImGui::GetContentRegionAvail().y)))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  for (const char* h : {"segment", "rank", "kind", "time", "% of step"}) ImGui::TableSetupColumn(h);
  ImGui::TableHeadersRow();
  for (std::size_t i = 0; i < p->segments.size(); ++i) {
    const auto& seg = p->segments[i];
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::PushID(static_cast<int>(i));
    if (ImGui::Selectable(seg.name.c_str(), false, ImGuiSelectableFlags_SpanAllColumns)) {
      st.path_step = p->step;
      const double d = static_cast<double>(seg.end_ns - seg.start_ns);
      const double pad = std::max(d * 1.5, 20000.0);
      st.view.t0_ns = static_cast<double>(seg.start_ns) - pad;
      st.view.t1_ns = static_cast<double>(seg.end_ns) + pad;
    }
    ImGui::PopID();
    ImGui::TableNextColumn();
    ImGui::Text("%d", seg.rank);
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(seg.kind.c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_ns(static_cast<double>(seg.end_ns - seg.start_ns)).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_pct(static_cast<double>(seg.end_ns - seg.start_ns) / total).c_str());
  }
  ImGui::EndTable();
}

}  // namespace

void draw_timeline(App& app) {
  const RunModel& m = *app.model;
  TimelineState& st = app.timeline;
  if (st.lanes_for != &m) {
    st.lanes = make_lanes(m);
    st.lanes_for = &m;
  }
  st.path_sample = nullptr;
  if (m.windowed())
    if (auto sample = m.window->sample(); sample && sample->ready()) st.path_sample = std::move(sample);
  toolbar(app, st, m);

  const float details_h = (st.selected || st.range_sel || st.path_shown >= 0) ? 170.0f : ImGui::GetTextLineHeightWithSpacing() + 8;
  ImVec2 avail = ImGui::GetContentRegionAvail();
  TimelineFrame f;
  f.p0 = ImGui::GetCursorScreenPos();
  f.size = ImVec2(avail.x, std::max(100.0f, avail.y - details_h));
  ImGui::InvisibleButton("##timeline", f.size, ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  f.hovered = ImGui::IsItemHovered();
  f.active = ImGui::IsItemActive();
  f.dl = ImGui::GetWindowDrawList();
  f.lh = ImGui::GetTextLineHeight();
  const float label_w = std::clamp(f.size.x * 0.13f, 130.0f, 220.0f);
  f.ruler_h = f.lh * 2.2f;
  f.x0 = f.p0.x + label_w;
  f.width = std::max(10.0f, f.size.x - label_w - 6.0f);
  f.row_h = f.lh + 5.0f;
  f.lanes_top = f.p0.y + f.ruler_h;
  f.mouse = ImGui::GetIO().MousePos;
  f.in_lanes = f.hovered && f.mouse.x >= f.x0 && f.mouse.y > f.p0.y + f.ruler_h;

  place_view(st, m, f.width);
  // Pinned before the run was open: show the step (a windowed run's once its sample is analysed).
  if (st.path_step >= 0 && !st.path_zoomed && m.ready() && (!m.windowed() || st.path_sample)) {
    st.path_zoomed = true;
    if (const auto* p = app_model::path_step_at(critical_path(st, m), st.path_step, 0.0)) {
      const double pad = 0.02 * static_cast<double>(p->end_ns - p->start_ns);
      st.view.t0_ns = static_cast<double>(p->start_ns) - pad;
      st.view.t1_ns = static_cast<double>(p->end_ns) + pad;
    }
  }
  handle_input(st, m, f);
  if (m.windowed()) m.window->want(st.view.t0_ns, st.view.t1_ns, f.width);

  ImDrawList* dl = f.dl;
  dl->PushClipRect(f.p0, ImVec2(f.p0.x + f.size.x, f.p0.y + f.size.y), true);
  dl->AddRectFilled(f.p0, ImVec2(f.p0.x + f.size.x, f.p0.y + f.size.y), IM_COL32(20, 21, 25, 255));

  const RunModel* second = (app.second && st.show_second) ? app.second.get() : nullptr;
  const std::array<LaneGroup, 2> groups = lane_groups(st, m, second);
  if (second && second->windowed()) {
    const auto v = shifted(st.view, groups[1].offset_ns);
    second->window->want(v.t0_ns, v.t1_ns, f.width);
  }
  const std::optional<EventRef> hovered_event = draw_lanes(groups, second ? 2 : 1, st, m, f);
  draw_critical_path(st, m, f);

  // The ruler: ticks relative to the start of the run, occurrence markers, the selection.
  draw_ticks(st, m, f);
  draw_occurrence_markers(st, m, f);
  draw_range_selection(st, f);
  draw_path_label(st, m, f);
  if (f.in_lanes) dl->AddLine(ImVec2(f.mouse.x, f.lanes_top), ImVec2(f.mouse.x, f.p0.y + f.size.y), IM_COL32(255, 255, 255, 60));
  dl->AddLine(ImVec2(f.x0 - 1, f.p0.y), ImVec2(f.x0 - 1, f.p0.y + f.size.y), color::kGrid);
  dl->PopClipRect();

  // Click without drag: select what is under the mouse (or clear).
  st.hovered = hovered_event;
  if (ImGui::IsItemDeactivated() && ImGui::GetIO().MouseDragMaxDistanceSqr[ImGuiMouseButton_Left] < 9.0f && f.mouse.x >= f.x0) {
    st.selected = hovered_event;
    if (hovered_event) st.range_sel.reset();
  }

  ImGui::BeginChild("##details", ImVec2(0, 0), false);
  details_panel(st, m);
  ImGui::EndChild();
}

}  // namespace wb::view
