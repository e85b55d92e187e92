// The workbench shell without the window: the loaded runs, the state each view keeps between frames,
// the menu bar, tabs, status bar, file browser and error popup. main.cpp owns the GLFW window and the
// ImGui backends and calls App::frame() once per frame; bench/view_frame drives it without a window.
// What the views show (the loaded run, the precision data, the tuner's arithmetic and child process)
// comes from app/model (wb::app_model), which holds no ImGui.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "app/model/child_process.hpp"
#include "app/model/files_logic.hpp"
#include "app/model/layer_timing.hpp"
#include "app/model/ops_logic.hpp"
#include "app/model/precision_model.hpp"
#include "app/model/run_model.hpp"
#include "app/model/timeline_logic.hpp"

namespace wb::view {

enum class ViewId { overview, timeline, ops, queue, allreduce, precision, memory };
inline constexpr ViewId kAllViews[] = {ViewId::overview,  ViewId::timeline,  ViewId::ops,   ViewId::queue,
                                       ViewId::allreduce, ViewId::precision, ViewId::memory};
const char* view_name(ViewId v);   // "overview", ...
const char* view_title(ViewId v);  // "Overview", ...
std::optional<ViewId> view_from_name(std::string_view name);

// A reference to one host range or kernel in the timeline.
struct EventRef {
  std::uint32_t track = 0;
  std::uint32_t row = 0;  // index into the track's ranges (thread) or kernels (stream)
  bool kernel = false;
  bool operator==(const EventRef&) const = default;
};

class Lane;

struct TimelineState {
  std::vector<std::shared_ptr<Lane>> lanes;  // built for `lanes_for`
  const app_model::RunModel* lanes_for = nullptr;
  app_model::TimeView view;
  bool fitted = false;
  float scroll_y = 0.0f;
  std::optional<EventRef> hovered;   // this frame
  std::optional<EventRef> selected;
  std::optional<std::pair<std::int64_t, std::int64_t>> range_sel;  // shift-drag selection
  std::optional<double> drag_anchor_ns;
  std::vector<app_model::SelectionStat> range_stats;
  std::vector<int> collapsed;        // ranks whose lanes are folded
  char find[128] = {};
  std::string find_done;             // the text the occurrences were found for
  std::vector<EventRef> occurrences; // by start time
  int occurrence = -1;
  std::optional<std::pair<std::uint32_t, std::uint8_t>> highlight;  // (name, category) from Ops
  std::optional<std::pair<double, double>> zoom_to;  // a request from another view, applied next draw

