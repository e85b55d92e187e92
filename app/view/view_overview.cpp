// Overview: what ran (config, ranks, devices), how each step's time splits into compute, data wait,
// exposed communication and the rest per rank, the loss and learning-rate curves, throughput, the
// analysis warnings, and a side-by-side of a second run when one is open.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <imgui.h>

#include "app/model/plot_logic.hpp"
#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"

namespace wb::view {

using app_model::Axis;
using app_model::nice_axis;
using app_model::RunModel;

namespace {

std::string config_value(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "-";
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>().empty() ? "-" : v.get<std::string>();
  return v.dump();
}

void run_table(const RunModel& m) {
  const auto& run = m.run;
  // Steps recorded: their count, and their numbers when they do not start at 0 (an imported trace's
  // ProfilerStep#551..552).
  std::set<int> numbers;
  for (const auto& s : m.steps()) numbers.insert(s.step);
  std::string steps = std::to_string(numbers.size());
  if (!numbers.empty() && *numbers.begin() != 0)
    steps += " (" + std::to_string(*numbers.begin()) + ".." + std::to_string(*numbers.rbegin()) + ")";
  if (ImGui::BeginTable("##run", 2, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV)) {
    ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed, 150);
    ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthStretch);
    auto row = [](const char* k, const std::string& v) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextColored(to_vec4(color::kDim), "%s", k);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(v.c_str());
    };
    auto meta = [&](const char* k) {
      auto it = run.meta.find(k);
      return it == run.meta.end() ? std::string("-") : it->second;
    };
    row("file", run.path.string());
    row("created", meta("created_utc"));
    row("complete", run.complete() ? "yes" : "no (the recorder stopped early)");
    row("device", m.device);
    row("world size", std::to_string(run.rank_ids().size()));
    row("steps", steps);
    const char* keys[] = {"data", "batch_size", "image_size", "data_workers", "prefetch", "lr", "lr_schedule",
                          "momentum", "weight_decay", "precision", "threads", "allreduce_split", "bucket_mb", "seed"};
    for (const char* k : keys) row(k, config_value(run.config, k));
    if (config_value(run.config, "data") == "imagefolder") {
      row("data path", config_value(run.config, "data_path"));
      row("transforms", config_value(run.config, "transforms"));
    }
    row("parameters", std::to_string(run.params.size()) + " tensors");
    if (const analysis::ProfilerCost pc = analysis::profiler_cost(run); pc.known) {
      char text[160];
      std::snprintf(text, sizeof text, pc.percent < 0.1 ? "%.2g%% of step time (%.1f ns x %.0f events per step)"
                                                        : "%.2f%% of step time (%.1f ns x %.0f events per step)",
                    pc.percent, pc.ns_per_event, pc.events_per_step);
      row("profiler cost", text);
    }
    for (const auto& e : run.evaluations) {
      char text[160];
      std::snprintf(text, sizeof text, "top-1 %.2f%%, top-5 %.2f%% on %lld images after step %d (%.1f s)", e.top1,
                    e.top5, static_cast<long long>(e.images), e.step, e.seconds);
      row("evaluation", text);
    }
    ImGui::EndTable();
  }
  if (ImGui::TreeNode("All settings (meta.config_json)")) {
    for (auto it = m.run.config.begin(); it != m.run.config.end(); ++it)
      ImGui::Text("%-20s %s", it.key().c_str(), it.value().dump().c_str());
    ImGui::TreePop();
  }
}

void ranks_table(const RunModel& m) {
  if (ImGui::BeginTable("##ranks", 7, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit)) {
    for (const char* h : {"rank", "host", "device", "pid", "clock offset", "drift", "dropped"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (const auto& r : m.run.ranks) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::Text("%d", r.rank);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.host.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.device.c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%lld", static_cast<long long>(r.pid));
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(static_cast<double>(r.clock_offset_ns)).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(static_cast<double>(r.clock_offset_end_ns - r.clock_offset_ns)).c_str());
      ImGui::TableNextColumn();
      if (r.dropped_events > 0) ImGui::TextColored(to_vec4(color::kBad), "%lld", static_cast<long long>(r.dropped_events));
      else ImGui::TextUnformatted("0");
    }
    ImGui::EndTable();
  }
}

