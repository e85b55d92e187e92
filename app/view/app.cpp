// The shell: view names, loading runs on background threads (the timeline shows as soon as the rows are
// read, the other views when the analyses are done), the tab bar that hands each frame to one view, the
// menu bar, the status bar with the run's summary and the loading progress, the built-in file browser
// with recent files, and the error popup that keeps the app open after a bad file.
#include "app/view/app.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <imgui.h>

#include "app/model/files_logic.hpp"
#include "app/view/draw_util.hpp"

namespace wb::view {

using app_model::list_directory;
using app_model::PrecisionLoader;
using app_model::push_recent;
using app_model::read_recent;
using app_model::recent_files_path;
using app_model::RunLoader;
using app_model::RunModel;
using app_model::write_recent;

const char* view_name(ViewId v) {
  switch (v) {
    case ViewId::overview: return "overview";
    case ViewId::timeline: return "timeline";
    case ViewId::ops: return "ops";
    case ViewId::queue: return "queue";
    case ViewId::allreduce: return "allreduce";
    case ViewId::precision: return "precision";
    case ViewId::memory: return "memory";
  }
  return "overview";
}

const char* view_title(ViewId v) {
  switch (v) {
    case ViewId::overview: return "Overview";
    case ViewId::timeline: return "Timeline";
    case ViewId::ops: return "Ops";
    case ViewId::queue: return "Data queue";
    case ViewId::allreduce: return "AllReduce tuner";
    case ViewId::precision: return "Precision";
    case ViewId::memory: return "Memory";
  }
  return "Overview";
}

std::optional<ViewId> view_from_name(std::string_view name) {
  for (ViewId v : kAllViews)
    if (name == view_name(v)) return v;
  return std::nullopt;
}

App::App(Options options) : options_(std::move(options)) {
  current = options_.view;
  precision.kind_filter = options_.precision_kind;
  // A scripted drag aims at the tuner's strip, which only its view draws.
  if (options_.tuner_drag) current = ViewId::allreduce;
  if (options_.persist_recent) recent_ = read_recent(recent_files_path());
  std::error_code ec;
  browse_dir_ = std::filesystem::current_path(ec);
  if (!options_.run.empty()) open(options_.run);
  if (!options_.compare.empty()) open_second(options_.compare);
  if (!options_.reference.empty()) open_reference(options_.reference);
}

App::~App() = default;

bool App::busy() const {
  return loader_ || second_loader_ || precision.loader || (!options_.reference.empty() && !precision.data && precision.error.empty()) ||
         scripted_busy();
}

void App::remember(const std::filesystem::path& path) {
  std::error_code ec;
  auto abs = std::filesystem::absolute(path, ec);
  push_recent(recent_, (ec ? path : abs).string());
  if (options_.persist_recent) write_recent(recent_files_path(), recent_);
}

void App::open(const std::filesystem::path& run) {
  loader_ = std::make_unique<RunLoader>(run, options_.open_mode);
  loader_published_ = false;
}

void App::open_second(const std::filesystem::path& run) { second_loader_ = std::make_unique<RunLoader>(run); }

void App::open_reference(const std::filesystem::path& reference) {
  options_.reference = reference.string();
  std::snprintf(precision.reference_path, sizeof precision.reference_path, "%s", reference.string().c_str());
  // The comparison starts once the run is loaded (it needs the run's path).
  if (model) {
    precision.data.reset();
    precision.detail.reset();
    precision.error.clear();
    precision.selected = -1;
    precision.loader = std::make_unique<PrecisionLoader>(model->run.path, reference);
  }
}

void App::set_model(std::shared_ptr<const RunModel> m) {
  model = std::move(m);
  timeline = TimelineState{};
  timeline.color_by_ratio = options_.color_by_ratio;
  timeline.path_step = options_.path_step;
  ops = OpsState{};
  ops.layers_only = options_.layers_only;
  tuner.split.clear();
  tuner.initialised = false;
  tuner.strip.reset();
  precision.data.reset();
  precision.detail.reset();
  precision.selected = -1;
  timing_.reset();
  timing_a_ = timing_b_ = nullptr;
}

void App::set_second(std::shared_ptr<const RunModel> m) {
  // Lanes and deltas refer into the second model: drop them before it goes.
  timeline.second_lanes.clear();
  timeline.second_for = nullptr;
  timeline.ratio_heat.clear();
  timeline.ratio_model = nullptr;
  ops.deltas.clear();
  ops.deltas_for = nullptr;
  timing_.reset();
  timing_a_ = timing_b_ = nullptr;
  second = std::move(m);
}

const app_model::LayerTiming* App::layer_timing() {
  if (!model || !second || !model->ready() || !second->ready()) return nullptr;
  if (timing_a_ != model.get() || timing_b_ != second.get()) {
    timing_a_ = model.get();
    timing_b_ = second.get();
    timing_.reset();
    timing_error_.clear();
    try {
      timing_ = std::make_shared<const app_model::LayerTiming>(app_model::layer_timing(model->run, second->run));
    } catch (const std::exception& e) {
      timing_error_ = e.what();
    }
  }
  return timing_.get();
}

void App::show_view(ViewId v) {
  current = v;
  force_tab = true;
}

void App::browse_reference() {
  browse_ = BrowseTarget::reference;
  browse_open_request_ = true;
}

void App::show_error(std::string message, std::string title) {
  error_ = std::move(message);
  error_title_ = std::move(title);
  error_popup_open_ = true;
}

void App::poll_loaders() {
  if (loader_ && !loader_published_) {
    if (auto m = loader_->opened()) {
      set_model(std::move(m));
      loader_published_ = true;
    }
  }
  if (loader_ && loader_->done()) {
    if (auto m = loader_->result()) {
      remember(loader_->path());
      if (!loader_published_) set_model(std::move(m));
      if (!options_.reference.empty() && !precision.loader && !precision.data) open_reference(options_.reference);
    } else {
      show_error(loader_->error());
      options_.reference.clear();
      if (tuner.pending_outcome && tuner.pending_outcome->run_path == loader_->path()) tuner.pending_outcome.reset();
    }
    loader_.reset();
  }
  if (second_loader_ && second_loader_->done()) {
    if (auto m = second_loader_->result()) {
      remember(second_loader_->path());
      set_second(std::move(m));
    } else {
      show_error(second_loader_->error());
    }
    second_loader_.reset();
  }
  if (precision.loader && precision.loader->done()) {
    precision.data = precision.loader->result();
    precision.error = precision.loader->error();
    if (!precision.error.empty()) show_error(precision.error);
    precision.loader.reset();
  }
  if (model && model->windowed())
    if (auto slice = model->window->take()) {
      // The rows of a new window: the same run and view, other row indices.
      model = std::move(slice);
      timeline.lanes.clear();
      timeline.lanes_for = nullptr;
      timeline.hovered.reset();
      timeline.selected.reset();
      timeline.occurrences.clear();
      timeline.occurrence = -1;
      timeline.find_done.clear();
    }
  if (second && second->windowed())
    if (auto slice = second->window->take()) {
      second = std::move(slice);
      timeline.second_lanes.clear();
      timeline.second_for = nullptr;
    }
  if (model && model->ready() && !loader_) {
    ensure_tuner();
    if (options_.comparison && !comparison_opened_) {
      comparison_opened_ = true;
      open_stored_comparison(*options_.comparison);
    }
  }
  poll_tuner();
}

void App::frame() {
  poll_loaders();
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  ImGuiWindowFlags flags = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize |
                           ImGuiWindowFlags_MenuBar | ImGuiWindowFlags_NoBringToFrontOnFocus |
                           ImGuiWindowFlags_NoSavedSettings;
  ImGui::PushStyleVar(ImGuiStyleVar_WindowRounding, 0.0f);
  ImGui::PushStyleVar(ImGuiStyleVar_WindowBorderSize, 0.0f);
  ImGui::Begin("wb-view", nullptr, flags);
  ImGui::PopStyleVar(2);
  draw_menu();
  const float status_h = ImGui::GetFrameHeightWithSpacing() + 4.0f;
  ImGui::BeginChild("##content", ImVec2(0, -status_h), false, ImGuiWindowFlags_NoScrollbar);
  if (ImGui::BeginTabBar("##views")) {
    for (ViewId v : kAllViews) {
      ImGuiTabItemFlags tf = (force_tab && v == current) ? ImGuiTabItemFlags_SetSelected : 0;
      if (ImGui::BeginTabItem(view_title(v), nullptr, tf)) {
        if (!force_tab) current = v;
        ImGui::BeginChild("##view", ImVec2(0, 0), false, ImGuiWindowFlags_NoScrollbar);
        const bool needs_analyses = v != ViewId::timeline && v != ViewId::precision;
        if ((!model && v != ViewId::precision) || (model && !model->ready() && needs_analyses)) {
          draw_loading();
        } else if (model && model->windowed() && needs_analyses) {
          draw_sampled(v);
        } else {
          draw_view(v);
        }
        ImGui::EndChild();
        ImGui::EndTabItem();
      }
    }
    ImGui::EndTabBar();
  }
  force_tab = false;
  ImGui::EndChild();
  draw_status_bar(status_h);
  draw_file_browser();
  draw_error_popup();
  ImGui::End();
}

void App::draw_view(ViewId v) {
  switch (v) {
    case ViewId::overview: draw_overview(*this); break;
    case ViewId::timeline: draw_timeline(*this); break;
    case ViewId::ops: draw_ops(*this); break;
    case ViewId::queue: draw_queue(*this); break;
    case ViewId::allreduce: draw_allreduce(*this); break;
    case ViewId::precision: draw_precision(*this); break;
    case ViewId::memory: draw_memory(*this); break;
  }
}

// A windowed run's analysis views draw the analyses of its sample of steps (TimelineWindow::sample) under
// a line that says which steps they cover; until those are ready, or when there are none, a note says why.
void App::draw_sampled(ViewId v) {
  auto sample = model->window->sample();
  if (!sample || !sample->sample) {
    draw_windowed_note(model->window->sample_status());
    return;
  }
  const auto& s = *sample->sample;
  ImGui::TextColored(to_vec4(color::kDim),
                     "Steps %d-%d only (%d of %d steps, %s of %s ranges and kernels): the run opened windowed. Every "
                     "step: wb report %s",
                     s.first_step, s.last_step, s.steps, s.run_steps, fmt_num(static_cast<double>(s.rows), 3).c_str(),
                     fmt_num(static_cast<double>(s.run_rows), 3).c_str(), model->run.path.string().c_str());
  // The views read app.model: the sample's for the time of this view.
  auto whole = std::exchange(model, std::move(sample));
  draw_view(v);
  model = std::move(whole);
}

void App::draw_windowed_note(const std::string& status) {
  ImGui::TextWrapped("%s has %s ranges and kernels: it opened windowed, so the Timeline reads only the rows it draws "
                     "and memory stays bounded. This view shows the analyses of a sample of its steps.",
                     model->title().c_str(), fmt_num(static_cast<double>(model->range_count + model->kernel_count), 3).c_str());
  ImGui::Spacing();
  ImGui::TextUnformatted(status.empty() ? "Analysing a sample of steps ..." : status.c_str());
  ImGui::TextColored(to_vec4(color::kDim), "For every step: wb report %s   (or reopen with wb-view --full %s)",
                     model->run.path.string().c_str(), model->run.path.string().c_str());
}

void App::draw_loading() {
  ImVec2 avail = ImGui::GetContentRegionAvail();
  ImGui::SetCursorPos(ImVec2(avail.x * 0.3f, avail.y * 0.4f));
  ImGui::BeginGroup();
  if (loader_) {
    ImGui::Text("Loading %s%s", loader_->path().filename().string().c_str(),
                loader_published_ ? "  (the Timeline is ready; this view waits for the analyses)" : "");
    ImGui::ProgressBar(static_cast<float>(loader_->fraction()), ImVec2(avail.x * 0.4f, 0), loader_->stage().c_str());
  } else {
    ImGui::TextUnformatted("No run open.");
    ImGui::TextColored(to_vec4(color::kDim), "File > Open run... (Ctrl+O), or start wb-view RUN.sqlite");
    if (ImGui::Button("Open run...")) {
      browse_ = BrowseTarget::run;
      browse_open_request_ = true;
    }
    if (!recent_.empty()) {
      ImGui::Spacing();
      ImGui::TextColored(to_vec4(color::kDim), "Recent");
      for (const auto& r : recent_)
        if (ImGui::Selectable(r.c_str())) open(r);
    }
  }
  ImGui::EndGroup();
}

void App::draw_menu() {
  // ImGui 1.86 indexes KeysDown by the backend's key codes; GLFW's letter keys are their ASCII codes.
  if (ImGui::GetIO().KeyCtrl && ImGui::IsKeyPressed('O', false)) {
    browse_ = BrowseTarget::run;
    browse_open_request_ = true;
  }
  if (!ImGui::BeginMenuBar()) return;
  if (ImGui::BeginMenu("File")) {
    if (ImGui::MenuItem("Open run...", "Ctrl+O")) {
      browse_ = BrowseTarget::run;
      browse_open_request_ = true;
    }
    if (ImGui::MenuItem("Open second run to compare...", nullptr, false, model != nullptr)) {
      browse_ = BrowseTarget::second;
      browse_open_request_ = true;
    }
    if (ImGui::MenuItem("Compare with reference dump...", nullptr, false, model != nullptr)) {
      browse_ = BrowseTarget::reference;
      browse_open_request_ = true;
    }
    if (ImGui::BeginMenu("Open recent", !recent_.empty())) {
      for (const auto& r : recent_)
        if (ImGui::MenuItem(r.c_str())) open(r);
      ImGui::EndMenu();
    }
    if (second && ImGui::MenuItem("Close second run")) set_second(nullptr);
    ImGui::EndMenu();
  }
  if (ImGui::BeginMenu("View")) {
    for (ViewId v : kAllViews)
      if (ImGui::MenuItem(view_title(v), nullptr, current == v)) show_view(v);
    ImGui::EndMenu();
  }
  ImGui::EndMenuBar();
}

void App::draw_status_bar(float height) {
  ImGui::Separator();
  ImGui::BeginChild("##status", ImVec2(0, height - 6.0f), false, ImGuiWindowFlags_NoScrollbar);
  if (model) {
    const auto& run = model->run;
    if (status_for_.lock() != model) {  // counted once per model: a long run has hundreds of thousands of rows
      status_for_ = model;
      status_ranks_ = static_cast<int>(run.rank_ids().size());
      status_steps_ = 0;
      for (const auto& s : model->steps()) status_steps_ = std::max(status_steps_, s.step + 1);
    }
    const int ranks = status_ranks_, steps = status_steps_;
    ImGui::TextColored(to_vec4(color::kAccent), "%s", model->title().c_str());
    ImGui::SameLine(0, 16);
    ImGui::Text("ranks %d   device %s   steps %d   events %lld   (%lld ranges, %lld kernels, %lld counters)", ranks,
                model->device.c_str(), steps, static_cast<long long>(model->event_count()),
                static_cast<long long>(model->range_count), static_cast<long long>(model->kernel_count),
                static_cast<long long>(model->counter_count));
    if (!run.complete()) {
      ImGui::SameLine(0, 16);
      ImGui::TextColored(to_vec4(color::kWarn), "incomplete run");
    }
    if (second) {
      ImGui::SameLine(0, 16);
      ImGui::TextColored(to_vec4(color::kDim), "| compared with %s", second->title().c_str());
    }
  } else if (!loader_) {
    ImGui::TextColored(to_vec4(color::kDim), "no run open");
  }
  auto progress = [&](const RunLoader& l) {
    ImGui::SameLine(ImGui::GetWindowWidth() - 380);
    ImGui::ProgressBar(static_cast<float>(l.fraction()), ImVec2(360, 0),
                       (l.path().filename().string() + ": " + l.stage()).c_str());
  };
  if (loader_) progress(*loader_);
  else if (second_loader_) progress(*second_loader_);
  else if (precision.loader) {
    ImGui::SameLine(ImGui::GetWindowWidth() - 380);
    ImGui::ProgressBar(-1.0f * static_cast<float>(ImGui::GetTime()), ImVec2(360, 0), precision.loader->stage().c_str());
  }
  ImGui::EndChild();
}

void App::draw_file_browser() {
  if (browse_open_request_) {
    ImGui::OpenPopup("Open file");
    browse_open_request_ = false;
    browse_dirty_ = true;
    browse_path_[0] = 0;
  }
  ImGui::SetNextWindowSize(ImVec2(820, 520), ImGuiCond_Appearing);
  if (!ImGui::BeginPopupModal("Open file", nullptr, ImGuiWindowFlags_NoSavedSettings)) return;
  const bool reference = browse_ == BrowseTarget::reference;
  const std::vector<std::string> exts =
      reference ? std::vector<std::string>{".sqlite", ".safetensors", ".npz", ".npy"} : std::vector<std::string>{".sqlite"};
  if (browse_dirty_) {
    browse_entries_ = list_directory(browse_dir_, exts);
    browse_dirty_ = false;
  }
  ImGui::TextColored(to_vec4(color::kDim), "%s",
                     browse_ == BrowseTarget::run ? "Open a run file" :
                     browse_ == BrowseTarget::second ? "Open a second run to compare with" :
                     "Reference dump: .safetensors, .npz, .npy, a directory of .npy, or a run file");
  ImGui::Text("%s", browse_dir_.string().c_str());
  ImGui::BeginChild("##recent", ImVec2(260, -ImGui::GetFrameHeightWithSpacing() * 2), true);
  ImGui::TextColored(to_vec4(color::kAccent), "Recent files");
  for (const auto& r : recent_)
    if (ImGui::Selectable(std::filesystem::path(r).filename().string().c_str(), false, 0)) {
      std::snprintf(browse_path_, sizeof browse_path_, "%s", r.c_str());
    } else if (ImGui::IsItemHovered()) {
      ImGui::SetTooltip("%s", r.c_str());
    }
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("##entries", ImVec2(0, -ImGui::GetFrameHeightWithSpacing() * 2), true);
  if (ImGui::Selectable("..", false, ImGuiSelectableFlags_AllowDoubleClick) && browse_dir_.has_parent_path()) {
    browse_dir_ = browse_dir_.parent_path();
    browse_dirty_ = true;
  }
  ImGuiListClipper clipper;
  clipper.Begin(static_cast<int>(browse_entries_.size()));
  std::optional<std::filesystem::path> enter;
  while (clipper.Step()) {
    for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
      const auto& e = browse_entries_[static_cast<std::size_t>(i)];
      std::string label = e.is_dir ? "[dir] " + e.name : e.name;
      if (ImGui::Selectable(label.c_str(), false, ImGuiSelectableFlags_AllowDoubleClick)) {
        auto p = browse_dir_ / e.name;
        if (e.is_dir && !reference) enter = p;
        else std::snprintf(browse_path_, sizeof browse_path_, "%s", p.string().c_str());
        if (e.is_dir && reference && ImGui::IsMouseDoubleClicked(0)) enter = p;
      }
      if (!e.is_dir) {
        ImGui::SameLine(ImGui::GetWindowWidth() - 110);
        ImGui::TextColored(to_vec4(color::kDim), "%s", fmt_bytes(static_cast<double>(e.size)).c_str());
      }
    }
  }
  ImGui::EndChild();
  if (enter) {
    browse_dir_ = *enter;
    browse_dirty_ = true;
  }
  ImGui::SetNextItemWidth(-200);
  ImGui::InputText("##path", browse_path_, sizeof browse_path_);
  ImGui::SameLine();
  bool ok = ImGui::Button("Open", ImVec2(90, 0));
  ImGui::SameLine();
  if (ImGui::Button("Cancel", ImVec2(90, 0))) {
    browse_ = BrowseTarget::none;
    ImGui::CloseCurrentPopup();
  }
  if (ok && browse_path_[0]) {
    std::filesystem::path p(browse_path_);
    if (browse_ == BrowseTarget::run) open(p);
    else if (browse_ == BrowseTarget::second) open_second(p);
    else if (browse_ == BrowseTarget::reference) {
      open_reference(p);
      show_view(ViewId::precision);
    }
    browse_ = BrowseTarget::none;
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

void App::draw_error_popup() {
  if (error_popup_open_) {
    ImGui::OpenPopup("Cannot open");
    error_popup_open_ = false;
  }
  ImGui::SetNextWindowSize(ImVec2(640, 0), ImGuiCond_Appearing);
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(ImVec2(vp->WorkPos.x + vp->WorkSize.x * 0.5f, vp->WorkPos.y + vp->WorkSize.y * 0.4f),
                          ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (ImGui::BeginPopupModal("Cannot open", nullptr, ImGuiWindowFlags_NoSavedSettings)) {
    ImGui::PushStyleColor(ImGuiCol_Text, to_vec4(color::kBad));
    ImGui::TextUnformatted(error_title_.c_str());
    ImGui::PopStyleColor();
    ImGui::Separator();
    ImGui::PushTextWrapPos(ImGui::GetContentRegionAvail().x);
    ImGui::TextUnformatted(error_.c_str());
    ImGui::PopTextWrapPos();
    ImGui::Spacing();
    if (error_title_ == "The file could not be opened")
      ImGui::TextColored(to_vec4(color::kDim), "A run file is written by wb-train --run OUT.sqlite (schema version 1).");
    if (ImGui::Button("OK", ImVec2(120, 0))) {
      error_.clear();
      ImGui::CloseCurrentPopup();
    }
    ImGui::EndPopup();
  }
}

}  // namespace wb::view