  // What other views ask of the Timeline; they call these rather than set its fields.
  // Outlines every occurrence of op `name` in `category` and lets find step through them.
  void show_op(std::uint32_t name, std::uint8_t category, const std::string& text) {
    highlight = std::make_pair(name, category);
    std::snprintf(find, sizeof find, "%s", text.c_str());
    find_done.clear();
    occurrences.clear();
  }
  // Searches again for the find text on the next draw.
  void refind() { find_done.clear(); }
  // Shows [t0_ns, t1_ns] on the next draw.
  void request_zoom(std::pair<double, double> span) { zoom_to = span; }
  // A second run's lanes below the first run's, shifted so both runs' step `align_step` start at the
  // same x (align_runs in timeline_logic).
  std::vector<std::shared_ptr<Lane>> second_lanes;  // built for `second_for`
  const app_model::RunModel* second_for = nullptr;
  bool show_second = true;
  bool align = true;
  int align_step = -1;  // -1: the first steady step of the first run
  // "time vs second run": the first run's layer ranges coloured by their time per step over the second
  // run's (green faster .. red slower, app_model::ratio_heat), everything else grey.
  bool color_by_ratio = false;
  // The critical path across ranks (RunModel::critical) of the step under the cursor, outlined over the
  // main-thread lanes, or of the step pinned (>= 0) by a click in its panel or --path-step.
  bool show_path = true;
  int path_step = -1;
  int path_shown = -1;                     // the step outlined this frame, -1 for none
  bool path_zoomed = false;                // the view was zoomed to the pinned step once
  // A run opened windowed has the critical path of its sample's steps only: this frame's sample, held
  // while the frame draws (null for a run held whole, and until the sample is analysed).
  std::shared_ptr<const app_model::RunModel> path_sample;
  std::map<std::uint32_t, float> lane_y;   // this frame: track -> top of its lane (drawn lanes only)
  std::map<std::pair<std::uint32_t, std::uint8_t>, double> ratio_heat;  // (name, category) -> heat
  const app_model::RunModel* ratio_model = nullptr;                     // the run ratio_heat is for
};

// The Ops table's sortable columns (ImGui's column user ids).
enum class OpsColumn : int { name, category, count, total, self, mean, p50, p95, max, share };

struct OpsState {
  int selected = -1;  // index into RunModel::ops.by_name
  bool auto_selected = false;  // the first show selects the costliest op
  char filter[128] = {};
  int category = -1;  // -1: all
  bool layers_only = false;  // only layer ranges (analysis::is_layer_name)
  bool log_bins = true;
  std::vector<std::int64_t> durations;  // of the selected op, ascending
  std::vector<int> order;               // rows after filter and sort
  bool dirty = true;
  OpsColumn sort_column = OpsColumn::total;
  bool sort_ascending = false;
  std::vector<app_model::OpDelta> deltas;           // against the second run, per op of RunModel::ops.by_name
  const app_model::RunModel* deltas_for = nullptr;  // the second run they were computed for
};

struct PrecisionState {
  std::unique_ptr<app_model::PrecisionLoader> loader;
  std::shared_ptr<const app_model::PrecisionData> data;
  std::string error;
  int selected = -1;           // row index
  bool sort_by_error = false;
  int kind_filter = -1;        // a compare::TensorKind, -1 all
  bool failures_only = false;
  int n_index = 0;
  int c_index = 0;
  std::unique_ptr<app_model::TensorDetail> detail;
  std::string detail_error;
  // Set by a click or slider that picks another slice: the detail is recomputed at the start of the next
  // frame (load_detail), never freed while this frame's panes still draw from it.
  bool detail_stale = false;
  char reference_path[1024] = {};
};

struct MemoryState {
  int rank = -1;
  int step_index = -1;  // into RunModel::memory.steps; -1: the rank's largest peak
};

struct TunerState {
  std::vector<int> split;
  bool initialised = false;
  std::vector<analysis::Suggestion> suggestions;  // of the loaded run
  std::optional<std::size_t> dragging;
  std::string compare_label;  // which suggestion the split came from
  std::unique_ptr<app_model::ChildProcess> job;
  std::optional<app_model::TrainLaunch> launch;
  std::vector<int> job_split;
  std::string job_error;
  // After a re-run: what the model predicted for the split it ran with, against what was measured.
  struct Outcome {
    std::vector<int> split;
    double predicted_step_ns = 0.0, predicted_exposed_ns = 0.0;
    double measured_step_ns = 0.0, measured_exposed_ns = 0.0;
    std::string run;
    std::filesystem::path run_path;
  };
  std::optional<Outcome> pending_outcome;  // predicted part, waiting for the new run to load
  std::optional<Outcome> outcome;
  // Where the strip was drawn last frame (scripted input aims at its handles); absent until drawn.
  struct Strip {
    float x0 = 0.0f, width = 0.0f, y_mid = 0.0f;
    int params = 0;
  };
  std::optional<Strip> strip;
  // "Try the best candidates": wb tune-split on the open run as a child process; its trials land in the
  // run file, which reopens when it finishes.
  std::unique_ptr<app_model::ChildProcess> tune_job;
  std::filesystem::path tune_run;
  int try_candidates = 3, try_rounds = 2, try_steps = 10;
};

class App {
 public:
  struct Options {
    std::string run;        // opened at start (may be empty)
    std::string compare;    // a second run opened at start
    std::string reference;  // a reference dump compared at start (Precision)
    ViewId view = ViewId::overview;
    bool persist_recent = true;  // write ~/.config/wb-view/recent.txt
    // Scripted actions, so every workflow can run without a mouse (tests, screenshots):
    std::optional<std::vector<int>> tuner_splits;  // the tuner's split points once the run is loaded
    bool tuner_run = false;                        // then press "Run with these splits" once
    std::optional<std::array<int, 3>> tuner_try;   // press "Try the best candidates" with these candidates, rounds, steps
    std::optional<std::pair<int, int>> tuner_drag; // drag the handle of split FROM to TO with injected mouse input
    std::optional<std::int64_t> comparison;        // show this stored comparison in Precision
    bool color_by_ratio = false;                   // Timeline: colour layers by time vs the second run
    int path_step = -1;                            // Timeline: outline this step's critical path, zoomed to it
    bool layers_only = false;                      // Ops: layer ranges only
    int precision_kind = -1;                       // Precision: rows of this compare::TensorKind only
    app_model::OpenMode open_mode = app_model::OpenMode::automatic;  // --full / --windowed
  };
  explicit App(Options options);
  ~App();

  // Builds the whole UI for one frame (call between ImGui::NewFrame and ImGui::Render).
  void frame();
  // Loading or comparing in the background.
  bool busy() const;
  bool error_shown() const { return !error_.empty(); }
  const std::string& error() const { return error_; }