void warnings_box(const RunModel& m) {
  if (m.warnings.empty()) {
    ImGui::TextColored(to_vec4(color::kGood), "No warnings: not input-bound, communication hidden, no stragglers.");
    return;
  }
  for (const auto& w : m.warnings) {
    ImU32 c = w.kind == "input-bound" || w.kind == "exposed-comm" || w.kind == "straggler" ? color::kWarn : color::kBad;
    ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(c));
    ImGui::Bullet();
    ImGui::TextUnformatted(w.kind.c_str());
    ImGui::PopStyleColor();
    ImGui::SameLine();
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextUnformatted(w.message.c_str());
    ImGui::PopTextWrapPos();
  }
}

// Pipeline runs: each stage's bubble (waiting for activations or gradients) against GPipe's ideal
// (S-1)/(M+S-1), as a bar per stage with the ideal marked, then the imbalance and what to try.
void pipeline_box(const RunModel& m) {
  const auto& p = *m.pipeline;
  ImGui::Text("%d stages x %d replica(s), %d micro-batches of %d, %s, loss %s", p.plan.stages, p.plan.replicas,
              p.plan.micro_batches, p.plan.micro_batch_size, p.plan.schedule.c_str(), p.plan.loss.c_str());
  if (ImGui::BeginTable("##pipeline", 6, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit)) {
    for (const char* h : {"stage", "units", "compute/step", "wait act", "wait grad", "bubble (tick: ideal)"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (const auto& st : p.stages) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::Text("%d", st.stage);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(st.stage < static_cast<int>(p.plan.stage_names.size())
                                 ? p.plan.stage_names[static_cast<std::size_t>(st.stage)].c_str() : "");
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(st.busy_ns).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(st.wait_act_ns).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(st.wait_grad_ns).c_str());
      ImGui::TableNextColumn();
      // A bar of the bubble with a tick at the ideal.
      const ImVec2 at = ImGui::GetCursorScreenPos();
      const float w = 140.0f, h = ImGui::GetTextLineHeight();
      ImDrawList* dl = ImGui::GetWindowDrawList();
      dl->AddRectFilled(at, ImVec2(at.x + w, at.y + h), IM_COL32(45, 47, 55, 255));
      const ImU32 c = st.bubble > p.ideal + 0.05 ? color::kWarn : color::kGood;
      dl->AddRectFilled(at, ImVec2(at.x + w * static_cast<float>(std::clamp(st.bubble, 0.0, 1.0)), at.y + h), c);
      const float xi = at.x + w * static_cast<float>(p.ideal);
      dl->AddLine(ImVec2(xi, at.y - 1), ImVec2(xi, at.y + h + 1), color::kText, 2.0f);
      ImGui::Dummy(ImVec2(w, h));
      ImGui::SameLine();
      ImGui::TextUnformatted(fmt_pct(st.bubble).c_str());
    }
    ImGui::EndTable();
  }
  ImGui::Text("mean bubble %s, ideal %s; stage imbalance %.2f (slowest stage's compute / mean)", fmt_pct(p.mean_bubble).c_str(),
              fmt_pct(p.ideal).c_str(), p.imbalance);
  if (!p.balanced_flag.empty()) ImGui::Text("balanced split: %s (predicted imbalance %.2f)", p.balanced_flag.c_str(), p.balanced_imbalance);
  if (p.micro_for_10pct) ImGui::Text("bubble under 10%% from --micro-batches %d", *p.micro_for_10pct);
  else ImGui::TextColored(to_vec4(color::kWarn), "bubble under 10%%: out of reach with this split (imbalance)");
}

struct Means {
  double step = 0, compute = 0, wait = 0, comm = 0, other = 0, images_per_s = 0;
  int n = 0;
};
Means means(const RunModel& m) {
  Means r;
  double images = 0, time = 0;
  for (const auto& b : m.breakdown) {
    r.step += static_cast<double>(b.total_ns);
    r.compute += static_cast<double>(b.compute_ns);
    r.wait += static_cast<double>(b.data_wait_ns);
    r.comm += static_cast<double>(b.comm_exposed_ns);
    r.other += static_cast<double>(b.other_ns);
    ++r.n;
  }
  for (const auto& s : m.steps()) {
    images += static_cast<double>(s.images);
    time += static_cast<double>(s.end_ns - s.start_ns);
  }
  if (r.n > 0) {
    r.step /= r.n;
    r.compute /= r.n;
    r.wait /= r.n;
    r.comm /= r.n;
    r.other /= r.n;
  }
  int ranks = std::max<int>(1, static_cast<int>(m.run.rank_ids().size()));
  if (time > 0) r.images_per_s = images / (time / ranks / 1e9);
  return r;
}

