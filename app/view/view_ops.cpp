// Ops: per-op statistics (count, total, self, mean, p50, p95, max, share of step time), sortable,
// filterable and clipped for long lists. Selecting an op outlines its occurrences in the timeline and
// shows the histogram of its durations (Tracy's find-zone). With a second run open, each op's mean and
// total time against the same op there.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <numeric>

#include <imgui.h>

#include "app/model/plot_logic.hpp"
#include "profiler/analysis/layer_diff.hpp"
#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"
#include "store/rows.hpp"

namespace wb::view {

using app_model::Histogram;
using app_model::make_histogram;
using app_model::op_deltas;
using app_model::OpDelta;
using app_model::RunModel;

namespace {

bool matches(std::string_view name, const char* filter) {
  if (!filter[0]) return true;
  std::string_view f(filter);
  auto it = std::search(name.begin(), name.end(), f.begin(), f.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
  });
  return it != name.end();
}

double step_time_total(const RunModel& m) {
  double t = 0;
  for (const auto& s : m.steps()) t += static_cast<double>(s.end_ns - s.start_ns);
  return t;
}

void rebuild_order(const RunModel& m, OpsState& st) {
  const auto& ops = m.ops.by_name;
  st.order.clear();
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    const auto& o = ops[static_cast<std::size_t>(i)];
    if (st.category >= 0 && static_cast<int>(o.category) != st.category) continue;
    if (!matches(o.name, st.filter)) continue;
    if (st.layers_only && (!analysis::is_layer_name(o.name) || analysis::op_type_of_layer(o.name) == analysis::OpType::other)) continue;
    st.order.push_back(i);
  }
  auto key = [&](const analysis::OpStat& o) -> double {
    switch (st.sort_column) {
      case OpsColumn::count: return static_cast<double>(o.count);
      case OpsColumn::total: return static_cast<double>(o.total_ns);
      case OpsColumn::self: return static_cast<double>(o.self_ns);
      case OpsColumn::mean: return o.mean_ns;
      case OpsColumn::p50: return static_cast<double>(o.p50_ns);
      case OpsColumn::p95: return static_cast<double>(o.p95_ns);
      case OpsColumn::max: return static_cast<double>(o.max_ns);
      case OpsColumn::share: return static_cast<double>(o.total_ns);
      case OpsColumn::name:
      case OpsColumn::category: return 0.0;
    }
    return 0.0;
  };
  std::stable_sort(st.order.begin(), st.order.end(), [&](int a, int b) {
    const auto& oa = ops[static_cast<std::size_t>(a)];
    const auto& ob = ops[static_cast<std::size_t>(b)];
    if (st.sort_column == OpsColumn::name) return st.sort_ascending ? oa.name < ob.name : oa.name > ob.name;
    if (st.sort_column == OpsColumn::category) return st.sort_ascending ? oa.category < ob.category : oa.category > ob.category;
    return st.sort_ascending ? key(oa) < key(ob) : key(oa) > key(ob);
  });
  st.dirty = false;
}

