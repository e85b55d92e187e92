// The timeline's lane kinds. Host ranges and GPU streams share EventLane: levels of disjoint boxes,
// sub-pixel runs merged (Tracy folds runs under 3 px), names fitted into the boxes, tooltips and
// outlines for the selected, highlighted (from Ops) and corr_id-linked events. Queue lanes draw the
// depth per pixel column with the capacity and empty spells; allreduce lanes draw ready -> start -> end.
#include "app/view/timeline_lanes.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include "app/view/draw_util.hpp"

namespace wb::view {

using app_model::counter_columns;
using app_model::DrawRun;
using app_model::Level;
using app_model::RunModel;
using app_model::visible_runs;

namespace {

constexpr double kMinBoxPx = 3.0;  // Tracy folds runs under 3 px

// The time-ratio scale: green (this run at least twice as fast) .. grey (equal) .. red (twice as slow).
ImU32 heat_color(double heat) {
  auto mix = [](int a, int b, double t) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  if (heat < 0.5) {
    double t = heat / 0.5;
    return IM_COL32(mix(60, 150, t), mix(190, 150, t), mix(90, 155, t), 255);
  }
  double t = (heat - 0.5) / 0.5;
  return IM_COL32(mix(150, 225, t), mix(150, 70, t), mix(155, 60, t), 255);
}

void clipped_text(ImDrawList* dl, float x0, float x1, float y, ImU32 c, const std::string& text) {
  float w = x1 - x0 - 6.0f;
  if (w < 14.0f) return;
  float tw = ImGui::CalcTextSize(text.c_str()).x;
  if (tw <= w) {
    float cx = x0 + (x1 - x0 - tw) * 0.5f;
    dl->AddText(ImVec2(cx, y), c, text.c_str());
    return;
  }
  // Keep the end of the name (module names differ at the end: layer3.4.conv2).
  const char* end = text.c_str() + text.size();
  const char* begin = end;
  while (begin > text.c_str() && ImGui::CalcTextSize(begin - 1, end).x + ImGui::CalcTextSize("..").x <= w) --begin;
  if (end - begin < 2) return;
  std::string s = ".." + std::string(begin, end);
  dl->AddText(ImVec2(x0 + 3.0f, y), c, s.c_str());
}

// Host ranges and device activity share the drawing: levels of disjoint boxes with sub-pixel merging.
class EventLane : public Lane {
 public:
  EventLane(const RunModel& m, const store::TrackRow& t) : model_(m), track_(t) {
    auto it = m.levels.find(t.id);
    if (it != m.levels.end()) levels_ = &it->second;
  }
  int rank() const override { return track_.rank; }
  std::uint32_t track_id() const override { return track_.id; }
  float height(float row_h) const override {
    std::size_t rows = levels_ ? levels_->size() : 0;
    if (model_.windowed()) rows = std::max<std::size_t>(rows, static_cast<std::size_t>(model_.window->depths(track_.id)));
    return row_h * static_cast<float>(std::max<std::size_t>(rows, 1)) + 4.0f;
  }
  std::pair<std::int64_t, std::int64_t> time_range() const override {
    std::int64_t lo = INT64_MAX, hi = INT64_MIN;
    if (levels_)
      for (const auto& l : *levels_)
        if (!l.spans.empty()) lo = std::min(lo, l.spans.front().start_ns), hi = std::max(hi, l.spans.back().end_ns);
    return {lo, hi};
  }

  void draw(LaneContext& ctx, float y) override {
    // A windowed run whose rows of this window are not read (yet, or too many to read): the depths held
    // whole (every range among the track's long ones) draw their rows, the others the summary.
    const bool summary = model_.windowed() && (static_cast<double>(model_.rows_t0_ns) > ctx.view.t0_ns ||
                                               static_cast<double>(model_.rows_t1_ns) < ctx.view.t1_ns);
    const std::size_t depths = levels_ ? levels_->size() : 0;
    for (std::size_t d = 0; d < depths; ++d)
      if (!summary || model_.window->held_whole(track_.id, static_cast<int>(d))) draw_level(ctx, y, d);
    if (summary) draw_summary(ctx, y);
  }