void compare_table(const RunModel& a, const RunModel& b) {
  Means ma = means(a), mb = means(b);
  if (ImGui::BeginTable("##cmp", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit)) {
    ImGui::TableSetupColumn("mean per step");
    ImGui::TableSetupColumn(a.title().c_str());
    ImGui::TableSetupColumn(b.title().c_str());
    ImGui::TableSetupColumn("B / A");
    ImGui::TableHeadersRow();
    auto row = [](const char* k, double va, double vb, bool time) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(k);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(time ? fmt_ns(va).c_str() : fmt_num(va, 4).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(time ? fmt_ns(vb).c_str() : fmt_num(vb, 4).c_str());
      ImGui::TableNextColumn();
      if (va > 0) ImGui::Text("%.3fx", vb / va);
    };
    row("step time", ma.step, mb.step, true);
    row("compute", ma.compute, mb.compute, true);
    row("data wait", ma.wait, mb.wait, true);
    row("exposed comm", ma.comm, mb.comm, true);
    row("other", ma.other, mb.other, true);
    row("images/s", ma.images_per_s, mb.images_per_s, false);
    ImGui::EndTable();
  }
}

// Per step, one stacked bar per rank.
void breakdown_bars(const RunModel& m, float height) {
  const auto& bd = m.breakdown;
  int steps = 0;
  double hi = 0;
  std::vector<int> ranks = m.run.rank_ids();
  for (const auto& b : bd) {
    steps = std::max(steps, b.step + 1);
    hi = std::max(hi, static_cast<double>(b.total_ns));
  }
  if (bd.empty()) {
    ImGui::TextColored(to_vec4(color::kDim), "No step records in this run.");
    return;
  }
  Axis ax = nice_axis(0.0, hi * 1.05 / 1e6);
  Plot plot("##breakdown", ImVec2(-1, height), -0.5, steps - 0.5, 0.0, ax.hi, "step (one bar per rank)", "step time (ms)",
            false, [](double v) { return std::abs(v - std::round(v)) < 1e-6 ? fmt_num(std::round(v) + 0.0, 6) : std::string(); },
            [](double v) { return fmt_num(v, 6); });
  const ImU32 cols[4] = {category_color(0), category_color(4), category_color(6), IM_COL32(110, 115, 130, 255)};
  const char* names[4] = {"compute", "data wait", "exposed comm", "other"};
  const int nr = std::max<int>(1, static_cast<int>(ranks.size()));
  const double slot = 0.8 / nr;
  ImDrawList* dl = plot.draw_list();
  std::optional<std::size_t> hover;
  for (std::size_t i = 0; i < bd.size(); ++i) {
    const auto& b = bd[i];
    int ri = static_cast<int>(std::find(ranks.begin(), ranks.end(), b.rank) - ranks.begin());
    double xl = b.step - 0.4 + ri * slot, xr = xl + slot * 0.9;
    double parts[4] = {static_cast<double>(b.compute_ns), static_cast<double>(b.data_wait_ns),
                       static_cast<double>(b.comm_exposed_ns), static_cast<double>(b.other_ns)};
    double acc = 0;
    for (int k = 0; k < 4; ++k) {
      float y0 = plot.y(acc / 1e6), y1 = plot.y((acc + parts[k]) / 1e6);
      dl->AddRectFilled(ImVec2(plot.x(xl), y1), ImVec2(plot.x(xr), y0), cols[k]);
      acc += parts[k];
    }
    ImVec2 mouse = plot.mouse();
    if (plot.hovered() && mouse.x >= plot.x(xl) && mouse.x <= plot.x(xr)) hover = i;
  }
  std::vector<std::pair<std::string, ImU32>> legend;
  for (int k = 0; k < 4; ++k) legend.emplace_back(names[k], cols[k]);
  plot.legend(legend);
  if (hover) {
    const auto& b = bd[*hover];
    ImGui::BeginTooltip();
    ImGui::Text("rank %d  step %d:  %s", b.rank, b.step, fmt_ns(static_cast<double>(b.total_ns)).c_str());
    double t = std::max<double>(1.0, static_cast<double>(b.total_ns));
    ImGui::Text("compute       %s  (%s)", fmt_ns(static_cast<double>(b.compute_ns)).c_str(), fmt_pct(b.compute_ns / t).c_str());
    ImGui::Text("data wait     %s  (%s)", fmt_ns(static_cast<double>(b.data_wait_ns)).c_str(), fmt_pct(b.data_wait_ns / t).c_str());
    ImGui::Text("exposed comm  %s  (%s)", fmt_ns(static_cast<double>(b.comm_exposed_ns)).c_str(), fmt_pct(b.comm_exposed_ns / t).c_str());
    ImGui::Text("other         %s  (%s)", fmt_ns(static_cast<double>(b.other_ns)).c_str(), fmt_pct(b.other_ns / t).c_str());
    ImGui::EndTooltip();
  }
}