void duration_histogram(const RunModel& m, OpsState& st, const analysis::OpStat& op, ImVec2 size) {
  if (st.durations.empty()) return;
  std::vector<double> v(st.durations.begin(), st.durations.end());
  const bool log = st.log_bins && v.front() > 0 && v.back() / std::max(v.front(), 1.0) > 20.0;
  Histogram h = make_histogram(v, 60, log);
  Plot plot("##hist", size, 0.0, static_cast<double>(h.counts.size()), 0.0, static_cast<double>(h.max_count()) * 1.1 + 1,
            log ? "duration (log bins)" : "duration", "count", false,
            [&](double b) {
              int i = static_cast<int>(std::lround(b));
              if (i < 0 || i > static_cast<int>(h.counts.size()) || std::abs(b - i) > 1e-6) return std::string();
              return fmt_ns(h.edges[static_cast<std::size_t>(i)]);
            },
            [](double c) { return fmt_num(c, 4); });
  ImDrawList* dl = plot.draw_list();
  for (std::size_t i = 0; i < h.counts.size(); ++i) {
    if (h.counts[i] == 0) continue;
    dl->AddRectFilled(ImVec2(plot.x(static_cast<double>(i)) + 1, plot.y(static_cast<double>(h.counts[i]))),
                      ImVec2(plot.x(static_cast<double>(i + 1)) - 1, plot.y(0)), category_color(static_cast<std::uint8_t>(op.category)));
  }
  // Mean, median and p95 as vertical markers at their bin positions.
  auto mark = [&](double value, ImU32 c, const char* label) {
    int b = h.bin_of(value);
    if (b < 0) return;
    double lo = h.edges[static_cast<std::size_t>(b)], hi = h.edges[static_cast<std::size_t>(b) + 1];
    double frac = log ? (std::log10(value) - std::log10(lo)) / std::max(1e-12, std::log10(hi) - std::log10(lo))
                      : (value - lo) / std::max(1e-12, hi - lo);
    float x = plot.x(b + frac);
    dl->AddLine(ImVec2(x, plot.min().y), ImVec2(x, plot.max().y), c, 2.0f);
    const float tw = ImGui::CalcTextSize(label).x;
    dl->AddText(ImVec2(x + 3 + tw > plot.max().x ? x - tw - 3 : x + 3, plot.min().y + 2), c, label);
  };
  mark(op.mean_ns, color::kSelect, "mean");
  mark(static_cast<double>(op.p50_ns), color::kGood, "p50");
  mark(static_cast<double>(op.p95_ns), color::kBad, "p95");
  if (plot.hovered()) {
    int b = static_cast<int>(plot.x_value(plot.mouse().x));
    if (b >= 0 && b < static_cast<int>(h.counts.size()))
      ImGui::SetTooltip("%s .. %s: %lld calls", fmt_ns(h.edges[static_cast<std::size_t>(b)]).c_str(),
                        fmt_ns(h.edges[static_cast<std::size_t>(b) + 1]).c_str(), static_cast<long long>(h.counts[static_cast<std::size_t>(b)]));
  }
  (void)m;
}

// The name filter, the category combo and the layers switch, over the count of ops they leave.
void filter_bar(const RunModel& m, OpsState& st, double steps_total) {
  ImGui::SetNextItemWidth(260);
  if (ImGui::InputTextWithHint("##filter", "filter by name", st.filter, sizeof st.filter)) st.dirty = true;
  ImGui::SameLine();
  // "all categories", then the run file's categories by their one table (store::category_name).
  static const std::array<std::string, store::kCategories + 1> cat_names = [] {
    std::array<std::string, store::kCategories + 1> n{"all categories"};
    for (int c = 0; c < store::kCategories; ++c) n[static_cast<std::size_t>(c + 1)] = std::string(store::category_name(static_cast<store::Category>(c)));
    return n;
  }();
  static const std::array<const char*, store::kCategories + 1> cats = [] {
    std::array<const char*, store::kCategories + 1> p{};
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = cat_names[i].c_str();
    return p;
  }();
  ImGui::SetNextItemWidth(150);
  int ci = st.category + 1;
  if (ImGui::Combo("##cat", &ci, cats.data(), static_cast<int>(cats.size()))) {
    st.category = ci - 1;
    st.dirty = true;
  }
  ImGui::SameLine();
  if (ImGui::Checkbox("layers", &st.layers_only)) st.dirty = true;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Only layer ranges (conv1, layer2.0.conv2, loss, optimizer): with an imported PyTorch trace as the second\n"
                      "run, the vs-second-run columns then compare layer by layer");
  if (st.dirty || st.order.empty()) rebuild_order(m, st);
  ImGui::SameLine(0, 20);
  ImGui::TextColored(to_vec4(color::kDim), "%zu of %zu ops   %% of step: total time over the sum of step times (%s)", st.order.size(),
                     m.ops.by_name.size(), fmt_ns(steps_total).c_str());
}