  void draw_level(LaneContext& ctx, float y, std::size_t d) {
    const float x1_lane = ctx.x0 + static_cast<float>(ctx.view.width_px);
    {
      const Level& level = (*levels_)[d];
      const float ly = y + 2.0f + static_cast<float>(d) * ctx.row_h;
      const float ly1 = ly + ctx.row_h - 1.0f;
      visible_runs(level, ctx.view, kMinBoxPx, ctx.scratch);
      const bool row_hovered = ctx.mouse_in && ctx.mouse.y >= ly && ctx.mouse.y < ly1 + 1.0f;
      for (const DrawRun& r : ctx.scratch) {
        float bx0 = std::max(ctx.x0 + static_cast<float>(r.x0), ctx.x0 - 2.0f);
        float bx1 = std::min(ctx.x0 + static_cast<float>(r.x1), x1_lane + 2.0f);
        std::uint32_t row = level.rows[r.first];
        EventRef ref{track_.id, row, is_kernel()};
        if (r.count == 1) {
          ImU32 c = color(ctx, row);
          ctx.dl->AddRectFilled(ImVec2(bx0, ly), ImVec2(bx1, ly1), c);
          if (bx1 - bx0 > 4.0f) ctx.dl->AddRect(ImVec2(bx0, ly), ImVec2(bx1, ly1), scale_rgb(c, 0.6f));
          clipped_text(ctx.dl, bx0, bx1, ly + 1.0f, IM_COL32(15, 15, 20, 255), name(row));
          bool sel = ctx.state.selected && *ctx.state.selected == ref;
          bool hl = highlighted(ctx, row);
          if (sel) ctx.dl->AddRect(ImVec2(bx0 - 1, ly - 1), ImVec2(bx1 + 1, ly1 + 1), color::kSelect, 0, 0, 2.5f);
          else if (hl) ctx.dl->AddRect(ImVec2(bx0 - 1, ly - 1), ImVec2(bx1 + 1, ly1 + 1), IM_COL32(255, 255, 255, 230), 0, 0, 1.5f);
        } else {
          // A merged run: the colour of its first event, darker, with a zigzag so it reads as many.
          ImU32 c = scale_rgb(color(ctx, row), 0.55f);
          ctx.dl->AddRectFilled(ImVec2(bx0, ly), ImVec2(bx1, ly1), c);
          float mid = (ly + ly1) * 0.5f;
          for (float x = bx0; x + 4 <= bx1; x += 8)
            ctx.dl->AddLine(ImVec2(x, mid - 2), ImVec2(x + 4, mid + 2), with_alpha(IM_COL32(255, 255, 255, 255), 70));
          if (bx1 - bx0 > 40) clipped_text(ctx.dl, bx0, bx1, ly + 1.0f, IM_COL32(220, 220, 225, 255), std::to_string(r.count) + " ops");
        }
        if (row_hovered && ctx.mouse.x >= bx0 - 1 && ctx.mouse.x <= bx1 + 1) {
          ctx.dl->AddRect(ImVec2(bx0, ly), ImVec2(bx1, ly1), IM_COL32(255, 255, 255, 255));
          if (r.count == 1) {
            ctx.hovered = ref;
            ImGui::BeginTooltip();
            tooltip(row);
            ImGui::EndTooltip();
          } else {
            ImGui::BeginTooltip();
            ImGui::Text("%u events merged (each under %.0f px)", r.count, kMinBoxPx);
            ImGui::Text("busy %s over %s", fmt_ns(static_cast<double>(r.busy_ns)).c_str(),
                        fmt_ns((r.x1 - r.x0) * ctx.view.ns_per_px()).c_str());
            ImGui::TextColored(to_vec4(color::kDim), "zoom in (mouse wheel) to separate them");
            ImGui::EndTooltip();
          }
        }
      }
    }
  }

  // A windowed run's summary buckets (store/summary.hpp) in runs of at least kMinBoxPx: the colour of the
  // category (or kernel kind) holding most of the time, dimmer the less of the run is busy. Neighbouring
  // runs of one colour and about one fill are one box, so a frame draws a few boxes a row, not a pixel's.
  void draw_summary(LaneContext& ctx, float y) {
    const auto& window = *model_.window;
    const auto view = window.summary_for(ctx.view.t0_ns, ctx.view.t1_ns, ctx.view.ns_per_px());
    const int depths = window.depths(track_.id);
    const double t0 = ctx.view.t0_ns, t1 = ctx.view.t1_ns;
    const float clip_y0 = ctx.dl->GetClipRectMin().y, clip_y1 = ctx.dl->GetClipRectMax().y;
    struct Run {
      double x0 = 0.0, x1 = 0.0;
      std::int64_t count = 0, busy = 0, span = 0, best = -1;
      store::SummaryBucket top;
      double fill() const { return std::clamp(static_cast<double>(busy) / static_cast<double>(std::max<std::int64_t>(span, 1)), 0.0, 1.0); }
    };
    for (int d = 0; d < depths; ++d) {
      const float ly = y + 2.0f + static_cast<float>(d) * ctx.row_h;
      const float ly1 = ly + ctx.row_h - 1.0f;
      auto it = view->buckets.find({track_.id, d});
      if (it == view->buckets.end() || ly1 < clip_y0 || ly > clip_y1 || window.held_whole(track_.id, d)) continue;
      const store::SummaryTrack* info = window.info(track_.id, d);
      const double first_px = info ? ctx.view.to_px(static_cast<double>(info->first_ns)) : -1e30;
      const double last_px = info ? ctx.view.to_px(static_cast<double>(info->last_ns)) : 1e30;
      const auto& buckets = it->second;
      std::vector<Run> runs;
      auto b = std::lower_bound(buckets.begin(), buckets.end(), t0,
                                [](const store::SummaryBucket& x, double t) { return static_cast<double>(x.end_ns) <= t; });
      for (; b != buckets.end() && static_cast<double>(b->start_ns) <= t1; ++b) {
        // A bucket is drawn no wider than the depth's rows reach (a coarse bucket can reach far past them).
        const double bx0 = std::max(ctx.view.to_px(static_cast<double>(b->start_ns)), first_px);
        const double bx1 = std::min(ctx.view.to_px(static_cast<double>(b->end_ns)), last_px);
        if (runs.empty() || bx0 >= runs.back().x0 + kMinBoxPx || bx0 > runs.back().x1 + 1.0) {
          runs.emplace_back();
          runs.back().x0 = bx0;
        }
        Run& r = runs.back();
        r.x1 = std::max(r.x1, bx1);
        r.count += b->count;
        r.busy += b->busy_ns;
        r.span += b->end_ns - b->start_ns;
        if (b->busy_ns > r.best) r.best = b->busy_ns, r.top = *b;
      }
      // Boxes: runs that touch, of one colour and a fill within 1/8, are drawn as one.
      std::size_t i = 0;
      while (i < runs.size()) {
        std::size_t j = i + 1;
        const ImU32 c = summary_color(runs[i].top.name, runs[i].top.category);
        const int level = static_cast<int>(runs[i].fill() * 8.0);
        while (j < runs.size() && runs[j].x0 <= runs[j - 1].x1 + 1.0 &&
               summary_color(runs[j].top.name, runs[j].top.category) == c && static_cast<int>(runs[j].fill() * 8.0) == level)
          ++j;
        const float bx0 = std::max(ctx.x0 + static_cast<float>(runs[i].x0), ctx.x0 - 2.0f);
        const float bx1 = std::min(ctx.x0 + static_cast<float>(std::max(runs[j - 1].x1, runs[i].x0 + 1.0)),
                                   ctx.x0 + static_cast<float>(ctx.view.width_px) + 2.0f);
        ctx.dl->AddRectFilled(ImVec2(bx0, ly), ImVec2(bx1, ly1), with_alpha(c, 60 + 195 * level / 8));
        if (ctx.mouse_in && ctx.mouse.y >= ly && ctx.mouse.y < ly1 + 1.0f && ctx.mouse.x >= bx0 && ctx.mouse.x < bx1)
          for (std::size_t k = i; k < j; ++k) {
            const Run& r = runs[k];
            if (ctx.mouse.x < ctx.x0 + static_cast<float>(r.x0) || ctx.mouse.x >= ctx.x0 + static_cast<float>(std::max(r.x1, r.x0 + 1.0))) continue;
            ImGui::BeginTooltip();
            ImGui::Text("%lld %s start here, busy %.0f%% of %s", static_cast<long long>(r.count), is_kernel() ? "kernels" : "ranges",
                        100.0 * r.fill(), fmt_ns(static_cast<double>(r.span)).c_str());
            ImGui::Text("mostly %s", model_.run.name(r.top.name).c_str());
            ImGui::TextColored(to_vec4(color::kDim), "%s", window.reading() ? "reading this window's rows..." : "zoom in to read the rows");
            ImGui::EndTooltip();
            break;
          }
        i = j;
      }
    }
  }

