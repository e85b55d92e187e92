// AllReduce tuner: the recorded backward as a strip of per-parameter gradient-ready times with sizes,
// the buckets of a split drawn over it, split points to drag, add (click) and remove (right-click), the
// predicted timeline of the allreduces from the alpha-beta model fitted to the run's spans, the
// suggested splits (DP optimum, MG-WFBP, DDP 25 MB, MindSpore [85,160]), and a re-run of wb-train with
// the chosen split whose measured figures land next to the prediction.
#include <algorithm>
#include <tuple>
#include <cmath>
#include <cstdio>

#include <imgui.h>

#include "allreduce/split_points.hpp"
#include "app/model/tuner_logic.hpp"
#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"

namespace wb::view {

using app_model::add_split;
using app_model::move_split;
using app_model::param_at_x;
using app_model::parse_progress;
using app_model::remove_split;
using app_model::RunModel;
using app_model::split_at_x;
using app_model::split_flags;
using app_model::split_near_x;
using app_model::split_x;

namespace {

ImU32 bucket_color(int b) { return b % 2 ? IM_COL32(215, 195, 70, 255) : IM_COL32(90, 165, 225, 255); }

void model_summary(const analysis::SplitModel& sm) {
  if (sm.calibrated) {
    const double mib = 1024.0 * 1024.0;
    ImGui::Text("calibrated model, %zu ranks simulated:  a 1 MiB bucket %s alone, %s while backward runs (backward x%.2f)",
                sm.ranks.size(), fmt_ns(analysis::allreduce_ns(sm, mib)).c_str(),
                fmt_ns(analysis::allreduce_during_ns(sm, mib)).c_str(), 1.0 + analysis::compute_slowdown(sm, mib));
  } else {
    ImGui::Text("alpha-beta fit of the run's allreduce spans (no calibration in the run; unreliable):  t = %s + bytes x %.3f ns/B",
                fmt_ns(sm.alpha_ns).c_str(), sm.beta_ns_per_byte);
  }
  ImGui::SameLine(0, 30);
  ImGui::TextColored(to_vec4(color::kDim), "%zu parameters, backward compute %s, %d steps averaged", sm.size(), fmt_ns(sm.compute_end_ns).c_str(),
                     sm.steps_used);
}

// Strip 1: parameters in backward order, one column each, height by log10 bytes, coloured by bucket;
// the split points are handles on the column boundaries.
void split_strip(App& app, const analysis::SplitModel& sm, ImVec2 size) {
  TunerState& st = app.tuner;
  const int P = static_cast<int>(sm.size());
  ImVec2 p0 = ImGui::GetCursorScreenPos();
  if (size.x <= 0) size.x = ImGui::GetContentRegionAvail().x;
  ImGui::InvisibleButton("##strip", size, ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  const bool hovered = ImGui::IsItemHovered();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight();
  const float x0 = p0.x + 8, width = size.x - 16, top = p0.y + lh + 4, bottom = p0.y + size.y - lh - 6;
  dl->AddRectFilled(ImVec2(p0.x, p0.y), ImVec2(p0.x + size.x, p0.y + size.y), color::kBg);
  double max_log = 1;
  for (double b : sm.bytes) max_log = std::max(max_log, std::log10(std::max(b, 1.0)));
  st.strip = TunerState::Strip{x0, width, (top + bottom) * 0.5f, P};
  const float colw = width / static_cast<float>(P);
  // st.split passed predict() this frame: ascending within [1, P-1].
  const allreduce::SplitPoints points = allreduce::SplitPoints::from_points(st.split, "tuner split");
  for (int i = 0; i < P; ++i) {
    float xa = static_cast<float>(split_x(i + 1, P, x0, width)), xb = xa + colw;
    double lb = std::log10(std::max(sm.bytes[static_cast<std::size_t>(i)], 1.0));
    float h = static_cast<float>(lb / max_log) * (bottom - top);
    dl->AddRectFilled(ImVec2(xa + (colw > 3 ? 0.5f : 0.0f), bottom - h), ImVec2(xb - (colw > 3 ? 0.5f : 0.0f), bottom),
                      bucket_color(points.bucket_of(i)));
  }
  // Bucket labels at the bottom.
  const std::vector<allreduce::BucketRange> ranges = points.ranges(P, "tuner split");
  for (std::size_t b = 0; b < ranges.size(); ++b) {
    int first = ranges[b].first, last = ranges[b].end - 1;
    double bytes = 0;
    for (int i = first; i <= last; ++i) bytes += sm.bytes[static_cast<std::size_t>(i)];
    float xa = static_cast<float>(split_x(last + 1, P, x0, width)), xb = static_cast<float>(split_x(first, P, x0, width));
    std::string t = analysis::concat("[", std::to_string(first), ",", std::to_string(last + 1), ") ", fmt_bytes(bytes));
    float tw = ImGui::CalcTextSize(t.c_str()).x;
    if (tw < xb - xa) dl->AddText(ImVec2((xa + xb - tw) * 0.5f, bottom + 3), bucket_color(static_cast<int>(b)), t.c_str());
  }
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  auto near = hovered ? split_near_x(st.split, mouse.x, P, x0, width, 6.0) : std::nullopt;
  // Handles.
  for (std::size_t k = 0; k < st.split.size(); ++k) {
    float x = static_cast<float>(split_x(st.split[k], P, x0, width));
    bool hot = (near && *near == k) || (st.dragging && *st.dragging == k);
    dl->AddLine(ImVec2(x, top - 4), ImVec2(x, bottom), hot ? color::kSelect : IM_COL32(240, 240, 240, 255), hot ? 3.0f : 2.0f);
    dl->AddTriangleFilled(ImVec2(x - 5, p0.y + 2), ImVec2(x + 5, p0.y + 2), ImVec2(x, top - 3), hot ? color::kSelect : IM_COL32(240, 240, 240, 255));
    std::string t = std::to_string(st.split[k]);
    dl->AddText(ImVec2(x + 6, p0.y + 1), color::kText, t.c_str());
  }
  dl->AddText(ImVec2(p0.x + size.x - ImGui::CalcTextSize("forward index 0 ->").x - 8, p0.y + 1), color::kDim, "forward index 0 ->");
  // Editing: drag a handle, click to add, right-click to remove.
  if (ImGui::IsItemActivated() && ImGui::IsMouseClicked(ImGuiMouseButton_Left)) st.dragging = near;
  if (st.dragging && ImGui::IsItemActive() && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f)) {
    move_split(st.split, *st.dragging, split_at_x(mouse.x, P, x0, width), P);
    st.compare_label = "edited";
  }
  if (ImGui::IsItemDeactivated()) {
    if (!st.dragging && ImGui::GetIO().MouseDragMaxDistanceSqr[0] < 9.0f && ImGui::IsMouseReleased(ImGuiMouseButton_Left)) {
      if (add_split(st.split, split_at_x(mouse.x, P, x0, width), P)) st.compare_label = "edited";
    }
    st.dragging.reset();
  }
  if (hovered && ImGui::IsMouseClicked(ImGuiMouseButton_Right) && near) {
    remove_split(st.split, *near);
    st.compare_label = "edited";
  }
  if (hovered) {
    int i = param_at_x(mouse.x, P, x0, width);
    if (i >= 0) {
      ImGui::BeginTooltip();
      ImGui::Text("%d  %s", i, sm.names[static_cast<std::size_t>(i)].c_str());
      ImGui::Text("%s, gradient ready %s after backward start", fmt_bytes(sm.bytes[static_cast<std::size_t>(i)]).c_str(),
                  fmt_ns(sm.ready_ns[static_cast<std::size_t>(i)]).c_str());
      ImGui::Text("bucket %d", points.bucket_of(i));
      ImGui::TextColored(to_vec4(color::kDim), "click: add a split here   drag a handle: move   right-click a handle: remove");
      ImGui::EndTooltip();
    }
  }
}

// Strip 2 and 3 on a time axis: gradient-ready ticks (backward order runs left to right in time) and
// the predicted communication stream.
void predicted_timeline(const analysis::SplitModel& sm, const analysis::Prediction& pred, ImVec2 size) {
  double t_end = std::max(pred.comm_end_ns, sm.compute_end_ns) * 1.04;
  Plot plot("##pred", size, 0.0, t_end / 1e6, 0.0, 3.0, "ms after backward start", "", false, [](double v) { return fmt_num(v, 4); },
            [](double) { return std::string(); });
  ImDrawList* dl = plot.draw_list();
  const float lh = ImGui::GetTextLineHeight();
  auto row = [&](int r) { return std::make_pair(plot.y(3.0 - r) + 3, plot.y(2.0 - r) - 3); };
  // Row 0: backward compute with the ready time of every gradient.
  auto [c0, c1] = row(0);
  dl->AddRectFilled(ImVec2(plot.x(0), c0), ImVec2(plot.x(sm.compute_end_ns / 1e6), c1), with_alpha(category_color(1), 120));
  dl->AddText(ImVec2(plot.x(0) + 4, c0), color::kText, "backward compute");
  double max_log = 1;
  for (double b : sm.bytes) max_log = std::max(max_log, std::log10(std::max(b, 1.0)));
  for (std::size_t i = 0; i < sm.size(); ++i) {
    float x = plot.x(sm.ready_ns[i] / 1e6);
    float h = static_cast<float>(std::log10(std::max(sm.bytes[i], 1.0)) / max_log) * (c1 - c0 - lh);
    dl->AddLine(ImVec2(x, c1), ImVec2(x, c1 - h), IM_COL32(250, 250, 250, 200));
  }
  // Row 1: the buckets' ready -> start -> end on one communication stream.
  auto [b0, b1] = row(1);
  dl->AddText(ImVec2(plot.x(0) + 4, b0), color::kDim, "predicted allreduce stream");
  int hovered = -1;
  for (std::size_t k = 0; k < pred.buckets.size(); ++k) {
    const auto& b = pred.buckets[k];
    int bucket = static_cast<int>(pred.buckets.size() - 1 - k);
    float xr = plot.x(b.ready_ns / 1e6), xs = plot.x(b.start_ns / 1e6), xe = plot.x(b.end_ns / 1e6);
    dl->AddLine(ImVec2(xr, (b0 + b1) * 0.5f), ImVec2(xs, (b0 + b1) * 0.5f), color::kDim);
    dl->AddRectFilled(ImVec2(xs, b0 + lh), ImVec2(std::max(xe, xs + 1), b1), bucket_color(bucket));
    dl->AddRect(ImVec2(xs, b0 + lh), ImVec2(std::max(xe, xs + 1), b1), IM_COL32(20, 20, 20, 255));
    if (plot.hovered() && plot.mouse().x >= xr && plot.mouse().x <= xe && plot.mouse().y >= b0 && plot.mouse().y <= b1) hovered = static_cast<int>(k);
  }
  // Row 2: exposed communication past the end of backward.
  auto [e0, e1] = row(2);
  if (pred.exposed_ns > 0) {
    dl->AddRectFilled(ImVec2(plot.x(sm.compute_end_ns / 1e6), e0), ImVec2(plot.x(pred.comm_end_ns / 1e6), e1), with_alpha(color::kBad, 160));
    std::string t = "exposed " + fmt_ns(pred.exposed_ns);
    dl->AddText(ImVec2(plot.x(sm.compute_end_ns / 1e6) + 4, e0), color::kText, t.c_str());
  } else {
    dl->AddText(ImVec2(plot.x(0) + 4, e0), color::kGood, "communication fully hidden behind backward");
  }
  float xc = plot.x(sm.compute_end_ns / 1e6);
  dl->AddLine(ImVec2(xc, plot.min().y), ImVec2(xc, plot.max().y), color::kText, 1.5f);
  if (hovered >= 0) {
    const auto& b = pred.buckets[static_cast<std::size_t>(hovered)];
    ImGui::SetTooltip("params [%d, %d]  %s\nready %s  start %s  end %s", b.first, b.last, fmt_bytes(b.bytes).c_str(), fmt_ns(b.ready_ns).c_str(),
                      fmt_ns(b.start_ns).c_str(), fmt_ns(b.end_ns).c_str());
  }
}

void suggestions_table(App& app, const analysis::SplitModel& sm) {
  const auto& cached = app.tuner.suggestions;
  (void)sm;
  if (ImGui::BeginTable("##sugg", 6, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchProp)) {
    for (const char* h : {"strategy", "split", "buckets", "predicted exposed", "predicted step", ""}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    double best = 1e300;
    for (const auto& s : cached) best = std::min(best, s.prediction.step_ns);
    for (const auto& s : cached) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(s.strategy.c_str());
      ImGui::TableNextColumn();
      std::string sp = analysis::format_split(s.prediction.split);
      ImGui::TextUnformatted(sp.size() > 48 ? (sp.substr(0, 45) + "...").c_str() : sp.c_str());
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", sp.c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%zu", s.prediction.buckets.size());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(s.prediction.exposed_ns).c_str());
      ImGui::TableNextColumn();
      ImGui::TextColored(to_vec4(s.prediction.step_ns <= best * 1.0005 ? color::kGood : color::kText), "%s", fmt_ns(s.prediction.step_ns).c_str());
      ImGui::TableNextColumn();
      ImGui::PushID(s.strategy.c_str());
      if (ImGui::SmallButton("use")) {
        app.tuner.split = s.prediction.split;
        app.tuner.compare_label = s.strategy;
      }
      ImGui::PopID();
    }
    ImGui::EndTable();
  }
}

