// Precision: the run's dump against a reference (a PyTorch .safetensors, .npz, .npy or npy directory,
// or a second run). Every tensor with its metrics and verdict, the first divergence pinned with its
// local-or-inherited evidence, the error along depth, and for a selected tensor the value and error
// histograms, per-channel errors, an |a-b| heat map of one channel and the worst elements. Comparisons
// saved in the run file (wb compare) reopen from its rows; only the detail plots need the tensors.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <imgui.h>

#include "app/model/precision_model.hpp"
#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"

namespace wb::view {

using app_model::Histogram;
using app_model::PrecisionData;
using app_model::tensor_detail;
using app_model::TensorDetail;

namespace {

ImU32 status_color(compare::RowStatus s) {
  switch (s) {
    case compare::RowStatus::pass: return color::kGood;
    case compare::RowStatus::fail: return color::kBad;
    case compare::RowStatus::shape_mismatch: return color::kBad;
    default: return color::kWarn;
  }
}

double rel_l2_of(const compare::RowResult& r) { return r.metrics ? r.metrics->rel_l2 : std::nan(""); }

void source_bar(App& app) {
  PrecisionState& st = app.precision;
  ImGui::SetNextItemWidth(420);
  ImGui::InputTextWithHint("##ref", "reference: REF.safetensors | .npz | .npy | npy dir | RUN.sqlite", st.reference_path, sizeof st.reference_path);
  ImGui::SameLine();
  if (ImGui::Button("Browse...")) app.browse_reference();
  ImGui::SameLine();
  if (ImGui::Button("Compare") && st.reference_path[0] && app.model) app.open_reference(st.reference_path);
  if (app.model && !app.model->comparisons.empty()) {
    ImGui::SameLine(0, 20);
    ImGui::SetNextItemWidth(360);
    if (ImGui::BeginCombo("##stored", "stored comparisons")) {
      for (const auto& c : app.model->comparisons) {
        std::string label = analysis::concat("#", std::to_string(c.id), " vs ", std::filesystem::path(c.b_path).filename().string(), "  (",
                                             std::to_string(c.passed), " pass, ", std::to_string(c.failed), " fail, ", c.created_utc, ")");
        const bool shown = st.data && st.data->stored_id == c.id;
        // The stored rows show at once; the reference, when still there, only feeds the detail plots.
        if (ImGui::Selectable(label.c_str(), shown)) app.open_stored_comparison(c.id);
      }
      ImGui::EndCombo();
    }
  }
}

// rel-L2 and 1 - cosine of every compared tensor in walk order on a log axis, with the threshold.
void depth_plot(PrecisionState& st, const compare::Comparison& c, ImVec2 size) {
  PlotSeries rel{"rel-L2", {}, {}, color::kAccent}, cos{"1 - cosine", {}, {}, IM_COL32(200, 140, 230, 255)};
  double lo = 1e-9, hi = 1.0;
  double ymin = 1e300, ymax = 0;
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    const auto& r = c.rows[i];
    if (!r.metrics) continue;
    double a = std::max(r.metrics->rel_l2, 1e-12), b = std::max(1.0 - r.metrics->cosine, 1e-12);
    rel.xs.push_back(static_cast<double>(i));
    rel.ys.push_back(a);
    cos.xs.push_back(static_cast<double>(i));
    cos.ys.push_back(b);
    for (double v : {a, b})
      if (std::isfinite(v)) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
  }
  if (ymax > 0) {
    lo = std::pow(10.0, std::floor(std::log10(ymin)));
    hi = std::pow(10.0, std::ceil(std::log10(std::max(ymax, 1e-3))));
  }
  Plot plot("##depth", size, 0.0, std::max<double>(1.0, static_cast<double>(c.rows.size())), lo, hi,
            "tensor in execution order (inputs, forward, loss, backward, update)", "error (log)", true);
  ImDrawList* dl = plot.draw_list();
  // Kind bands along the bottom so depth reads as forward -> backward.
  for (std::size_t i = 0; i < c.rows.size(); ++i) {
    int k = static_cast<int>(c.rows[i].kind);
    dl->AddRectFilled(ImVec2(plot.x(static_cast<double>(i)), plot.max().y - 4), ImVec2(plot.x(static_cast<double>(i + 1)), plot.max().y),
                      series_color(k));
  }
  // The rel-L2 threshold of the selected row's kind (or the first activation's).
  std::optional<double> thr;
  for (std::size_t i = 0; i < c.rows.size() && !thr; ++i)
    if ((st.selected >= 0 ? i == static_cast<std::size_t>(st.selected) : c.rows[i].kind == compare::TensorKind::act))
      thr = c.rows[i].bounds.rel_l2_max;
  if (thr) plot.hline(*thr, color::kWarn, ("rel-L2 bound " + fmt_num(*thr, 3)).c_str());
  plot.line(rel, 1.2f);
  plot.points(cos, 1.8f);
  plot.points(rel, 2.2f);
  dl->PushClipRect(plot.min(), plot.max(), true);
  for (std::size_t i = 0; i < c.rows.size(); ++i)
    if (c.rows[i].failed() && c.rows[i].metrics)
      dl->AddCircle(ImVec2(plot.x(static_cast<double>(i)), plot.y(std::max(c.rows[i].metrics->rel_l2, 1e-12))), 4.5f, color::kBad, 0, 1.5f);
  if (st.selected >= 0) {
    float x = plot.x(st.selected);
    dl->AddLine(ImVec2(x, plot.min().y), ImVec2(x, plot.max().y), color::kSelect, 1.5f);
  }
  dl->PopClipRect();
  std::pair<std::string, ImU32> legend[] = {{"rel-L2", color::kAccent}, {"1 - cosine", IM_COL32(200, 140, 230, 255)}, {"failed", color::kBad}};
  plot.legend(legend);
  if (plot.hovered()) {
    int i = static_cast<int>(std::lround(plot.x_value(plot.mouse().x)));
    if (i >= 0 && i < static_cast<int>(c.rows.size())) {
      const auto& r = c.rows[static_cast<std::size_t>(i)];
      ImGui::SetTooltip("%d %s\nrel-L2 %s   cosine %s", i, r.name.c_str(), fmt_num(rel_l2_of(r), 3).c_str(),
                        r.metrics ? fmt_num(r.metrics->cosine, 8).c_str() : "-");
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) st.selected = i;
    }
  }
}

