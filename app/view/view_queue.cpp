// Data queue: is the input pipeline starving the step? Per rank and queue the depth over time with its
// capacity and the spells it stood empty, the consumer's wait per step next to the step time, the
// input-bound percentage and empty-queue ratio against their thresholds, what each transform costs a
// worker, and the advice line (how many workers would keep the queue full).
#include <algorithm>
#include <cmath>
#include <map>

#include <imgui.h>

#include "app/model/plot_logic.hpp"
#include "app/model/timeline_logic.hpp"
#include "app/view/app.hpp"
#include "app/view/draw_util.hpp"

namespace wb::view {

using app_model::Axis;
using app_model::counter_columns;
using app_model::nice_axis;
using app_model::RunModel;
using app_model::TimeView;

namespace {

int batch_size(const RunModel& m) {
  const auto& c = m.run.config;
  if (c.contains("batch_size") && c["batch_size"].is_number_integer()) return c["batch_size"].get<int>();
  for (const auto& s : m.steps())
    if (s.images > 0) return static_cast<int>(s.images);
  return 1;
}

// A gauge: value against two thresholds, green / amber / red.
void gauge(const char* label, double percent, double warn, double bad, const char* note) {
  ImU32 c = percent > bad ? color::kBad : percent > warn ? color::kWarn : color::kGood;
  ImGui::BeginGroup();
  ImGui::TextColored(to_vec4(color::kDim), "%s", label);
  ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(c));
  ImGui::SetWindowFontScale(1.5f);
  ImGui::Text("%.1f %%", percent);
  ImGui::SetWindowFontScale(1.0f);
  ImGui::PopStyleColor();
  ImVec2 p = ImGui::GetCursorScreenPos();
  const float w = 240, h = 8;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->AddRectFilled(p, ImVec2(p.x + w, p.y + h), IM_COL32(50, 52, 60, 255), 3);
  dl->AddRectFilled(p, ImVec2(p.x + w * static_cast<float>(std::clamp(percent, 0.0, 100.0) / 100.0), p.y + h), c, 3);
  for (double t : {warn, bad}) {
    float x = p.x + w * static_cast<float>(t / 100.0);
    dl->AddLine(ImVec2(x, p.y - 3), ImVec2(x, p.y + h + 3), color::kText, 1.5f);
  }
  ImGui::Dummy(ImVec2(w, h + 4));
  ImGui::TextColored(to_vec4(color::kDim), "%s", note);
  ImGui::EndGroup();
}

void depth_plot(const RunModel& m, const analysis::QueueStats& q, ImVec2 size) {
  auto it = m.counters().find(q.track);
  if (it == m.counters().end() || it->second.empty()) return;
  const auto& samples = it->second;
  double hi = std::max<double>(m.queue_capacity, 1.0);
  for (const auto& s : samples) hi = std::max(hi, s.value);
  const double t0 = static_cast<double>(m.t_min_ns), t1 = static_cast<double>(m.t_max_ns);
  Plot plot(("##depth" + std::to_string(q.track)).c_str(), size, 0.0, (t1 - t0) / 1e9, 0.0, hi * 1.15, "time since start (s)",
            "depth (batches)", false, [](double v) { return fmt_num(v, 6); }, [](double v) { return fmt_num(v, 3); });
  ImDrawList* dl = plot.draw_list();
  // Steps of this rank as alternating bands, so starvation lines up with steps.
  for (const auto& s : m.steps()) {
    if (s.rank != q.rank || s.step % 2) continue;
    dl->AddRectFilled(ImVec2(plot.x((static_cast<double>(s.start_ns) - t0) / 1e9), plot.min().y),
                      ImVec2(plot.x((static_cast<double>(s.end_ns) - t0) / 1e9), plot.max().y), IM_COL32(255, 255, 255, 10));
  }
  for (const auto& sp : analysis::empty_spells(samples)) {
    float a = plot.x((static_cast<double>(sp.start_ns) - t0) / 1e9), b = plot.x((static_cast<double>(sp.end_ns) - t0) / 1e9);
    dl->AddRectFilled(ImVec2(a, plot.min().y), ImVec2(std::max(b, a + 1), plot.max().y), IM_COL32(210, 60, 55, 55));
    dl->AddRectFilled(ImVec2(a, plot.max().y - 4), ImVec2(std::max(b, a + 1), plot.max().y), color::kBad);
  }
  TimeView view{t0, t1, static_cast<double>(plot.max().x - plot.min().x)};
  int cols = std::max(1, static_cast<int>(view.width_px));
  auto ext = counter_columns(samples, view, cols);
  for (int c = 0; c < cols; ++c) {
    const auto& e = ext[static_cast<std::size_t>(c)];
    if (std::isnan(e.hi)) continue;
    float x = plot.min().x + static_cast<float>(c);
    dl->AddRectFilled(ImVec2(x, plot.y(e.lo)), ImVec2(x + 1, plot.y(0)), with_alpha(category_color(4), 150));
    dl->AddRectFilled(ImVec2(x, plot.y(e.hi)), ImVec2(x + 1, plot.y(e.lo) + 1), category_color(4));
  }
  if (m.queue_capacity > 0) plot.hline(m.queue_capacity, color::kWarn, "capacity (--prefetch)");
  std::pair<std::string, ImU32> legend[] = {{"depth", category_color(4)}, {"empty: consumer starved", color::kBad}};
  plot.legend(legend);
  if (plot.hovered()) {
    double t = plot.x_value(plot.mouse().x) * 1e9 + t0;
    auto s = std::partition_point(samples.begin(), samples.end(), [&](const store::CounterRow& r) { return static_cast<double>(r.t_ns) <= t; });
    if (s != samples.begin()) ImGui::SetTooltip("t = %s   depth %g", fmt_ns(t - t0).c_str(), std::prev(s)->value);
  }
}

void wait_vs_step(const RunModel& m, ImVec2 size) {
  // Per step, per rank: the step time and, inside it, the time the consumer waited for a batch.
  std::vector<int> ranks = m.run.rank_ids();
  int steps = 0;
  double hi = 0;
  for (const auto& b : m.breakdown) {
    steps = std::max(steps, b.step + 1);
    hi = std::max(hi, static_cast<double>(b.total_ns) / 1e6);
  }
  if (steps == 0) return;
  Axis ax = nice_axis(0, hi * 1.1);
  Plot plot("##waits", size, -0.5, steps - 0.5, 0, ax.hi, "step (one bar per rank)", "ms", false,
            [](double v) { return std::abs(v - std::round(v)) < 1e-6 ? fmt_num(std::round(v) + 0.0, 6) : std::string(); }, [](double v) { return fmt_num(v, 6); });
  ImDrawList* dl = plot.draw_list();
  const double slot = 0.8 / std::max<std::size_t>(ranks.size(), 1);
  for (const auto& b : m.breakdown) {
    int ri = static_cast<int>(std::find(ranks.begin(), ranks.end(), b.rank) - ranks.begin());
    double xl = b.step - 0.4 + ri * slot, xr = xl + slot * 0.9;
    dl->AddRectFilled(ImVec2(plot.x(xl), plot.y(static_cast<double>(b.total_ns) / 1e6)), ImVec2(plot.x(xr), plot.y(0)), IM_COL32(95, 100, 120, 255));
    dl->AddRectFilled(ImVec2(plot.x(xl), plot.y(static_cast<double>(b.data_wait_ns + b.h2d_ns) / 1e6)), ImVec2(plot.x(xr), plot.y(0)), color::kBad);
    if (plot.hovered() && plot.mouse().x >= plot.x(xl) && plot.mouse().x <= plot.x(xr))
      ImGui::SetTooltip("rank %d step %d\nstep time %s\ndata wait + h2d %s (%s)", b.rank, b.step, fmt_ns(static_cast<double>(b.total_ns)).c_str(),
                        fmt_ns(static_cast<double>(b.data_wait_ns + b.h2d_ns)).c_str(),
                        fmt_pct(static_cast<double>(b.data_wait_ns + b.h2d_ns) / std::max<double>(1, static_cast<double>(b.total_ns))).c_str());
  }
  std::pair<std::string, ImU32> legend[] = {{"step time", IM_COL32(95, 100, 120, 255)}, {"data wait + h2d", color::kBad}};
  plot.legend(legend);
}

void producer_table(const RunModel& m) {
  const auto& ops = m.producer_ops.by_name;
  if (ops.empty()) {
    ImGui::TextColored(to_vec4(color::kDim), "No ranges on data-worker threads in this run.");
    return;
  }
  // Each worker's outermost range is one whole batch; transforms are nested in it.
  double batch_total = 0;
  for (const auto& o : ops)
    if (o.name == "batch") batch_total = static_cast<double>(o.total_ns);
  if (ImGui::BeginTable("##producer", 6, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchProp)) {
    for (const char* h : {"transform", "calls", "mean", "total", "share of a batch", "img/s per worker"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    const int bs = batch_size(m);
    for (const auto& o : ops) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(o.name.c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%lld", static_cast<long long>(o.count));
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(o.mean_ns).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_ns(static_cast<double>(o.total_ns)).c_str());
      ImGui::TableNextColumn();
      if (o.name == "batch") {
        ImGui::TextUnformatted("(whole batch)");
      } else if (batch_total > 0) {
        double share = static_cast<double>(o.total_ns) / batch_total;
        ImGui::ProgressBar(static_cast<float>(std::min(share, 1.0)), ImVec2(-1, 0), fmt_pct(share).c_str());
      }
      ImGui::TableNextColumn();
      if (o.name == "batch" && o.mean_ns > 0) ImGui::Text("%.0f", bs * 1e9 / o.mean_ns);
      else if (o.mean_ns > 0) ImGui::Text("%.0f", 1e9 / o.mean_ns);
    }
    ImGui::EndTable();
  }
}

}  // namespace

void draw_queue(App& app) {
  const RunModel& m = *app.model;
  const auto& st = m.starvation;
  const int bs = batch_size(m);
  // Headline: input-bound %, the worst empty-queue ratio, and the advice.
  gauge("input-bound (data wait + h2d of step time)", st.overall.percent, 5.0, 20.0,
        (std::string(analysis::input_bound_name(st.overall.level)) + "   thresholds 5 % / 20 % (TensorFlow Profiler)").c_str());
  ImGui::SameLine(0, 40);
  double worst_empty = 0;
  for (const auto& q : st.queues) worst_empty = std::max(worst_empty, q.empty_ratio);
  gauge("empty-queue ratio (worst queue)", worst_empty * 100.0, analysis::kEmptyQueueWarning * 50.0, analysis::kEmptyQueueWarning * 100.0,
        "samples with depth 0; flagged above 30 % (MindInsight)");
  ImGui::SameLine(0, 40);
  ImGui::BeginGroup();
  ImGui::TextColored(to_vec4(color::kDim), "advice");
  const double deliver = st.per_worker_per_s * st.workers * bs, consume = st.demand_per_s * bs;
  ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + std::max(300.0f, ImGui::GetContentRegionAvail().x));
  if (st.per_worker_per_s > 0 && st.demand_per_s > 0) {
    ImU32 c = st.workers_needed > st.workers ? color::kWarn : color::kGood;
    ImGui::TextColored(to_vec4(c), "%d worker%s deliver %.0f img/s, the step consumes %.0f img/s: %s", st.workers, st.workers == 1 ? "" : "s", deliver,
                       consume,
                       st.workers_needed > st.workers
                           ? (std::to_string(st.workers_needed) + " workers would keep the queue full (--data-workers " + std::to_string(st.workers_needed) + ").").c_str()
                           : "the workers keep up; the queue stays full.");
  } else {
    ImGui::TextColored(to_vec4(color::kDim), "Not enough data to estimate producer and consumer rates.");
  }
  if (st.per_image_ns > 0 && !st.per_image_stages.empty()) {
    const auto& [top, top_ns] = st.per_image_stages.front();
    ImGui::Text("one image costs a worker %s; the largest part is %s: %s (%.0f %%)", fmt_ns(st.per_image_ns).c_str(),
                top.c_str(), fmt_ns(top_ns).c_str(), 100.0 * top_ns / st.per_image_ns);
  }
  ImGui::Text("per rank: ");
  for (const auto& r : st.per_rank) {
    ImGui::SameLine();
    ImGui::Text("rank %d %.1f %% (%s)", r.rank, r.percent, analysis::input_bound_name(r.level));
  }
  ImGui::PopTextWrapPos();
  ImGui::EndGroup();
  ImGui::Separator();