 protected:
  virtual ImU32 summary_color(std::uint32_t name, std::uint8_t category) const = 0;
  virtual bool is_kernel() const = 0;
  virtual ImU32 color(const LaneContext& ctx, std::uint32_t row) const = 0;
  virtual std::string name(std::uint32_t row) const = 0;
  virtual void tooltip(std::uint32_t row) const = 0;
  virtual bool highlighted(const LaneContext& ctx, std::uint32_t row) const = 0;

  const RunModel& model_;
  store::TrackRow track_;
  const std::vector<Level>* levels_ = nullptr;
};

class HostLane final : public EventLane {
 public:
  HostLane(const RunModel& m, const store::TrackRow& t) : EventLane(m, t), rows_(m.run.ranges_of(t.id)) {}
  ImU32 summary_color(std::uint32_t, std::uint8_t category) const override { return category_color(category); }
  std::string label() const override { return model_.run.name(track_.name); }

 protected:
  bool is_kernel() const override { return false; }
  ImU32 color(const LaneContext& ctx, std::uint32_t row) const override {
    const auto& r = rows_[row];
    if (ctx.state.color_by_ratio && ctx.state.ratio_model == &model_) {
      auto it = ctx.state.ratio_heat.find({r.name, r.category});
      return it == ctx.state.ratio_heat.end() ? IM_COL32(62, 64, 72, 255) : heat_color(it->second);
    }
    return op_color(r.category, r.name);
  }
  std::string name(std::uint32_t row) const override { return model_.run.name(rows_[row].name); }
  bool highlighted(const LaneContext& ctx, std::uint32_t row) const override {
    const auto& r = rows_[row];
    if (ctx.state.highlight && ctx.state.highlight->first == r.name && ctx.state.highlight->second == r.category) return true;
    return ctx.linked_corr != 0 && r.corr_id == ctx.linked_corr;
  }
  void tooltip(std::uint32_t row) const override {
    const auto& r = rows_[row];
    ImGui::TextColored(to_vec4(category_color(r.category)), "%s", model_.run.name(r.name).c_str());
    ImGui::Text("category   %s", std::string(store::category_name(static_cast<store::Category>(r.category))).c_str());
    ImGui::Text("duration   %s", fmt_ns(static_cast<double>(r.end_ns - r.start_ns)).c_str());
    ImGui::Text("start      %s", fmt_ns(static_cast<double>(r.start_ns - model_.t_min_ns)).c_str());
    ImGui::Text("step       %d    depth %d", r.step, r.depth);
    ImGui::Text("thread     %s (rank %d)", model_.run.name(track_.name).c_str(), track_.rank);
    if (r.corr_id != 0) ImGui::Text("corr id    %llu", static_cast<unsigned long long>(r.corr_id));
  }

