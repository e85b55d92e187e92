// Timeline lanes: one small interface (label, time range, height, draw) with a subclass per lane kind,
// as Tracy's timeline items: host ranges of a thread, device activity of a GPU stream, a data queue's
// depth, a rank's allreduce buckets, and a pipeline stage's micro-batches and messages.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <imgui.h>

#include "app/model/run_model.hpp"
#include "app/model/timeline_logic.hpp"
#include "app/view/app.hpp"

namespace wb::view {

// What a lane needs to draw one frame.
struct LaneContext {
  const app_model::RunModel& model;
  TimelineState& state;
  ImDrawList* dl;
  app_model::TimeView view;  // the time window across [x0, x0 + view.width_px]
  float x0 = 0.0f;
  float row_h = 18.0f;
  ImVec2 mouse;
  bool mouse_in = false;  // the mouse is over the lane area (not over the labels)
  std::vector<app_model::DrawRun>& scratch;
  // Set by the lane the mouse is over: the event under it, for click-to-select and kernel linking.
  std::optional<EventRef> hovered;
  std::uint64_t linked_corr = 0;  // corr_id to outline in other lanes (hovered or selected event's)
};

class Lane {
 public:
  virtual ~Lane() = default;
  virtual std::string label() const = 0;
  virtual int rank() const = 0;
  virtual std::uint32_t track_id() const { return 0; }  // the thread or stream track drawn; 0 for other lanes
  virtual std::pair<std::int64_t, std::int64_t> time_range() const = 0;
  virtual float height(float row_h) const = 0;
  // Draws into [y, y + height) and shows a tooltip for what is under the mouse.
  virtual void draw(LaneContext& ctx, float y) = 0;
};

// Every lane of a run, grouped by rank: threads (the main one first), streams, queues, allreduce.
std::vector<std::shared_ptr<Lane>> make_lanes(const app_model::RunModel& model);

// The corr_id of an event (0 when none).
std::uint64_t corr_of(const app_model::RunModel& model, const EventRef& ref);
// Start and end of an event.
std::pair<std::int64_t, std::int64_t> extent_of(const app_model::RunModel& model, const EventRef& ref);

}  // namespace wb::view