void first_divergence(PrecisionState& st, const compare::Comparison& c) {
  if (!c.first_divergence) {
    ImGui::TextColored(to_vec4(color::kGood), "No divergence: every compared tensor passes (%lld pass, %lld missing in A, %lld missing in B).",
                       static_cast<long long>(c.passed), static_cast<long long>(c.missing_a), static_cast<long long>(c.missing_b));
    return;
  }
  const auto& d = *c.first_divergence;
  ImGui::PushStyleColor(ImGuiCol_ChildBg, ImVec4(0.35f, 0.12f, 0.12f, 0.45f));
  ImGui::BeginChild("##fd", ImVec2(0, ImGui::GetTextLineHeightWithSpacing() * 5.6f), true);
  ImGui::TextColored(to_vec4(color::kBad), "First divergence: %s", d.name.c_str());
  ImGui::SameLine();
  if (ImGui::SmallButton("select")) st.selected = static_cast<int>(d.row);
  ImGui::Text("%s", d.reason.c_str());
  ImGui::TextColored(to_vec4(d.local ? color::kBad : color::kWarn), "%s", d.optimizer_only ? "optimizer only: activations, loss and gradients pass"
                                                                        : d.local ? "LOCAL: this operation introduces the error"
                                                                                  : "INHERITED: the error grew from its input");
  if (!d.input_name.empty() && d.noise_ratio && d.input_noise_ratio)
    ImGui::Text("input %s at %sx its float32 noise  ->  this at %sx   (jump %sx in noise units)", d.input_name.c_str(),
                fmt_num(*d.input_noise_ratio, 3).c_str(), fmt_num(*d.noise_ratio, 3).c_str(), d.jump ? fmt_num(*d.jump, 3).c_str() : "-");
  else if (!d.input_name.empty())
    ImGui::Text("input %s rel-L2 %s  ->  this %s   (jump %sx)", d.input_name.c_str(), d.input_rel_l2 ? fmt_num(*d.input_rel_l2, 3).c_str() : "-",
                d.rel_l2 ? fmt_num(*d.rel_l2, 3).c_str() : "-", d.jump ? fmt_num(*d.jump, 3).c_str() : "-");
  ImGui::EndChild();
  ImGui::PopStyleColor();
}