 private:
  const std::vector<store::RangeRow>& rows_;
};

class StreamLane final : public EventLane {
 public:
  StreamLane(const RunModel& m, const store::TrackRow& t) : EventLane(m, t), rows_(kernels_of(m, t.id)) {}
  ImU32 summary_color(std::uint32_t, std::uint8_t kind) const override { return kernel_color(0, kind); }
  std::string label() const override { return "GPU " + model_.run.name(track_.name); }

 protected:
  bool is_kernel() const override { return true; }
  ImU32 color(const LaneContext&, std::uint32_t row) const override { return kernel_color(rows_[row].name, rows_[row].kind); }
  static ImU32 kernel_color(std::uint32_t name, std::uint8_t kind) {
    if (kind == static_cast<std::uint8_t>(store::KernelKind::memcpy)) return category_color(5);
    if (kind == static_cast<std::uint8_t>(store::KernelKind::memset)) return IM_COL32(150, 150, 150, 255);
    float f = 0.75f + static_cast<float>(((name * 2654435761u) >> 16) % 9) * 0.05f;
    return scale_rgb(IM_COL32(120, 165, 220, 255), f);
  }
  static const std::vector<store::KernelRow>& kernels_of(const RunModel& m, std::uint32_t track) {
    static const std::vector<store::KernelRow> none;
    auto it = m.run.kernels.find(track);
    return it == m.run.kernels.end() ? none : it->second;
  }
  std::string name(std::uint32_t row) const override { return model_.run.name(rows_[row].name); }
  bool highlighted(const LaneContext& ctx, std::uint32_t row) const override {
    return ctx.linked_corr != 0 && rows_[row].corr_id == ctx.linked_corr;
  }
  void tooltip(std::uint32_t row) const override {
    const auto& k = rows_[row];
    ImGui::TextColored(to_vec4(color::kAccent), "%s", model_.run.name(k.name).c_str());
    ImGui::Text("%s   %s", std::string(store::kernel_kind_name(static_cast<store::KernelKind>(k.kind))).c_str(),
                fmt_ns(static_cast<double>(k.end_ns - k.start_ns)).c_str());
    ImGui::Text("start      %s", fmt_ns(static_cast<double>(k.start_ns - model_.t_min_ns)).c_str());
    if (k.bytes > 0) ImGui::Text("bytes      %s", fmt_bytes(static_cast<double>(k.bytes)).c_str());
    if (k.grid[0] > 0)
      ImGui::Text("grid (%d,%d,%d)  block (%d,%d,%d)", k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2]);
    if (k.corr_id != 0) ImGui::Text("launched by corr id %llu (outlined)", static_cast<unsigned long long>(k.corr_id));
  }

 private:
  const std::vector<store::KernelRow>& rows_;
};

class QueueLane final : public Lane {
 public:
  QueueLane(const RunModel& m, const store::TrackRow& t) : model_(m), track_(t) {
    auto it = m.counters().find(t.id);
    if (it != m.counters().end()) samples_ = &it->second;
    if (samples_) {
      spells_ = analysis::empty_spells(*samples_);
      for (const auto& s : *samples_) max_ = std::max(max_, s.value);
    }
    max_ = std::max(max_, static_cast<double>(m.queue_capacity));
    if (max_ <= 0) max_ = 1;
  }
  std::string label() const override { return model_.run.name(track_.name) + " depth"; }
  int rank() const override { return track_.rank; }
  float height(float row_h) const override { return row_h * 2.6f; }
  std::pair<std::int64_t, std::int64_t> time_range() const override {
    if (!samples_ || samples_->empty()) return {INT64_MAX, INT64_MIN};
    return {samples_->front().t_ns, samples_->back().t_ns};
  }
  void draw(LaneContext& ctx, float y) override {
    if (!samples_) return;
    const float h = height(ctx.row_h) - 4.0f;
    const float top = y + 2.0f, bottom = top + h;
    auto vy = [&](double v) { return bottom - static_cast<float>(v / max_) * (h - 2.0f); };
    // Starvation spells first, underneath the area.
    for (const auto& s : spells_) {
      float a = ctx.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(s.start_ns)));
      float b = ctx.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(s.end_ns)));
      if (b < ctx.x0 || a > ctx.x0 + ctx.view.width_px) continue;
      b = std::max(b, a + 1.0f);
      ctx.dl->AddRectFilled(ImVec2(a, top), ImVec2(b, bottom), IM_COL32(200, 60, 55, 60));
      ctx.dl->AddRectFilled(ImVec2(a, bottom - 3), ImVec2(b, bottom), color::kBad);
    }
    const int cols = std::max(1, static_cast<int>(ctx.view.width_px));
    auto ext = counter_columns(*samples_, ctx.view, cols);
    const ImU32 fill = with_alpha(category_color(4), 150), edge = category_color(4);
    for (int c = 0; c < cols; ++c) {
      const auto& e = ext[static_cast<std::size_t>(c)];
      if (std::isnan(e.hi)) continue;
      float x = ctx.x0 + static_cast<float>(c);
      ctx.dl->AddRectFilled(ImVec2(x, vy(e.lo)), ImVec2(x + 1.0f, bottom), fill);
      ctx.dl->AddRectFilled(ImVec2(x, vy(e.hi)), ImVec2(x + 1.0f, vy(e.lo) + 1.0f), edge);
    }
    if (model_.queue_capacity > 0) {
      float cy = vy(model_.queue_capacity);
      for (float x = ctx.x0; x < ctx.x0 + ctx.view.width_px; x += 10)
        ctx.dl->AddLine(ImVec2(x, cy), ImVec2(x + 5, cy), color::kWarn);
    }
    if (ctx.mouse_in && ctx.mouse.y >= top && ctx.mouse.y < bottom) {
      double t = ctx.view.to_time(ctx.mouse.x - ctx.x0);
      auto it = std::partition_point(samples_->begin(), samples_->end(),
                                     [&](const store::CounterRow& s) { return static_cast<double>(s.t_ns) <= t; });
      ImGui::BeginTooltip();
      ImGui::TextColored(to_vec4(category_color(4)), "%s (rank %d)", model_.run.name(track_.name).c_str(), track_.rank);
      if (it != samples_->begin()) ImGui::Text("depth %g of %d", std::prev(it)->value, model_.queue_capacity);
      for (const auto& s : spells_)
        if (t >= static_cast<double>(s.start_ns) && t <= static_cast<double>(s.end_ns))
          ImGui::TextColored(to_vec4(color::kBad), "starved: empty for %s (step %d)", fmt_ns(static_cast<double>(s.duration_ns())).c_str(), s.step);
      ImGui::TextColored(to_vec4(color::kDim), "red: queue empty (the consumer waits)   dashed: capacity");
      ImGui::EndTooltip();
    }
  }

 private:
  const RunModel& model_;
  store::TrackRow track_;
  const std::vector<store::CounterRow>* samples_ = nullptr;
  std::vector<analysis::Spell> spells_;
  double max_ = 1.0;
};