  void open(const std::filesystem::path& run);
  void open_second(const std::filesystem::path& run);
  void open_reference(const std::filesystem::path& reference);
  // Installs an already loaded model (tests, benchmarks).
  void set_model(std::shared_ptr<const app_model::RunModel> model);
  // Installs (or, with null, closes) the second run.
  void set_second(std::shared_ptr<const app_model::RunModel> model);
  void show_view(ViewId v);
  // Opens the file browser to pick a reference dump for the Precision view.
  void browse_reference();
  void show_error(std::string message, std::string title = "The file could not be opened");

  // The tuner's split from the run (or --tuner-splits the first time); true once it has one.
  bool ensure_tuner();
  // "Run with these splits": starts wb-train (next to wb-view, or $WB_TRAIN_BIN) with the run's
  // config and the tuner's split; the new run opens when it finishes. Errors go to the popup.
  void start_tuner_run();
  // "Try the best candidates": starts wb tune-split (next to wb-view, or $WB_BIN) on the open run with
  // the tuner's candidates, rounds and steps; the run reopens with the new trials when it finishes.
  void start_tune_split();
  // Shows a comparison saved in the run file (wb compare) without recomputing it; the reference's
  // tensors, when still there, load in the background for the detail plots only.
  void open_stored_comparison(std::int64_t id);
  // Call before ImGui::NewFrame: moves the mouse for a scripted --tuner-drag (no-op otherwise).
  void inject_input();
  // Plain-text figures for --print-tuner and --print-precision, one "key value" per line.
  std::string tuner_report() const;
  std::string precision_report() const;
  // Per-layer time of this run against the second run (wb diff's arithmetic), computed once per pair;
  // nullptr without a second run, before both are analysed, or when a run has no layer ranges
  // (layer_timing_error() says why).
  const app_model::LayerTiming* layer_timing();
  const std::string& layer_timing_error() const { return timing_error_; }

  // State read and written by the views (app/view/view_*.cpp).
  std::shared_ptr<const app_model::RunModel> model;
  std::shared_ptr<const app_model::RunModel> second;  // a second run, compared in the Overview
  TimelineState timeline;
  OpsState ops;
  TunerState tuner;
  PrecisionState precision;
  // Where the Overview drew each captured window's row last frame (its centre, screen pixels), so
  // scripted input can click one.
  std::vector<std::pair<float, float>> capture_rows;
  MemoryState memory;
  ViewId current = ViewId::overview;
  bool force_tab = true;  // select `current` in the tab bar on the next frame

 private:
  void poll_loaders();
  void draw_menu();
  void draw_status_bar(float height);
  void draw_file_browser();
  void draw_error_popup();
  void draw_loading();
  void draw_view(ViewId v);
  void draw_sampled(ViewId v);
  void draw_windowed_note(const std::string& status);
  std::weak_ptr<const app_model::RunModel> status_for_;  // the model the status bar's counts are of
  int status_ranks_ = 0, status_steps_ = 0;
  void remember(const std::filesystem::path& path);
  void poll_tuner();
  bool scripted_busy() const;

  Options options_;
  std::unique_ptr<app_model::RunLoader> loader_;
  bool loader_published_ = false;  // its model is installed (the timeline draws while analyses run)
  std::unique_ptr<app_model::RunLoader> second_loader_;
  std::shared_ptr<const app_model::LayerTiming> timing_;
  const app_model::RunModel* timing_a_ = nullptr;  // the pair timing_ (or timing_error_) is for
  const app_model::RunModel* timing_b_ = nullptr;
  std::string timing_error_;
  std::string error_;
  std::string error_title_;
  bool error_popup_open_ = false;
  bool tuner_splits_applied_ = false;
  bool tuner_run_started_ = false;
  bool tuner_try_started_ = false;
  int drag_frame_ = -1;      // progress of a scripted drag; -1 before it starts
  bool drag_done_ = false;
  bool comparison_opened_ = false;
  std::vector<std::string> recent_;
  enum class BrowseTarget { none, run, second, reference };
  BrowseTarget browse_ = BrowseTarget::none;
  bool browse_open_request_ = false;
  std::filesystem::path browse_dir_;
  char browse_path_[1024] = {};
  std::vector<app_model::DirEntry> browse_entries_;
  bool browse_dirty_ = true;
};

// The views, one per file (view_<name>.cpp).
void draw_overview(App& app);
void draw_timeline(App& app);
void draw_ops(App& app);
void draw_queue(App& app);
void draw_memory(App& app);
void draw_allreduce(App& app);
void draw_precision(App& app);

}  // namespace wb::view