// A layer's time per step in this run, in the second run, and their ratio, next to its tensors' verdicts.
void timing_cells(const app_model::LayerTiming* timing, const std::string& key) {
  const analysis::LayerDiffRow* t = timing ? timing->for_tensor(key) : nullptr;
  ImGui::TableNextColumn();
  ImGui::TextUnformatted(t && t->a ? fmt_ns(t->a->ns).c_str() : "");
  ImGui::TableNextColumn();
  ImGui::TextUnformatted(t && t->b ? fmt_ns(t->b->ns).c_str() : "");
  ImGui::TableNextColumn();
  if (t && t->a && t->b && t->b->ns > 0) {
    double ratio = t->ratio();
    ImGui::TextColored(to_vec4(ratio > 1.1 ? color::kBad : ratio < 0.9 ? color::kGood : color::kDim), "%.2fx", ratio);
  }
}

void rows_table(PrecisionState& st, const compare::Comparison& c, float height, const app_model::LayerTiming* timing) {
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(c.rows.size()); ++i) {
    const auto& r = c.rows[static_cast<std::size_t>(i)];
    if (st.kind_filter >= 0 && static_cast<int>(r.kind) != st.kind_filter) continue;
    if (st.failures_only && !r.failed()) continue;
    order.push_back(i);
  }
  if (st.sort_by_error)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      double ea = rel_l2_of(c.rows[static_cast<std::size_t>(a)]), eb = rel_l2_of(c.rows[static_cast<std::size_t>(b)]);
      if (std::isnan(ea)) ea = -1;
      if (std::isnan(eb)) eb = -1;
      return ea > eb;
    });
  if (ImGui::BeginTable("##rows", timing ? 14 : 11, ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_Resizable |
                                        ImGuiTableFlags_SizingFixedFit, ImVec2(0, height))) {
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("#");
    ImGui::TableSetupColumn("tensor", ImGuiTableColumnFlags_WidthStretch);
    for (const char* h : {"kind", "verdict", "rel-L2", "bound", "noise", "x noise", "cosine", "max abs", "shape"}) ImGui::TableSetupColumn(h);
    if (timing)
      for (const char* h : {"time/step", "2nd run", "ratio"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    ImGuiListClipper clip;
    clip.Begin(static_cast<int>(order.size()));
    while (clip.Step())
      for (int k = clip.DisplayStart; k < clip.DisplayEnd; ++k) {
        int i = order[static_cast<std::size_t>(k)];
        const auto& r = c.rows[static_cast<std::size_t>(i)];
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::PushID(i);
        char idx[16];
        std::snprintf(idx, sizeof idx, "%d", i);
        if (ImGui::Selectable(idx, st.selected == i, ImGuiSelectableFlags_SpanAllColumns)) st.selected = i;
        ImGui::PopID();
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.name.c_str());
        ImGui::TableNextColumn();
        ImGui::TextColored(to_vec4(series_color(static_cast<int>(r.kind))), "%s", std::string(compare::kind_name(r.kind)).c_str());
        ImGui::TableNextColumn();
        ImGui::TextColored(to_vec4(status_color(r.status)), "%s", std::string(compare::status_name(r.status)).c_str());
        if (!r.reason.empty() && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", r.reason.c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.metrics ? fmt_num(r.metrics->rel_l2, 3).c_str() : "-");
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.metrics && r.bounds.rel_l2_max ? fmt_num(*r.bounds.rel_l2_max, 3).c_str() : "-");
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.noise_rel_l2 ? fmt_num(*r.noise_rel_l2, 3).c_str() : "-");
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.noise_ratio ? fmt_num(*r.noise_ratio, 3).c_str() : "-");
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.metrics ? fmt_num(r.metrics->cosine, 7).c_str() : "-");
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r.metrics ? fmt_num(r.metrics->max_abs, 3).c_str() : "-");
        ImGui::TableNextColumn();
        std::string shape = store::shape_to_json(r.b_shape.empty() ? r.a_shape : r.b_shape);
        ImGui::TextUnformatted(shape.c_str());
        if (timing) timing_cells(timing, r.name);
      }
    ImGui::EndTable();
  }
}