// The TensorBoard plugin's Overview (tb_overview.hpp): one stacked bar per step and rank in its eight
// classes, the GPU summary and the recommendations.
void tb_overview_box(const analysis::Overview& o, float height) {
  static const ImU32 cols[analysis::kStepClasses] = {
      IM_COL32(84, 160, 238, 255),  IM_COL32(236, 151, 70, 255), IM_COL32(236, 200, 70, 255),
      IM_COL32(210, 86, 86, 255),   IM_COL32(160, 110, 220, 255), IM_COL32(80, 190, 120, 255),
      IM_COL32(150, 190, 210, 255), IM_COL32(110, 115, 130, 255)};
  std::vector<std::pair<int, const analysis::OverviewStep*>> bars;  // (rank index, step)
  double hi = 0;
  for (std::size_t r = 0; r < o.ranks.size(); ++r)
    for (const auto& s : o.ranks[r].steps) {
      bars.emplace_back(static_cast<int>(r), &s);
      hi = std::max(hi, static_cast<double>(s.end_ns - s.start_ns));
    }
  if (bars.empty()) {
    ImGui::TextColored(to_vec4(color::kDim), "No steps with device work in this run.");
    return;
  }
  const std::size_t per_rank = o.ranks.front().steps.size();
  const int nr = std::max<int>(1, static_cast<int>(o.ranks.size()));
  Axis ax = nice_axis(0.0, hi * 1.05 / 1e6);
  const auto& first = o.ranks.front().steps;
  Plot plot("##tb", ImVec2(-1, height), -0.5, static_cast<double>(std::max<std::size_t>(per_rank, 1)) - 0.5, 0.0, ax.hi,
            "step (one bar per rank)", "step time (ms)", false,
            [&first](double v) {
              const double i = std::round(v);
              return std::abs(v - i) < 1e-6 && i >= 0 && i < static_cast<double>(first.size())
                         ? std::to_string(first[static_cast<std::size_t>(i)].step)
                         : std::string();
            },
            [](double v) { return fmt_num(v, 6); });
  ImDrawList* dl = plot.draw_list();
  const double slot = 0.8 / nr;
  std::optional<std::size_t> hover;
  std::map<int, std::size_t> index_in_rank;
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const auto& [ri, s] = bars[i];
    const double x = static_cast<double>(index_in_rank[ri]++);
    const double xl = x - 0.4 + ri * slot, xr = xl + slot * 0.9;
    double acc = 0;
    for (int c = 0; c < analysis::kStepClasses; ++c) {
      const double part = static_cast<double>(s->class_ns[static_cast<std::size_t>(c)]);
      dl->AddRectFilled(ImVec2(plot.x(xl), plot.y((acc + part) / 1e6)), ImVec2(plot.x(xr), plot.y(acc / 1e6)), cols[c]);
      acc += part;
    }
    const ImVec2 mouse = plot.mouse();
    if (plot.hovered() && mouse.x >= plot.x(xl) && mouse.x <= plot.x(xr)) hover = i;
  }
  std::vector<std::pair<std::string, ImU32>> legend;
  for (int c = 0; c < analysis::kStepClasses; ++c)
    legend.emplace_back(analysis::step_class_label(static_cast<analysis::StepClass>(c)), cols[c]);
  plot.legend(legend);
  if (hover) {
    const auto& [ri, s] = bars[*hover];
    const double t = std::max(1.0, static_cast<double>(s->end_ns - s->start_ns));
    ImGui::BeginTooltip();
    ImGui::Text("rank %d  step %d:  %s", o.ranks[static_cast<std::size_t>(ri)].rank, s->step, fmt_ns(t).c_str());
    for (int c = 0; c < analysis::kStepClasses; ++c) {
      const double v = static_cast<double>(s->class_ns[static_cast<std::size_t>(c)]);
      ImGui::Text("%-14s %10s  (%s)", analysis::step_class_label(static_cast<analysis::StepClass>(c)), fmt_ns(v).c_str(),
                  fmt_pct(v / t).c_str());
    }
    ImGui::EndTooltip();
  }
  for (const auto& r : o.ranks) {
    if (!r.gpu) continue;
    const auto& g = *r.gpu;
    auto frac = [](const std::optional<double>& v) { return v ? fmt_pct(*v) : std::string("-"); };
    ImGui::Text("rank %d, GPU %d: utilization %s, est. SM efficiency %s, est. achieved occupancy %s, Tensor Cores %s", r.rank,
                g.device, fmt_pct(g.utilization).c_str(), frac(g.sm_efficiency).c_str(), frac(g.achieved_occupancy).c_str(),
                frac(g.tensor_core_share).c_str());
  }
  for (const auto& rec : o.recommendations) ImGui::TextWrapped("%s", rec.text.c_str());
}