void rerun_panel(App& app) {
  TunerState& st = app.tuner;
  if (st.job && st.job->running()) {
    std::string line = st.job->last_line();
    float frac = 0.0f;
    if (auto p = parse_progress(line)) frac = static_cast<float>(p->done) / static_cast<float>(p->steps);
    ImGui::ProgressBar(frac, ImVec2(300, 0), "wb-train running");
    ImGui::SameLine();
    ImGui::TextUnformatted(line.size() > 120 ? line.substr(0, 120).c_str() : line.c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("stop")) st.job->terminate();
    return;
  }
  if (ImGui::Button("Run with these splits")) app.start_tuner_run();
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Starts wb-train (next to wb-view, or $WB_TRAIN_BIN) with this run's settings and the split, then opens the new run.");
  if (!st.job_error.empty()) {
    ImGui::SameLine();
    ImGui::TextColored(to_vec4(color::kBad), "%s", st.job_error.c_str());
  }
  if (st.outcome) {
    const auto& o = *st.outcome;
    ImGui::Text("Re-run %s with split %s:", o.run.c_str(), analysis::format_split(o.split).c_str());
    if (ImGui::BeginTable("##outcome", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit)) {
      for (const char* h : {"", "predicted", "measured", "measured - predicted"}) ImGui::TableSetupColumn(h);
      ImGui::TableHeadersRow();
      auto row = [](const char* k, double a, double b) {
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(k);
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(fmt_ns(a).c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(fmt_ns(b).c_str());
        ImGui::TableNextColumn();
        const double d = b - a;
        ImGui::TextColored(to_vec4(color::kDim), "%s%s (%s)", d < 0 ? "-" : "+", fmt_ns(std::abs(d)).c_str(),
                           fmt_pct(a > 0 ? std::abs(d) / a : 0.0).c_str());
      };
      row("step time", o.predicted_step_ns, o.measured_step_ns);
      row("exposed comm", o.predicted_exposed_ns, o.measured_exposed_ns);
      ImGui::EndTable();
    }
  }
}

// "Try the best candidates": wb tune-split on this run with the candidates, rounds and steps set here,
// its progress while it trains, and a stop button.
void try_controls(App& app, const RunModel& m) {
  auto& t = app.tuner;
  if (t.tune_job && t.tune_job->running()) {
    ImGui::TextColored(to_vec4(color::kAccent), "wb tune-split is training the candidates:");
    ImGui::SameLine();
    ImGui::TextUnformatted(t.tune_job->last_line().c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("Stop")) t.tune_job->terminate();
    return;
  }
  const bool windowed = m.windowed() || m.sample;  // trials would read the whole run
  if (ImGui::Button("Try the best candidates") && !windowed) app.start_tune_split();
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Runs wb tune-split %s --candidates %d --rounds %d --steps %d: short trainings of the current split\n"
                      "and the model's best candidates, alternated, with this run's own configuration. Every trial is\n"
                      "recorded in the run file, which then reopens; no split measured slower than the current one is\n"
                      "recommended.",
                      m.title().c_str(), t.try_candidates, t.try_rounds, t.try_steps);
  for (auto [label, value, lo, hi] : {std::tuple{"candidates", &t.try_candidates, 1, 12}, std::tuple{"rounds", &t.try_rounds, 1, 20},
                                      std::tuple{"steps", &t.try_steps, 2, 1000}}) {
    ImGui::SameLine();
    ImGui::SetNextItemWidth(90.0f);
    if (ImGui::InputInt(label, value)) *value = std::clamp(*value, lo, hi);
  }
}