void histogram_bars(const char* id, const std::vector<std::pair<const Histogram*, ImU32>>& hists, const char* x_label, ImVec2 size,
                    bool log_x_labels) {
  const Histogram& h0 = *hists.front().first;
  std::int64_t top = 1;
  for (const auto& [h, c] : hists) top = std::max(top, h->max_count());
  Plot plot(id, size, 0.0, static_cast<double>(h0.counts.size()), 0.0, static_cast<double>(top) * 1.1, x_label, "count", false,
            [&](double b) {
              int i = static_cast<int>(std::lround(b));
              if (i < 0 || i > static_cast<int>(h0.counts.size()) || std::abs(b - i) > 1e-6) return std::string();
              return log_x_labels ? fmt_num(h0.edges[static_cast<std::size_t>(i)], 2) : fmt_num(h0.edges[static_cast<std::size_t>(i)], 3);
            });
  ImDrawList* dl = plot.draw_list();
  for (const auto& [h, c] : hists)
    for (std::size_t i = 0; i < h->counts.size(); ++i)
      if (h->counts[i] > 0)
        dl->AddRectFilled(ImVec2(plot.x(static_cast<double>(i)), plot.y(static_cast<double>(h->counts[i]))), ImVec2(plot.x(static_cast<double>(i + 1)), plot.y(0)),
                          with_alpha(c, 140));
}

// The selected tensor's name, verdict, thresholds and (when compared) metrics.
void row_summary(const compare::RowResult& r) {
  ImGui::TextColored(to_vec4(status_color(r.status)), "%s", r.name.c_str());
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(color::kDim), "%s  %s", std::string(compare::status_name(r.status)).c_str(),
                     compare::describe(r.thresholds, r.noise_applied, r.noise_flips).c_str());
  if (r.noise_applied)
    ImGui::Text("reference's own float32 noise: rel-L2 %s against float64; this tensor is %sx it (bound rel-L2 %s%s)",
                r.noise_rel_l2 ? fmt_num(*r.noise_rel_l2, 3).c_str() : "-", r.noise_ratio ? fmt_num(*r.noise_ratio, 3).c_str() : "-",
                r.bounds.rel_l2_max ? fmt_num(*r.bounds.rel_l2_max, 3).c_str() : "-",
                r.update_noise_ratio ? (", update " + fmt_num(*r.update_noise_ratio, 3) + "x its noise").c_str() : "");
  if (r.metrics)
    ImGui::Text("rel-L2 %s  cosine %s  max abs %s  max rel %s  allclose %s", fmt_num(r.metrics->rel_l2, 3).c_str(), fmt_num(r.metrics->cosine, 8).c_str(),
                fmt_num(r.metrics->max_abs, 3).c_str(), fmt_num(r.metrics->max_rel, 3).c_str(), fmt_pct(r.metrics->allclose_ratio).c_str());
}