// HTA's analyses per rank (hta.hpp): idle, compute and non-compute time, communication overlapped,
// the causes of idle time, launch delays and queue lengths.
void hta_table(const std::vector<analysis::HtaRank>& ranks) {
  if (!ImGui::BeginTable("##hta", 10, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit))
    return;
  for (const char* h : {"rank", "span", "idle", "compute", "non-compute", "comm overlapped", "idle: host wait", "kernel wait",
                        "launch delay", "queue max"})
    ImGui::TableSetupColumn(h);
  ImGui::TableHeadersRow();
  for (const auto& h : ranks) {
    const double span = std::max(1.0, static_cast<double>(h.span_ns));
    const double idle = std::max(1.0, static_cast<double>(h.host_wait_ns + h.kernel_wait_ns + h.other_wait_ns));
    std::int64_t queue = 0;
    for (const auto& q : h.queues) queue = std::max(queue, q.max);
    ImGui::TableNextRow();
    const std::string cells[] = {std::to_string(h.rank), fmt_ns(static_cast<double>(h.span_ns)),
                                 fmt_pct(static_cast<double>(h.idle_ns) / span), fmt_pct(static_cast<double>(h.compute_ns) / span),
                                 fmt_pct(static_cast<double>(h.non_compute_ns) / span),
                                 h.overlap_ratio ? fmt_pct(*h.overlap_ratio) : "-",
                                 fmt_pct(static_cast<double>(h.host_wait_ns) / idle), fmt_pct(static_cast<double>(h.kernel_wait_ns) / idle),
                                 h.launch_delay_mean_ns ? fmt_ns(*h.launch_delay_mean_ns) : "-",
                                 h.queues.empty() ? "-" : std::to_string(queue)};
    for (const auto& c : cells) {
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(c.c_str());
    }
  }
  ImGui::EndTable();
}