// wb tune-split's trials recorded in the run: per candidate its rounds, median and change against the
// current split, as measured; a click on a row puts its split in the tuner.
void trials_table(App& app, const RunModel& m, const analysis::SplitModel& sm) {
  const std::vector<app_model::TrialSummary> trials = app_model::summarize_trials(m.run.split_trials);
  if (trials.empty()) {
    ImGui::TextColored(to_vec4(color::kDim), "No measured trials yet: wb tune-split %s trains the best candidates in short",
                       m.title().c_str());
    ImGui::TextColored(to_vec4(color::kDim), "alternated runs and records them here.");
    return;
  }
  std::size_t rounds = 0;
  for (const auto& t : trials) rounds = std::max(rounds, t.rounds.size());
  const int columns = static_cast<int>(4 + rounds);
  if (!ImGui::BeginTable("##trials", columns, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit))
    return;
  ImGui::TableSetupColumn("candidate");
  ImGui::TableSetupColumn("predicted");
  for (std::size_t r = 0; r < rounds; ++r) ImGui::TableSetupColumn(("round " + std::to_string(r + 1)).c_str());
  ImGui::TableSetupColumn("median");
  ImGui::TableSetupColumn("vs current");
  ImGui::TableHeadersRow();
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const auto& t = trials[i];
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::PushID(static_cast<int>(i));
    if (ImGui::Selectable(t.candidate.c_str(), false, ImGuiSelectableFlags_SpanAllColumns)) {
      try {
        std::vector<int> split = allreduce::SplitPoints::parse(t.split, "trial split").points();
        analysis::validate_split(split, sm.size());
        app.tuner.split = std::move(split);
        app.tuner.compare_label = "measured: " + t.candidate;
      } catch (const std::exception&) {
        // a split for another model: left out of the tuner
      }
    }
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("--allreduce-split %s", t.split.c_str());
    ImGui::PopID();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(t.predicted_ns >= 0 ? fmt_ns(static_cast<double>(t.predicted_ns)).c_str() : "-");
    for (std::size_t r = 0; r < rounds; ++r) {
      ImGui::TableNextColumn();
      if (r >= t.rounds.size()) continue;
      if (t.rounds[r] < 0) ImGui::TextColored(to_vec4(color::kBad), "failed");
      else ImGui::TextUnformatted(fmt_ns(static_cast<double>(t.rounds[r])).c_str());
    }
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(t.median_ns >= 0 ? fmt_ns(static_cast<double>(t.median_ns)).c_str() : "-");
    ImGui::TableNextColumn();
    if (t.candidate != "current" && t.median_ns >= 0)
      ImGui::TextColored(to_vec4(t.vs_current < 0 ? color::kGood : color::kBad), "%+.1f%%", 100.0 * t.vs_current);
  }
  ImGui::EndTable();
}

}  // namespace