// Computes the selected tensor's detail when it is not the one computed, keeping the error when that
// fails.
void load_detail(PrecisionState& st, const PrecisionData& data) {
  if (st.detail_stale) {
    st.detail.reset();
    st.detail_stale = false;
  }
  if (!st.detail || st.detail->row != static_cast<std::size_t>(st.selected) || st.detail_error.size()) {
    if (!st.detail || st.detail->row != static_cast<std::size_t>(st.selected)) {
      try {
        st.detail = std::make_unique<TensorDetail>(tensor_detail(data, static_cast<std::size_t>(st.selected), st.n_index, st.c_index));
        st.detail_error.clear();
      } catch (const std::exception& e) {
        st.detail.reset();
        st.detail_error = e.what();
      }
    }
  }
}

// Per-channel errors; clicking a channel picks it for the heat map.
void channel_plot(PrecisionState& st, const TensorDetail& d, float h) {
  const auto& ch = d.channels;
  double hi = 0;
  for (double v : ch.max_abs) hi = std::max(hi, v);
  Plot plot("##chan", ImVec2(-1, h * 0.8f), 0.0, static_cast<double>(ch.max_abs.size()), 0.0, hi > 0 ? hi * 1.1 : 1.0,
            ("channel (axis " + std::to_string(ch.axis) + ")").c_str(), "max |a-b|");
  for (std::size_t i = 0; i < ch.max_abs.size(); ++i)
    plot.draw_list()->AddRectFilled(ImVec2(plot.x(static_cast<double>(i)), plot.y(ch.max_abs[i])), ImVec2(std::max(plot.x(static_cast<double>(i + 1)) - 1, plot.x(static_cast<double>(i)) + 1), plot.y(0)),
                                    static_cast<int>(i) == st.c_index ? color::kSelect : color::kWarn);
  if (plot.hovered()) {
    int i = static_cast<int>(plot.x_value(plot.mouse().x));
    if (i >= 0 && i < static_cast<int>(ch.max_abs.size())) {
      ImGui::SetTooltip("channel %d: max abs %s, rel-L2 %s (click: heat map)", i, fmt_num(ch.max_abs[static_cast<std::size_t>(i)], 3).c_str(),
                        fmt_num(ch.rel_l2[static_cast<std::size_t>(i)], 3).c_str());
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) {
        st.c_index = i;
        st.detail_stale = true;
      }
    }
  }
}

// Heat map of |a-b| for one (n, c) slice, with sliders to pick the slice of a 4-d tensor.
void heat_map(PrecisionState& st, const TensorDetail& d, float w, float h) {
  if (d.shape.size() == 4) {
    ImGui::SetNextItemWidth(120);
    if (ImGui::SliderInt("n", &st.n_index, 0, static_cast<int>(d.shape[0] - 1))) st.detail_stale = true;
    ImGui::SameLine();
    ImGui::SetNextItemWidth(160);
    if (ImGui::SliderInt("c", &st.c_index, 0, static_cast<int>(d.shape[1] - 1))) st.detail_stale = true;
  }
  if (st.detail && d.heat.rows > 0 && d.heat.cols > 0) {
    const float side = std::min(h * 1.1f, w * 0.9f);
    const float cell = std::max(1.0f, std::min(side / static_cast<float>(d.heat.rows), side / static_cast<float>(d.heat.cols)));
    ImVec2 p = ImGui::GetCursorScreenPos();
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const int rows = std::min(d.heat.rows, static_cast<int>(side / cell) + 1), cols = std::min(d.heat.cols, static_cast<int>(side / cell) + 1);
    for (int y = 0; y < rows; ++y)
      for (int x = 0; x < cols; ++x) {
        double v = d.heat.values[static_cast<std::size_t>(y) * static_cast<std::size_t>(d.heat.cols) + static_cast<std::size_t>(x)];
        float t = d.heat.max > 0 ? static_cast<float>(std::sqrt(v / d.heat.max)) : 0.0f;
        ImU32 c = IM_COL32(static_cast<int>(20 + 235 * t), static_cast<int>(20 + 140 * t * t), static_cast<int>(60 * (1 - t) + 20), 255);
        dl->AddRectFilled(ImVec2(p.x + x * cell, p.y + y * cell), ImVec2(p.x + (x + 1) * cell, p.y + (y + 1) * cell), c);
      }
    ImGui::Dummy(ImVec2(cols * cell, rows * cell));
    ImGui::TextColored(to_vec4(color::kDim), "|a-b| heat map %dx%d, max %s", d.heat.rows, d.heat.cols, fmt_num(d.heat.max, 3).c_str());
  }
}