// Per step (columns) and rank (rows): how long the rank waited at the allreduce for the step's last
// rank, from dark (no wait) to red (the longest wait of the run); the step's last rank is outlined.
// Steps are binned when there are more than pixels (a bin shows its largest wait).
void wait_heat_map(const RunModel& m, float height) {
  const auto& a = m.straggle;
  if (a.steps.empty()) return;
  const int nr = static_cast<int>(a.ranks.size());
  const float label_w = ImGui::CalcTextSize("rank 00").x + 6;
  const float width = std::max(120.0f, ImGui::GetContentRegionAvail().x - label_w);
  const float row_h = std::clamp((height - ImGui::GetTextLineHeight()) / static_cast<float>(nr), 6.0f, 22.0f);
  const int n = static_cast<int>(a.steps.size());
  const int cols = std::max(1, std::min(n, static_cast<int>(width / 3.0f)));
  const float col_w = width / static_cast<float>(cols);
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("##waitmap", ImVec2(label_w + width, row_h * static_cast<float>(nr)));
  const bool hovered = ImGui::IsItemHovered();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const double hi = std::max<double>(1.0, static_cast<double>(a.max_wait_ns));
  auto heat = [](double f) {
    f = std::clamp(f, 0.0, 1.0);
    auto mix = [f](int lo, int hi_) { return static_cast<int>(lo + (hi_ - lo) * f); };
    return IM_COL32(mix(38, 225), mix(42, 80), mix(52, 75), 255);
  };
  for (int r = 0; r < nr; ++r) {
    const float y0 = origin.y + row_h * static_cast<float>(r);
    dl->AddText(ImVec2(origin.x, y0 + (row_h - ImGui::GetTextLineHeight()) * 0.5f), color::kDim,
                ("rank " + std::to_string(a.ranks[static_cast<std::size_t>(r)])).c_str());
    for (int c = 0; c < cols; ++c) {
      const int s0 = static_cast<int>(static_cast<std::int64_t>(c) * n / cols);
      const int s1 = std::max(s0 + 1, static_cast<int>(static_cast<std::int64_t>(c + 1) * n / cols));
      std::int64_t wait = 0;
      bool last = false;
      for (int k = s0; k < s1; ++k) {
        const auto& st = a.steps[static_cast<std::size_t>(k)];
        wait = std::max(wait, st.wait_ns[static_cast<std::size_t>(r)]);
        last = last || st.last_rank == a.ranks[static_cast<std::size_t>(r)];
      }
      const ImVec2 p0(origin.x + label_w + col_w * static_cast<float>(c), y0 + 1);
      const ImVec2 p1(p0.x + std::max(1.0f, col_w - 1), y0 + row_h - 1);
      dl->AddRectFilled(p0, p1, heat(static_cast<double>(wait) / hi));
      if (last && col_w >= 4) dl->AddRect(p0, p1, color::kWarn);
    }
  }
  if (hovered) {
    const ImVec2 mouse = ImGui::GetMousePos();
    const int c = static_cast<int>((mouse.x - origin.x - label_w) / col_w);
    const int r = static_cast<int>((mouse.y - origin.y) / row_h);
    if (c >= 0 && c < cols && r >= 0 && r < nr) {
      const int k = static_cast<int>(static_cast<std::int64_t>(c) * n / cols);
      const auto& st = a.steps[static_cast<std::size_t>(k)];
      ImGui::BeginTooltip();
      ImGui::Text("step %d, rank %d: waited %s for rank %d", st.step, a.ranks[static_cast<std::size_t>(r)],
                  fmt_ns(static_cast<double>(st.wait_ns[static_cast<std::size_t>(r)])).c_str(), st.last_rank);
      ImGui::Text("rank %d was %s late: %s", st.last_rank, fmt_ns(static_cast<double>(st.lag_ns)).c_str(),
                  analysis::lag_cause_name(st.cause));
      for (const auto& op : st.top_ops) ImGui::Text("  %s +%s", op.op.c_str(), fmt_ns(static_cast<double>(op.extra_ns)).c_str());
      ImGui::EndTooltip();
    }
  }
  for (const auto& p : a.persistent) {
    ImGui::TextColored(to_vec4(color::kWarn), "rank %d is last in %.0f%% of steps (%s late, cause: %s%s%s)", p.rank,
                       100.0 * p.fraction, fmt_ns(p.mean_lag_ns).c_str(), analysis::lag_cause_name(p.cause),
                       p.top_ops.empty() ? "" : ", ", p.top_ops.empty() ? "" : p.top_ops[0].op.c_str());
  }
}