// The table's columns (three more against a second run) and its header row.
void setup_columns(bool second) {
  ImGui::TableSetupScrollFreeze(0, 1);
  // Each sortable column carries its OpsColumn as ImGui's user id: the sort follows the column, whatever
  // its position.
  const auto column = [](const char* label, ImGuiTableColumnFlags flags, OpsColumn id) {
    ImGui::TableSetupColumn(label, flags, 0.0f, static_cast<ImGuiID>(id));
  };
  const ImGuiTableColumnFlags desc = ImGuiTableColumnFlags_PreferSortDescending;
  column("op", ImGuiTableColumnFlags_WidthStretch, OpsColumn::name);
  column("category", 0, OpsColumn::category);
  column("count", desc, OpsColumn::count);
  column("total", ImGuiTableColumnFlags_DefaultSort | desc, OpsColumn::total);
  column("self", desc, OpsColumn::self);
  column("mean", desc, OpsColumn::mean);
  column("p50", desc, OpsColumn::p50);
  column("p95", desc, OpsColumn::p95);
  column("max", desc, OpsColumn::max);
  column("% of step", desc, OpsColumn::share);
  if (second) {
    ImGui::TableSetupColumn("mean vs second run", ImGuiTableColumnFlags_NoSort);
    ImGui::TableSetupColumn("total vs second run", ImGuiTableColumnFlags_NoSort);
    ImGui::TableSetupColumn("per step vs second", ImGuiTableColumnFlags_NoSort);
  }
  ImGui::TableHeadersRow();
}

// Re-sorts the ops when a header was clicked.
void apply_sort_specs(const RunModel& m, OpsState& st) {
  if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs(); specs && specs->SpecsDirty) {
    if (specs->SpecsCount > 0) {
      st.sort_column = static_cast<OpsColumn>(specs->Specs[0].ColumnUserID);
      st.sort_ascending = specs->Specs[0].SortDirection == ImGuiSortDirection_Ascending;
    }
    specs->SpecsDirty = false;
    rebuild_order(m, st);
  }
}

// On first show, the costliest op that is not a whole step, so its histogram is there; else -1.
int first_pick(const RunModel& m, OpsState& st) {
  if (st.auto_selected) return -1;
  st.auto_selected = true;
  for (int i : st.order)
    if (m.ops.by_name[static_cast<std::size_t>(i)].category != store::Category::step) return i;
  return -1;
}

// Selects op i: its durations for the histogram, and its occurrences outlined in the timeline.
void select_op(App& app, const RunModel& m, OpsState& st, int i) {
  const auto& o = m.ops.by_name[static_cast<std::size_t>(i)];
  st.selected = i;
  auto id = m.find_name(o.name);
  st.durations = id ? m.durations(*id, o.category) : std::vector<std::int64_t>{};
  // Outline its occurrences in the timeline and let find step through them.
  if (id) {
    app.timeline.show_op(*id, static_cast<std::uint8_t>(o.category), o.name);
  }
}

// An op's three cells against the second run: mean and total differences and the per-step ratio.
void delta_cells(const OpDelta& d) {
  auto signed_ns = [](double v) {
    std::string s(v < 0 ? "-" : "+");
    return s.append(fmt_ns(std::abs(v)));
  };
  ImGui::TableNextColumn();
  if (!d.present) {
    ImGui::TextColored(to_vec4(color::kDim), "not in second run");
  } else {
    // Slower than the second run is what one looks for: red; faster: green.
    ImGui::TextColored(to_vec4(d.mean_ns > 0 ? color::kBad : color::kGood), "%s (%s%s)", signed_ns(d.mean_ns).c_str(),
                       d.mean_ratio < 0 ? "-" : "+", fmt_pct(std::abs(d.mean_ratio)).c_str());
  }
  ImGui::TableNextColumn();
  if (d.present) ImGui::TextUnformatted(signed_ns(d.total_ns).c_str());
  ImGui::TableNextColumn();
  if (d.per_step_ratio > 0.0)
    ImGui::TextColored(to_vec4(d.per_step_ratio > 1.1 ? color::kBad : d.per_step_ratio < 0.9 ? color::kGood : color::kDim),
                       "%.2fx", d.per_step_ratio);
}