class AllreduceLane final : public Lane {
 public:
  AllreduceLane(const RunModel& m, int rank) : model_(m), rank_(rank) {
    for (std::size_t i = 0; i < m.allreduces().size(); ++i) {
      const auto& a = m.allreduces()[i];
      if (a.rank != rank) continue;
      rows_.push_back(i);
      buckets_ = std::max(buckets_, a.bucket + 1);
      longest_ = std::max(longest_, a.end_ns - a.ready_ns);
    }
    std::stable_sort(rows_.begin(), rows_.end(), [&](std::size_t a, std::size_t b) {
      return m.allreduces()[a].ready_ns < m.allreduces()[b].ready_ns;
    });
  }
  bool empty() const { return rows_.empty(); }
  std::string label() const override { return "allreduce buckets"; }
  int rank() const override { return rank_; }
  float height(float row_h) const override { return std::max(1, buckets_) * row_h * 0.75f + 4.0f; }
  std::pair<std::int64_t, std::int64_t> time_range() const override {
    std::int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (auto i : rows_) {
      const auto& a = model_.allreduces()[i];
      lo = std::min(lo, a.ready_ns);
      hi = std::max(hi, a.end_ns);
    }
    return {lo, hi};
  }
  void draw(LaneContext& ctx, float y) override {
    const float rh = ctx.row_h * 0.75f;
    const ImU32 c = category_color(6);
    // Collectives under kMinBoxPx wide are drawn merged, one box per run of them that touch on a bucket's
    // row (a long run zoomed out has hundreds of thousands), and only those in view are visited.
    std::map<int, std::pair<float, float>> merged;  // bucket -> the box being extended
    auto flush = [&](int bucket) {
      auto it = merged.find(bucket);
      if (it == merged.end()) return;
      const float ry = y + 2.0f + static_cast<float>(buckets_ - 1 - bucket) * rh;
      const auto [x0, x1] = it->second;
      ctx.dl->AddRectFilled(ImVec2(x0, ry + 1), ImVec2(std::max(x1, x0 + 1.0f), ry + rh - 1), with_alpha(c, 170));
      merged.erase(it);
    };
    const double t0 = ctx.view.t0_ns - static_cast<double>(longest_), t1 = ctx.view.t1_ns;
    auto first = std::partition_point(rows_.begin(), rows_.end(), [&](std::size_t i) {
      return static_cast<double>(model_.allreduces()[i].ready_ns) < t0;
    });
    for (auto row = first; row != rows_.end(); ++row) {
      const auto& a = model_.allreduces()[*row];
      if (static_cast<double>(a.ready_ns) > t1) break;
      // The last bucket (produced first by backward) on top.
      float ry = y + 2.0f + static_cast<float>(buckets_ - 1 - a.bucket) * rh;
      float xr = ctx.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(a.ready_ns)));
      float xs = ctx.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(a.start_ns)));
      float xe = ctx.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(a.end_ns)));
      if (xe < ctx.x0 - 2 || xr > ctx.x0 + ctx.view.width_px + 2) continue;
      xs = std::max(xs, xr);
      xe = std::max(xe, xs + 1.0f);
      if (xe - xr < kMinBoxPx) {
        auto it = merged.find(a.bucket);
        if (it != merged.end() && xr > it->second.second + 1.0f) flush(a.bucket), it = merged.end();
        if (it == merged.end()) merged[a.bucket] = {xr, xe};
        else it->second.second = std::max(it->second.second, xe);
        continue;
      }
      flush(a.bucket);
      float mid = ry + rh * 0.5f;
      ctx.dl->AddLine(ImVec2(xr, mid), ImVec2(xs, mid), color::kDim, 1.0f);
      ctx.dl->AddLine(ImVec2(xr, ry + 2), ImVec2(xr, ry + rh - 2), color::kDim, 1.0f);
      ctx.dl->AddRectFilled(ImVec2(xs, ry + 1), ImVec2(xe, ry + rh - 1), c);
      clipped_text(ctx.dl, xs, xe, ry, IM_COL32(20, 20, 20, 255), "bucket " + std::to_string(a.bucket));
      if (ctx.mouse_in && ctx.mouse.y >= ry && ctx.mouse.y < ry + rh && ctx.mouse.x >= xr - 2 && ctx.mouse.x <= xe + 2) {
        ctx.dl->AddRect(ImVec2(xr, ry + 1), ImVec2(xe, ry + rh - 1), IM_COL32(255, 255, 255, 255));
        ImGui::BeginTooltip();
        ImGui::TextColored(to_vec4(c), "bucket %d, step %d (rank %d)", a.bucket, a.step, a.rank);
        ImGui::Text("params     [%d, %d]  %s", a.first_param, a.last_param, fmt_bytes(static_cast<double>(a.bytes)).c_str());
        ImGui::Text("ready -> start  %s (waited for the stream)", fmt_ns(static_cast<double>(a.start_ns - a.ready_ns)).c_str());
        ImGui::Text("start -> end    %s", fmt_ns(static_cast<double>(a.end_ns - a.start_ns)).c_str());
        if (a.end_ns > a.start_ns)
          ImGui::Text("bandwidth       %s/s", fmt_bytes(static_cast<double>(a.bytes) / (static_cast<double>(a.end_ns - a.start_ns) / 1e9)).c_str());
        ImGui::EndTooltip();
      }
    }
    while (!merged.empty()) flush(merged.begin()->first);
  }

 private:
  const RunModel& model_;
  int rank_;
  std::vector<std::size_t> rows_;  // by ready time
  int buckets_ = 0;
  std::int64_t longest_ = 0;  // ready to end
};