void draw_allreduce(App& app) {
  const RunModel& m = *app.model;
  if (!m.split_model) {
    ImGui::TextColored(to_vec4(color::kWarn), "No split model for this run: %s", m.split_model_error.c_str());
    ImGui::TextColored(to_vec4(color::kDim), "The tuner needs a run with parameters and allreduce spans (wb-train --nproc 2 or more).");
    return;
  }
  const analysis::SplitModel& sm = *m.split_model;
  TunerState& st = app.tuner;
  app.ensure_tuner();
  model_summary(sm);
  analysis::Prediction pred;
  analysis::Prediction current = analysis::predict(sm, sm.current_split);
  try {
    pred = analysis::predict(sm, st.split);
  } catch (const analysis::AnalysisError&) {
    st.split = sm.current_split;
    pred = current;
  }
  // Buttons.
  if (ImGui::Button("Suggest (DP optimum)")) {
    st.split = analysis::optimal_split(sm);
    st.compare_label = "optimal (DP)";
  }
  ImGui::SameLine();
  if (ImGui::Button("Reset to the run's split")) {
    st.split = sm.current_split;
    st.compare_label = "the run's split";
  }
  ImGui::SameLine();
  std::string flags = split_flags(st.split);
  if (ImGui::Button("Copy flags")) ImGui::SetClipboardText(flags.c_str());
  ImGui::SameLine();
  ImGui::TextColored(to_vec4(color::kAccent), "%s", flags.c_str());
  ImGui::SameLine(0, 30);
  ImGui::TextColored(to_vec4(color::kDim), "(%s)", st.compare_label.c_str());

  section("Gradient buckets over the parameters (backward order: the last parameter, ready first, on the left; height: log bytes)");
  split_strip(app, sm, ImVec2(-1, 110));
  section("Predicted allreduce timeline (one communication stream; a bucket starts at max(ready, previous end))");
  predicted_timeline(sm, pred, ImVec2(-1, std::max(170.0f, ImGui::GetContentRegionAvail().y * 0.36f)));

  const float half = ImGui::GetContentRegionAvail().x * 0.5f;
  ImGui::BeginChild("##numbers", ImVec2(half - 8, 0), false);
  section("This split against the run's own");
  if (ImGui::BeginTable("##vs", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchProp)) {
    for (const char* h : {"", "measured (run)", "predicted: run's split", "predicted: this split"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    auto row = [](const char* k, std::string a, std::string b, std::string c) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(k);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(a.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(b.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(c.c_str());
    };
    row("buckets", std::to_string(sm.current_split.size() + 1), std::to_string(current.buckets.size()), std::to_string(pred.buckets.size()));
    row("exposed comm", fmt_ns(sm.measured_exposed_ns), fmt_ns(current.exposed_ns), fmt_ns(pred.exposed_ns));
    row("step time", fmt_ns(sm.measured_step_ns), fmt_ns(current.step_ns), fmt_ns(pred.step_ns));
    ImGui::EndTable();
  }
  double gain = current.step_ns - pred.step_ns;
  if (std::abs(gain) > 0)
    ImGui::TextColored(to_vec4(gain > 0 ? color::kGood : color::kBad), "%s %s per step (%s) against the run's split by the model",
                       gain > 0 ? "saves" : "costs", fmt_ns(std::abs(gain)).c_str(), fmt_pct(std::abs(gain) / std::max(1.0, current.step_ns)).c_str());
  section("Re-run");
  rerun_panel(app);
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("##sugg", ImVec2(0, 0), false);
  section("Suggestions (same model)");
  suggestions_table(app, sm);
  section("Measured trials (wb tune-split; click one to load its split)");
  try_controls(app, m);
  trials_table(app, m, sm);
  ImGui::EndChild();
}

}  // namespace wb::view