// One op's row; selecting it (or it being the first pick) selects the op.
void op_row(App& app, const RunModel& m, OpsState& st, int i, int pick, double steps_total, bool second) {
  const auto& o = m.ops.by_name[static_cast<std::size_t>(i)];
  ImGui::TableNextRow();
  ImGui::TableNextColumn();
  ImGui::PushID(i);
  if (ImGui::Selectable(o.name.c_str(), st.selected == i, ImGuiSelectableFlags_SpanAllColumns) || pick == i) select_op(app, m, st, i);
  ImGui::PopID();
  ImGui::TableNextColumn();
  ImGui::TextColored(to_vec4(category_color(static_cast<std::uint8_t>(o.category))), "%s",
                     std::string(store::category_name(o.category)).c_str());
  ImGui::TableNextColumn();
  ImGui::Text("%lld", static_cast<long long>(o.count));
  for (double v : {static_cast<double>(o.total_ns), static_cast<double>(o.self_ns), o.mean_ns, static_cast<double>(o.p50_ns),
                   static_cast<double>(o.p95_ns), static_cast<double>(o.max_ns)}) {
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_ns(v).c_str());
  }
  ImGui::TableNextColumn();
  double share = steps_total > 0 ? static_cast<double>(o.total_ns) / steps_total : 0.0;
  ImVec2 p = ImGui::GetCursorScreenPos();
  float w = ImGui::GetContentRegionAvail().x;
  ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(p.x + w * static_cast<float>(std::min(share, 1.0)), p.y + ImGui::GetTextLineHeight()),
                                            with_alpha(category_color(static_cast<std::uint8_t>(o.category)), 90));
  ImGui::TextUnformatted(fmt_pct(share).c_str());
  if (second) delta_cells(st.deltas[static_cast<std::size_t>(i)]);
}

// The selected op's summary over the histogram of its durations.
void selected_op_detail(App& app, const RunModel& m, OpsState& st) {
  const auto& o = m.ops.by_name[static_cast<std::size_t>(st.selected)];
  ImGui::TextColored(to_vec4(category_color(static_cast<std::uint8_t>(o.category))), "%s", o.name.c_str());
  ImGui::SameLine();
  ImGui::Text(" %lld calls   mean %s   p50 %s   p95 %s   max %s", static_cast<long long>(o.count), fmt_ns(o.mean_ns).c_str(),
              fmt_ns(static_cast<double>(o.p50_ns)).c_str(), fmt_ns(static_cast<double>(o.p95_ns)).c_str(),
              fmt_ns(static_cast<double>(o.max_ns)).c_str());
  ImGui::SameLine(0, 20);
  ImGui::Checkbox("log bins", &st.log_bins);
  ImGui::SameLine();
  if (ImGui::SmallButton("show in timeline")) {
    app.timeline.refind();
    app.show_view(ViewId::timeline);
  }
  duration_histogram(m, st, o, ImVec2(-1, ImGui::GetContentRegionAvail().y));
}

}  // namespace

void draw_ops(App& app) {
  const RunModel& m = *app.model;
  OpsState& st = app.ops;
  const auto& ops = m.ops.by_name;
  const double steps_total = step_time_total(m);
  filter_bar(m, st, steps_total);

  const float detail_h = st.selected >= 0 ? std::max(240.0f, ImGui::GetContentRegionAvail().y * 0.38f) : 0.0f;
  ImGuiTableFlags flags = ImGuiTableFlags_Sortable | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_BordersInnerV |
                          ImGuiTableFlags_Resizable | ImGuiTableFlags_SizingFixedFit;
  // With a second run open (and analysed), two more columns: this run minus the second, per op.
  const RunModel* second = app.second && app.second->ready() ? app.second.get() : nullptr;
  if (second && st.deltas_for != second) {
    st.deltas = op_deltas(ops, second->ops.by_name, static_cast<double>(m.steps().size()),
                          static_cast<double>(second->steps().size()));
    st.deltas_for = second;
  }
  if (ImGui::BeginTable("##ops", second ? 13 : 10, flags, ImVec2(0, ImGui::GetContentRegionAvail().y - detail_h))) {
    setup_columns(second != nullptr);
    apply_sort_specs(m, st);
    const int pick = first_pick(m, st);
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(st.order.size()));
    if (pick >= 0) clipper.ForceDisplayRangeByIndices(static_cast<int>(std::find(st.order.begin(), st.order.end(), pick) - st.order.begin()),
                                                       static_cast<int>(std::find(st.order.begin(), st.order.end(), pick) - st.order.begin()) + 1);
    while (clipper.Step()) {
      for (int r = clipper.DisplayStart; r < clipper.DisplayEnd; ++r)
        op_row(app, m, st, st.order[static_cast<std::size_t>(r)], pick, steps_total, second != nullptr);
    }
    ImGui::EndTable();
  }
  if (st.selected >= 0 && st.selected < static_cast<int>(ops.size())) selected_op_detail(app, m, st);
}

}  // namespace wb::view