// Triggered capture (wb-train --capture): each window of steps whose events the run kept, and what
// triggered it; clicking one shows its steps in the Timeline.
void capture_box(App& app, const RunModel& m) {
  const auto& windows = m.run.capture_windows;
  if (windows.empty()) {
    ImGui::TextColored(to_vec4(color::kDim), "No window was triggered: the file holds the step table only.");
    return;
  }
  if (ImGui::BeginTable("##capture", 4, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit)) {
    for (const char* h : {"steps", "rank", "trigger", "detail"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (std::size_t i = 0; i < windows.size(); ++i) {
      const auto& w = windows[i];
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::PushID(static_cast<int>(i));
      const std::string label = std::to_string(w.first_step) + "-" + std::to_string(w.last_step);
      const bool clicked = ImGui::Selectable(label.c_str(), false, ImGuiSelectableFlags_SpanAllColumns);
      const ImVec2 at = ImGui::GetItemRectMin(), size = ImGui::GetItemRectSize();
      app.capture_rows.emplace_back(at.x + size.x * 0.5f, at.y + size.y * 0.5f);
      if (clicked) {
        if (auto span = app_model::window_span(m.steps(), w)) {
          app.timeline.request_zoom(*span);
          app.show_view(ViewId::timeline);
        }
      }
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("show steps %s in the Timeline", label.c_str());
      ImGui::PopID();
      ImGui::TableNextColumn();
      ImGui::Text("%d", w.rank);
      ImGui::TableNextColumn();
      ImGui::Text("%s at step %d", w.trigger.c_str(), w.trigger_step);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(w.detail.c_str());
    }
    ImGui::EndTable();
  }
}

}  // namespace

void draw_overview(App& app) {
  const RunModel& m = *app.model;
  const float w = ImGui::GetContentRegionAvail().x;
  const float h = ImGui::GetContentRegionAvail().y;
  ImGui::BeginChild("##left", ImVec2(w * 0.38f, 0), false);
  section("Run");
  run_table(m);
  section("Ranks");
  ranks_table(m);
  section("Warnings");
  warnings_box(m);
  app.capture_rows.clear();
  if (auto it = m.run.meta.find("capture"); it != m.run.meta.end()) {
    section(("Captured windows (--capture " + it->second + "; click: show in the Timeline)").c_str());
    capture_box(app, m);
  }
  if (!m.straggle.steps.empty()) {
    section("Waits for the slowest rank (steps across, ranks down; outlined: the step's last rank)");
    wait_heat_map(m, 140.0f);
  }
  if (m.pipeline) {
    section("Pipeline bubble");
    pipeline_box(m);
  }
  if (app.second) {
    section("Compared with a second run");
    compare_table(m, *app.second);
  }
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("##right", ImVec2(0, 0), false);
  if (m.tb && !m.tb->ranks.empty()) {
    section("Step time per rank, TensorBoard's classes (a moment goes to the first class active; steps end with their last kernel)");
    tb_overview_box(*m.tb, std::max(220.0f, h * 0.42f));
  } else {
    section("Step time per rank: compute / data wait / exposed communication / other");
    breakdown_bars(m, std::max(220.0f, h * 0.42f));
  }
  if (!m.hta.empty()) {
    section("GPU time, HTA's rules (per rank, from its first device row to its last)");
    hta_table(m.hta);
  }
  if (auto f = m.run.meta.find("framework"); f != m.run.meta.end() && f->second == "pytorch") {
    ImGui::EndChild();  // an imported trace has no loss, learning rate or image counts
    return;
  }
  // Loss and learning rate per rank, images per second over all ranks.
  std::map<int, PlotSeries> loss, lr;
  std::map<int, std::pair<double, double>> thr;  // step -> (images, max step seconds)
  for (const auto& s : m.steps()) {
    auto& l = loss[s.rank];
    l.name = "rank " + std::to_string(s.rank);
    l.color = series_color(s.rank);
    l.xs.push_back(s.step);
    l.ys.push_back(s.loss);
    if (s.rank == m.steps().front().rank) {
      auto& r = lr[0];
      r.name = "lr";
      r.color = series_color(4);
      r.xs.push_back(s.step);
      r.ys.push_back(s.lr);
    }
    auto& t = thr[s.step];
    t.first += static_cast<double>(s.images);
    t.second = std::max(t.second, static_cast<double>(s.end_ns - s.start_ns) / 1e9);
  }
  std::vector<PlotSeries> loss_v, lr_v;
  for (auto& [k, v] : loss) loss_v.push_back(v);
  for (auto& [k, v] : lr) lr_v.push_back(v);
  PlotSeries tp{"images/s", {}, {}, series_color(2)};
  for (const auto& [step, v] : thr) {
    tp.xs.push_back(step);
    tp.ys.push_back(v.second > 0 ? v.first / v.second : 0.0);
  }
  const float pw = (ImGui::GetContentRegionAvail().x - 16) / 3.0f;
  const float ph = std::max(180.0f, ImGui::GetContentRegionAvail().y - ImGui::GetTextLineHeightWithSpacing() * 2.5f);
  ImGui::BeginGroup();
  section("Loss");
  line_plot("##loss", ImVec2(pw, ph), loss_v, "step", "loss");
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  section("Learning rate");
  line_plot("##lr", ImVec2(pw, ph), lr_v, "step", "lr");
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  section("Throughput (all ranks)");
  line_plot("##thr", ImVec2(pw, ph), std::span<const PlotSeries>(&tp, 1), "step", "images/s");
  ImGui::EndGroup();
  ImGui::EndChild();
}

}  // namespace wb::view