// The elements with the largest |a-b|.
void worst_table(const TensorDetail& d) {
  if (ImGui::BeginTable("##worst", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit)) {
    for (const char* hd : {"index", "run", "reference", "|a-b|"}) ImGui::TableSetupColumn(hd);
    ImGui::TableHeadersRow();
    for (const auto& e : d.worst) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      std::string idx = store::shape_to_json(e.coord);
      ImGui::TextUnformatted(idx.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_num(e.a, 7).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_num(e.b, 7).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_num(e.abs_err, 3).c_str());
    }
    ImGui::EndTable();
  }
}

void detail_panes(PrecisionState& st, const PrecisionData& data) {
  const auto& c = data.comparison;
  if (st.selected < 0 || st.selected >= static_cast<int>(c.rows.size())) {
    ImGui::TextColored(to_vec4(color::kDim), "Select a tensor (table or plot) for its histograms, per-channel errors and heat map.");
    return;
  }
  const auto& r = c.rows[static_cast<std::size_t>(st.selected)];
  if (!data.has_tensors) {
    row_summary(r);
    if (!r.reason.empty()) ImGui::TextColored(to_vec4(color::kDim), "%s", r.reason.c_str());
    ImGui::Spacing();
    ImGui::PushTextWrapPos(ImGui::GetContentRegionAvail().x);
    ImGui::TextColored(to_vec4(color::kWarn), "%s", data.tensors_note.c_str());
    ImGui::PopTextWrapPos();
    return;
  }
  load_detail(st, data);
  row_summary(r);
  if (!st.detail) {
    ImGui::TextColored(to_vec4(color::kWarn), "%s", st.detail_error.c_str());
    return;
  }
  TensorDetail& d = *st.detail;
  const float w = (ImGui::GetContentRegionAvail().x - 8) * 0.5f;
  const float h = std::max(150.0f, (ImGui::GetContentRegionAvail().y - ImGui::GetTextLineHeightWithSpacing() * 4) / 3.0f);
  ImGui::BeginGroup();
  histogram_bars("##vals", {{&d.a_hist, color::kAccent}, {&d.b_hist, IM_COL32(235, 140, 60, 255)}}, "value (blue: run, orange: reference)",
                 ImVec2(w, h), false);
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  histogram_bars("##errs", {{&d.err_hist, color::kBad}}, ("|a - b| (log bins; " + std::to_string(d.equal) + " equal)").c_str(), ImVec2(w, h), true);
  ImGui::EndGroup();
  if (!d.channels.rel_l2.empty()) channel_plot(st, d, h);
  // Heat map of |a-b| for one (n, c) slice, next to the worst elements.
  ImGui::BeginGroup();
  heat_map(st, d, w, h);
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  worst_table(d);
  ImGui::EndGroup();
}

}  // namespace