  const float avail_w = ImGui::GetContentRegionAvail().x;
  ImGui::BeginChild("##queues", ImVec2(avail_w * 0.58f, 0), false);
  for (const auto& q : st.queues) {
    std::string title = "rank " + std::to_string(q.rank) + " - " + q.name + ":  empty " + fmt_pct(q.empty_ratio) + " of " +
                        std::to_string(q.samples) + " samples" + (q.flagged ? "  (flagged)" : "") + ",  in " + fmt_num(q.producer_per_s, 3) +
                        "/s, out " + fmt_num(q.consumer_per_s, 3) + "/s";
    section(title.c_str());
    depth_plot(m, q, ImVec2(-1, std::max(170.0f, ImGui::GetContentRegionAvail().y / static_cast<float>(std::max<std::size_t>(st.queues.size(), 1)) - 40)));
  }
  if (st.queues.empty()) ImGui::TextColored(to_vec4(color::kDim), "This run recorded no queue tracks.");
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("##side", ImVec2(0, 0), false);
  section("Consumer wait per step next to step time");
  wait_vs_step(m, ImVec2(-1, std::max(180.0f, ImGui::GetContentRegionAvail().y * 0.42f)));
  section("Producer cost per transform (data-worker threads)");
  producer_table(m);
  section("Longest empty-queue spells");
  for (const auto& s : st.longest_spells)
    ImGui::BulletText("rank %d, step %d: empty for %s", s.rank, s.step, fmt_ns(static_cast<double>(s.duration_ns())).c_str());
  if (st.longest_spells.empty()) ImGui::TextColored(to_vec4(color::kGood), "The queue never ran empty.");
  ImGui::EndChild();
}

}  // namespace wb::view