// Where each rank's pipeline lane was drawn this frame, so the lane of the later rank can draw the
// arrows between the two (lanes draw in rank order; a folded rank has no entry for the frame).
struct PipelineLaneYs {
  int frame = -1;
  std::map<int, float> y;  // rank -> top of its pipeline lane
};

// A pipeline stage's micro-batches: forward (F<m>) and backward (B<m>) boxes coloured by micro-batch
// on the first row, the waits for activations and gradients on the second, and an arrow from every
// send's post to its receive's completion (activations forward, gradients back).
class PipelineLane final : public Lane {
 public:
  PipelineLane(const RunModel& m, int rank, std::shared_ptr<PipelineLaneYs> ys) : model_(m), rank_(rank), ys_(std::move(ys)) {
    for (std::size_t i = 0; i < m.run.pipeline_spans.size(); ++i) {
      const auto& p = m.run.pipeline_spans[i];
      if (p.rank == rank) rows_.push_back(i);
      if (p.rank == rank) stage_ = p.stage;
    }
  }
  bool empty() const { return rows_.empty(); }
  std::string label() const override { return "pipeline stage " + std::to_string(stage_); }
  int rank() const override { return rank_; }
  float height(float row_h) const override { return row_h * 2.0f + 6.0f; }
  std::pair<std::int64_t, std::int64_t> time_range() const override {
    std::int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (auto i : rows_) {
      lo = std::min(lo, model_.run.pipeline_spans[i].post_ns);
      hi = std::max(hi, model_.run.pipeline_spans[i].end_ns);
    }
    return {lo, hi};
  }
  void draw(LaneContext& ctx, float y) override {
    const int frame = ImGui::GetFrameCount();
    if (ys_->frame != frame) {
      ys_->frame = frame;
      ys_->y.clear();
    }
    ys_->y[rank_] = y;
    const float rh = ctx.row_h;
    auto px = [&](std::int64_t t) { return ctx.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(t))); };
    const store::PipelineSpanRow* hovered = nullptr;
    for (auto i : rows_) {
      const auto& p = model_.run.pipeline_spans[i];
      const bool compute = p.kind == "forward" || p.kind == "backward";
      const bool wait = p.kind == "recv_act" || p.kind == "recv_grad";
      if (!compute && !wait) continue;
      float xs = px(p.start_ns), xe = std::max(px(p.end_ns), xs + 1.0f);
      if (xe < ctx.x0 - 2 || xs > ctx.x0 + ctx.view.width_px + 2) continue;
      const float ry = y + 2.0f + (compute ? 0.0f : rh + 2.0f);
      ImU32 c = series_color(p.micro);
      if (compute && p.kind == "backward") c = scale_rgb(c, 0.7f);
      if (wait) c = with_alpha(c, 90);
      ctx.dl->AddRectFilled(ImVec2(xs, ry), ImVec2(xe, ry + rh - 2), c);
      std::string text = compute ? (p.kind == "forward" ? "F" : "B") : (p.kind == "recv_act" ? "wait act " : "wait grad ");
      text.append(std::to_string(p.micro));
      clipped_text(ctx.dl, xs, xe, ry - 1, IM_COL32(20, 20, 20, 255), text);
      if (ctx.mouse_in && ctx.mouse.y >= ry && ctx.mouse.y < ry + rh && ctx.mouse.x >= xs - 1 && ctx.mouse.x <= xe + 1) {
        ctx.dl->AddRect(ImVec2(xs, ry), ImVec2(xe, ry + rh - 2), IM_COL32(255, 255, 255, 255));
        hovered = &p;
      }
    }
    // Arrows with the previous stage (drawn earlier this frame): its activations into this stage,
    // this stage's gradients back to it.
    auto prev = ys_->y.find(rank_ - 1);
    if (prev != ys_->y.end()) {
      std::map<std::tuple<int, int, std::string>, const store::PipelineSpanRow*> theirs;  // (step, micro, kind)
      for (const auto& p : model_.run.pipeline_spans)
        if (p.rank == rank_ - 1 && (p.kind == "send_act" || p.kind == "recv_grad")) theirs[{p.step, p.micro, p.kind}] = &p;
      const float y_prev = prev->second + 2.0f + rh * 0.5f, y_here = y + 2.0f + rh * 0.5f;
      for (auto i : rows_) {
        const auto& p = model_.run.pipeline_spans[i];
        const store::PipelineSpanRow* from = nullptr;
        const store::PipelineSpanRow* to = nullptr;
        if (p.kind == "recv_act") {
          auto it = theirs.find({p.step, p.micro, std::string("send_act")});
          if (it != theirs.end()) from = it->second, to = &p;
        } else if (p.kind == "send_grad") {
          auto it = theirs.find({p.step, p.micro, std::string("recv_grad")});
          if (it != theirs.end()) from = &p, to = it->second;
        }
        if (!from) continue;
        const bool act = p.kind == "recv_act";
        const ImVec2 a(px(from->post_ns), act ? y_prev : y_here), b(px(std::max(to->end_ns, from->post_ns)), act ? y_here : y_prev);
        if (std::max(a.x, b.x) < ctx.x0 || std::min(a.x, b.x) > ctx.x0 + ctx.view.width_px) continue;
        const ImU32 c = with_alpha(series_color(p.micro), 200);
        ctx.dl->AddLine(a, b, c, 1.5f);
        const float dir = b.y > a.y ? 1.0f : -1.0f;
        ctx.dl->AddTriangleFilled(b, ImVec2(b.x - 4, b.y - 7 * dir), ImVec2(b.x + 4, b.y - 7 * dir), c);
      }
    }
    if (hovered) {
      const auto& p = *hovered;
      ImGui::BeginTooltip();
      ImGui::TextColored(to_vec4(series_color(p.micro)), "%s, micro-batch %d, step %d (stage %d, rank %d)", p.kind.c_str(),
                         p.micro, p.step, p.stage, p.rank);
      ImGui::Text("duration   %s", fmt_ns(static_cast<double>(p.end_ns - p.start_ns)).c_str());
      if (p.peer >= 0) {
        ImGui::Text("from rank  %d, %s", p.peer, fmt_bytes(static_cast<double>(p.bytes)).c_str());
        ImGui::Text("posted %s before the wait began", fmt_ns(static_cast<double>(p.start_ns - p.post_ns)).c_str());
      }
      ImGui::EndTooltip();
    }
  }

 private:
  const RunModel& model_;
  int rank_;
  int stage_ = 0;
  std::shared_ptr<PipelineLaneYs> ys_;
  std::vector<std::size_t> rows_;
};

}  // namespace