void draw_precision(App& app) {
  PrecisionState& st = app.precision;
  source_bar(app);
  if (st.loader && !st.data) {
    ImGui::TextColored(to_vec4(color::kAccent), "%s ...", st.loader->stage().c_str());
    return;
  }
  if (!st.data) {
    ImGui::Spacing();
    ImGui::TextColored(to_vec4(color::kDim), "Choose a reference to compare this run's dump with, e.g. the PyTorch baseline of the same step:");
    ImGui::TextColored(to_vec4(color::kDim), "  compare/reference/torch_step.py RUN.sqlite --out REF.safetensors");
    if (!st.error.empty()) ImGui::TextColored(to_vec4(color::kBad), "%s", st.error.c_str());
    return;
  }
  const auto& c = st.data->comparison;
  // Open on the first divergence, so its evidence and details are what one sees first.
  if (st.selected < 0 && c.first_divergence) st.selected = static_cast<int>(c.first_divergence->row);
  ImGui::Text("%s  vs  %s   profile %s:  ", std::filesystem::path(st.data->a_path).filename().string().c_str(),
              std::filesystem::path(st.data->b_path).filename().string().c_str(), std::string(compare::profile_name(c.profile)).c_str());
  ImGui::SameLine(0, 0);
  ImGui::TextColored(to_vec4(color::kGood), "%lld pass ", static_cast<long long>(c.passed));
  ImGui::SameLine(0, 0);
  ImGui::TextColored(to_vec4(c.failed ? color::kBad : color::kDim), " %lld fail ", static_cast<long long>(c.failed));
  ImGui::SameLine(0, 0);
  ImGui::TextColored(to_vec4(color::kWarn), " %lld missing", static_cast<long long>(c.missing_a + c.missing_b));
  if (st.data->stored_id) {
    ImGui::SameLine(0, 20);
    ImGui::TextColored(to_vec4(color::kDim), "stored comparison #%lld of %s%s", static_cast<long long>(*st.data->stored_id),
                       st.data->stored_created.c_str(), st.loader ? ("   " + st.loader->stage() + " ...").c_str() : "");
  }
  const float left_w = ImGui::GetContentRegionAvail().x * 0.52f;
  ImGui::BeginChild("##pleft", ImVec2(left_w, 0), false);
  first_divergence(st, c);
  depth_plot(st, c, ImVec2(-1, std::max(180.0f, ImGui::GetContentRegionAvail().y * 0.36f)));
  const char* kinds[] = {"all kinds", "input", "label", "param", "buffer", "act", "loss", "grad", "param_after", "buffer_after", "momentum", "other"};
  int k = st.kind_filter + 1;
  ImGui::SetNextItemWidth(140);
  if (ImGui::Combo("##kind", &k, kinds, IM_ARRAYSIZE(kinds))) st.kind_filter = k - 1;
  ImGui::SameLine();
  ImGui::Checkbox("failures only", &st.failures_only);
  ImGui::SameLine();
  int sort = st.sort_by_error ? 1 : 0;
  ImGui::RadioButton("execution order", &sort, 0);
  ImGui::SameLine();
  ImGui::RadioButton("by error", &sort, 1);
  st.sort_by_error = sort == 1;
  const app_model::LayerTiming* timing = app.layer_timing();
  if (timing) {
    ImGui::TextColored(to_vec4(color::kDim), "time/step: each layer's forward (act.*) or backward (grad.*) time per step here and in %s",
                       app.second->title().c_str());
  } else if (app.second && !app.layer_timing_error().empty()) {
    ImGui::TextColored(to_vec4(color::kWarn), "no layer times: %s", app.layer_timing_error().c_str());
  } else if (!app.second) {
    ImGui::TextColored(to_vec4(color::kDim), "Open a second run (e.g. PyTorch's profile: wb import torch-trace) for each layer's time next to its verdict");
  }
  rows_table(st, c, ImGui::GetContentRegionAvail().y, timing);
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("##pright", ImVec2(0, 0), false);
  detail_panes(st, *st.data);
  ImGui::EndChild();
}

}  // namespace wb::view