// A rank's memory: the backend's live bytes after every allocation and free (the memory table), as an
// area scaled to the rank's most, with each step's peak marked; the tooltip gives the level, the step's
// peak and the op at it.
class MemoryLane final : public Lane {
 public:
  MemoryLane(const RunModel& m, int rank) : model_(m), rank_(rank) {
    for (const auto& e : m.run.memory) {
      if (e.rank != rank) continue;
      samples_.push_back(store::CounterRow{0, e.t_ns, static_cast<double>(e.live_bytes)});
      max_ = std::max(max_, static_cast<double>(e.live_bytes));
    }
    if (max_ <= 0) max_ = 1;
  }
  bool empty() const { return samples_.empty(); }
  std::string label() const override { return "memory"; }
  int rank() const override { return rank_; }
  float height(float row_h) const override { return row_h * 2.6f; }
  std::pair<std::int64_t, std::int64_t> time_range() const override {
    if (samples_.empty()) return {INT64_MAX, INT64_MIN};
    return {samples_.front().t_ns, samples_.back().t_ns};
  }
  void draw(LaneContext& ctx, float y) override {
    const float h = height(ctx.row_h) - 4.0f;
    const float top = y + 2.0f, bottom = top + h;
    auto vy = [&](double v) { return bottom - static_cast<float>(v / max_) * (h - 2.0f); };
    const int cols = std::max(1, static_cast<int>(ctx.view.width_px));
    // counter_columns carries the level into columns without an event; it ends with the recording.
    auto ext = counter_columns(samples_, ctx.view, cols);
    const ImU32 fill = with_alpha(kColor, 130);
    for (int c = 0; c < cols; ++c) {
      const auto& e = ext[static_cast<std::size_t>(c)];
      if (std::isnan(e.hi) || ctx.view.to_time(static_cast<double>(c)) > static_cast<double>(model_.t_max_ns)) continue;
      float x = ctx.x0 + static_cast<float>(c);
      ctx.dl->AddRectFilled(ImVec2(x, vy(e.lo)), ImVec2(x + 1.0f, bottom), fill);
      ctx.dl->AddRectFilled(ImVec2(x, vy(e.hi)), ImVec2(x + 1.0f, vy(e.lo) + 1.0f), kColor);
    }
    const analysis::StepMemory* at = nullptr;
    if (model_.ready()) {
      for (const auto& m : model_.memory.steps) {
        if (m.rank != rank_) continue;
        const float px = ctx.x0 + static_cast<float>(ctx.view.to_px(static_cast<double>(m.peak_ns)));
        if (px >= ctx.x0 && px <= ctx.x0 + ctx.view.width_px)
          ctx.dl->AddTriangleFilled(ImVec2(px - 4, top), ImVec2(px + 4, top), ImVec2(px, top + 6), color::kWarn);
        if (ctx.mouse_in) {
          const double t = ctx.view.to_time(ctx.mouse.x - ctx.x0);
          if (t >= static_cast<double>(m.start_ns) && t <= static_cast<double>(m.end_ns)) at = &m;
        }
      }
    }
    if (ctx.mouse_in && ctx.mouse.y >= top && ctx.mouse.y < bottom) {
      const double t = ctx.view.to_time(ctx.mouse.x - ctx.x0);
      auto it = std::partition_point(samples_.begin(), samples_.end(),
                                     [&](const store::CounterRow& s) { return static_cast<double>(s.t_ns) <= t; });
      ImGui::BeginTooltip();
      ImGui::TextColored(to_vec4(kColor), "memory (rank %d)", rank_);
      if (it != samples_.begin()) ImGui::Text("live       %s", fmt_bytes(std::prev(it)->value).c_str());
      if (at) {
        ImGui::Text("step %d peak %s at %s", at->step, fmt_bytes(static_cast<double>(at->peak_bytes)).c_str(),
                    at->peak_op.c_str());
      }
      ImGui::TextColored(to_vec4(color::kDim), "live bytes after every allocation and free; marks: each step's peak");
      ImGui::EndTooltip();
    }
  }

 private:
  static constexpr ImU32 kColor = IM_COL32(175, 120, 225, 255);
  const RunModel& model_;
  int rank_;
  std::vector<store::CounterRow> samples_;
  double max_ = 0.0;
};

std::vector<std::shared_ptr<Lane>> make_lanes(const RunModel& m) {
  std::vector<std::shared_ptr<Lane>> lanes;
  auto pipeline_ys = std::make_shared<PipelineLaneYs>();
  for (int rank : m.run.rank_ids()) {
    // A pipeline run: the stage's micro-batches first, above the op ranges they are made of.
    auto pl = std::make_shared<PipelineLane>(m, rank, pipeline_ys);
    if (!pl->empty()) lanes.push_back(pl);
    std::uint32_t main = m.run.main_track(rank);
    std::vector<const store::TrackRow*> threads, streams, queues;
    for (const auto& t : m.run.tracks) {
      if (t.rank != rank) continue;
      // A windowed run has a lane for every track its summary has, rows read or not.
      const bool summarised = m.windowed() && m.window->depths(t.id) > 0;
      if (t.kind == store::TrackKind::thread && (m.levels.count(t.id) || summarised)) threads.push_back(&t);
      else if (t.kind == store::TrackKind::stream && (m.run.kernels.count(t.id) || summarised)) streams.push_back(&t);
      else if (t.kind == store::TrackKind::queue && m.counters().count(t.id)) queues.push_back(&t);
    }
    std::stable_sort(threads.begin(), threads.end(), [&](auto* a, auto* b) { return (a->id == main) > (b->id == main); });
    for (auto* t : threads) lanes.push_back(std::make_shared<HostLane>(m, *t));
    for (auto* t : streams) lanes.push_back(std::make_shared<StreamLane>(m, *t));
    for (auto* t : queues) lanes.push_back(std::make_shared<QueueLane>(m, *t));
    auto mem = std::make_shared<MemoryLane>(m, rank);
    if (!mem->empty()) lanes.push_back(mem);
    auto ar = std::make_shared<AllreduceLane>(m, rank);
    if (!ar->empty()) lanes.push_back(ar);
  }
  return lanes;
}

std::uint64_t corr_of(const RunModel& m, const EventRef& ref) {
  if (ref.kernel) {
    auto it = m.run.kernels.find(ref.track);
    return it != m.run.kernels.end() && ref.row < it->second.size() ? it->second[ref.row].corr_id : 0;
  }
  const auto& rows = m.run.ranges_of(ref.track);
  return ref.row < rows.size() ? rows[ref.row].corr_id : 0;
}

std::pair<std::int64_t, std::int64_t> extent_of(const RunModel& m, const EventRef& ref) {
  if (ref.kernel) {
    auto it = m.run.kernels.find(ref.track);
    if (it != m.run.kernels.end() && ref.row < it->second.size()) return {it->second[ref.row].start_ns, it->second[ref.row].end_ns};
    return {0, 0};
  }
  const auto& rows = m.run.ranges_of(ref.track);
  if (ref.row < rows.size()) return {rows[ref.row].start_ns, rows[ref.row].end_ns};
  return {0, 0};
}

}  // namespace wb::view
