// The App's actions that views trigger and scripted options replay without a mouse: the tuner's split
// and its re-run through wb-train (progress, new run opened, predicted against measured), a mouse drag
// of a split handle injected through ImGui's IO, stored comparisons reopened from the run file, and
// the plain-text figures that --print-tuner and --print-precision write.
#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <tuple>
#include <sstream>

#include <imgui.h>

#include "allreduce/split_points.hpp"
#include "app/model/tuner_logic.hpp"
#include "app/view/app.hpp"
#include "compare/stored_comparison.hpp"

namespace wb::view {

using app_model::ChildProcess;
using app_model::make_train_launch;
using app_model::PrecisionData;
using app_model::PrecisionLoader;
using app_model::RunModel;
using app_model::split_x;
using app_model::train_executable;

namespace {

std::string join(const std::vector<int>& v) { return allreduce::SplitPoints::format(v); }

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (a == b) return true;
  bool eq = std::filesystem::equivalent(a, b, ec);
  return !ec && eq;
}

// Frames of a scripted drag: hover, press, kDragSteps moves, release.
constexpr int kDragSteps = 8;

}  // namespace

bool App::ensure_tuner() {
  if (!model || !model->ready() || !model->split_model) return false;
  if (tuner.initialised) return true;
  const analysis::SplitModel& sm = *model->split_model;
  tuner.split = sm.current_split;
  tuner.compare_label = "the run's split";
  tuner.suggestions = analysis::suggest_splits(sm);
  tuner.initialised = true;
  if (options_.tuner_splits && !tuner_splits_applied_) {
    tuner_splits_applied_ = true;
    try {
      const auto want = allreduce::SplitPoints::from_points(*options_.tuner_splits, "--tuner-splits");
      want.validate(static_cast<int>(sm.size()), "--tuner-splits");
      tuner.split = want.points();
      tuner.compare_label = "--tuner-splits";
    } catch (const allreduce::SplitError& e) {
      show_error(e.what(), "Bad option");
      options_.tuner_run = false;
    }
  }
  return true;
}

void App::start_tuner_run() {
  if (!ensure_tuner()) return;
  if (tuner.job && tuner.job->running()) return;
  const RunModel& m = *model;
  const analysis::SplitModel& sm = *m.split_model;
  try {
    analysis::Prediction pred = analysis::predict(sm, tuner.split);
    auto exe = train_executable();
    auto dir = std::filesystem::temp_directory_path() / "wb-view-runs";
    std::string stem = m.run.path.stem().string() + "-split";
    for (int s : tuner.split) stem.append("-").append(std::to_string(s));
    tuner.launch = make_train_launch(m.run.config, static_cast<int>(m.run.rank_ids().size()), tuner.split, dir, stem);
    std::error_code ec;
    std::filesystem::remove(tuner.launch->run_path, ec);
    tuner.job_split = tuner.split;
    tuner.job = std::make_unique<ChildProcess>(exe, tuner.launch->args);
    tuner.job_error.clear();
    TunerState::Outcome o;
    o.split = tuner.split;
    o.predicted_step_ns = pred.step_ns;
    o.predicted_exposed_ns = pred.exposed_ns;
    o.run_path = tuner.launch->run_path;
    tuner.pending_outcome = o;
    tuner.outcome.reset();
  } catch (const std::exception& e) {
    tuner.job_error = e.what();
    tuner.launch.reset();
    tuner.pending_outcome.reset();
    show_error(tuner.job_error, "The re-run could not start");
  }
}

void App::start_tune_split() {
  if (!model || !model->ready() || (tuner.tune_job && tuner.tune_job->running())) return;
  try {
    std::filesystem::path exe = app_model::sibling_executable("wb");
    if (const char* env = std::getenv("WB_BIN"); env && *env) exe = env;
    if (access(exe.c_str(), X_OK) != 0)
      throw app_model::ChildError("wb not found: " + exe.string() + " (wb-view starts the wb next to it, or $WB_BIN)");
    tuner.tune_run = model->run.path;
    tuner.tune_job = std::make_unique<ChildProcess>(
        exe, std::vector<std::string>{"tune-split", tuner.tune_run.string(), "--candidates", std::to_string(tuner.try_candidates),
                                      "--rounds", std::to_string(tuner.try_rounds), "--steps", std::to_string(tuner.try_steps)});
  } catch (const std::exception& e) {
    tuner.tune_job.reset();
    show_error(e.what(), "wb tune-split could not start");
  }
}

void App::poll_tuner() {
  if (options_.tuner_try && !tuner_try_started_ && model && model->ready() && !loader_) {
    tuner_try_started_ = true;
    std::tie(tuner.try_candidates, tuner.try_rounds, tuner.try_steps) =
        std::tuple((*options_.tuner_try)[0], (*options_.tuner_try)[1], (*options_.tuner_try)[2]);
    start_tune_split();
  }
  if (tuner.tune_job && !tuner.tune_job->running()) {
    const int code = tuner.tune_job->exit_code().value_or(-1);
    if (code == 0) {
      open(tuner.tune_run);  // the trials are in the file now
    } else {
      auto lines = tuner.tune_job->lines();
      std::string tail;
      for (std::size_t i = lines.size() > 6 ? lines.size() - 6 : 0; i < lines.size(); ++i) tail.append("\n").append(lines[i]);
      show_error("wb tune-split exited with status " + std::to_string(code) + ":" + tail, "The trials failed");
    }
    tuner.tune_job.reset();
  }
  if (options_.tuner_run && !tuner_run_started_ && model && model->ready() && !loader_) {
    tuner_run_started_ = true;
    if (!model->split_model) show_error("--tuner-run: this run has no split model (" + model->split_model_error + ")", "The re-run could not start");
    else start_tuner_run();
  }
  if (tuner.pending_outcome && model && model->ready() && !loader_ && same_file(model->run.path, tuner.pending_outcome->run_path)) {
    // The re-run's file is open: its measured figures go next to the prediction.
    auto out = *tuner.pending_outcome;
    if (model->split_model) {
      out.measured_step_ns = model->split_model->measured_step_ns;
      out.measured_exposed_ns = model->split_model->measured_exposed_ns;
    }
    out.run = model->title();
    tuner.outcome = out;
    tuner.pending_outcome.reset();
  }
  if (tuner.job && !tuner.job->running() && tuner.launch) {
    const int code = tuner.job->exit_code().value_or(-1);
    if (code == 0) {
      open(tuner.launch->run_path);
    } else {
      // The last few lines name the cause (a bad config, a rank that died).
      auto lines = tuner.job->lines();
      std::string tail;
      for (std::size_t i = lines.size() > 4 ? lines.size() - 4 : 0; i < lines.size(); ++i) tail.append("\n").append(lines[i]);
      tuner.job_error = "wb-train exited with status " + std::to_string(code) + " (config " + tuner.launch->config_path.string() + "):" + tail;
      tuner.pending_outcome.reset();
      show_error(tuner.job_error, "The re-run failed");
    }
    tuner.launch.reset();
  }
}

void App::inject_input() {
  if (!options_.tuner_drag || drag_done_) return;
  if (!error_.empty()) {
    drag_done_ = true;
    return;
  }
  if (!tuner.initialised || !tuner.strip || current != ViewId::allreduce) return;
  const auto [from, to] = *options_.tuner_drag;
  const auto& g = *tuner.strip;
  if (drag_frame_ < 0) {
    if (std::find(tuner.split.begin(), tuner.split.end(), from) == tuner.split.end()) {
      show_error("--tuner-drag " + std::to_string(from) + ":" + std::to_string(to) + ": the split has no point " + std::to_string(from) +
                     " (split: " + join(tuner.split) + ")",
                 "Bad option");
      drag_done_ = true;
      return;
    }
    drag_frame_ = 0;
  }
  ImGuiIO& io = ImGui::GetIO();
  const float x_from = static_cast<float>(split_x(from, g.params, g.x0, g.width));
  const float x_to = static_cast<float>(split_x(std::clamp(to, 1, g.params - 1), g.params, g.x0, g.width));
  const int f = drag_frame_++;
  if (f == 0) {  // hover the handle
    io.MousePos = ImVec2(x_from, g.y_mid);
    io.MouseDown[0] = false;
  } else if (f == 1) {  // press on it
    io.MousePos = ImVec2(x_from, g.y_mid);
    io.MouseDown[0] = true;
  } else if (f < 2 + kDragSteps) {  // move in steps, as a hand would
    const float t = static_cast<float>(f - 1) / kDragSteps;
    io.MousePos = ImVec2(x_from + (x_to - x_from) * t, g.y_mid);
    io.MouseDown[0] = true;
  } else if (f == 2 + kDragSteps) {  // release over the target
    io.MousePos = ImVec2(x_to, g.y_mid);
    io.MouseDown[0] = false;
  } else {
    io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
    io.MouseDown[0] = false;
    drag_done_ = true;
  }
}

bool App::scripted_busy() const {
  if (tuner.job && tuner.job->running()) return true;
  if (tuner.tune_job) return true;
  if (options_.tuner_try && !tuner_try_started_ && error_.empty()) return true;
  if (tuner.launch || tuner.pending_outcome) return true;
  if (!error_.empty()) return false;  // a failed script stops here; the popup is the result
  if (options_.tuner_run && !tuner_run_started_) return true;
  if (options_.tuner_drag && !drag_done_) return true;
  if (options_.comparison && !comparison_opened_) return true;
  return false;
}

void App::open_stored_comparison(std::int64_t id) {
  if (!model) return;
  try {
    compare::StoredComparison stored = compare::read_stored_comparison(model->run.path, id);
    auto data = std::make_shared<PrecisionData>();
    data->a_path = stored.header.a_path;
    data->b_path = stored.header.b_path;
    data->comparison = std::move(stored.comparison);
    data->stored_id = id;
    data->stored_created = stored.header.created_utc;
    data->has_tensors = false;
    auto a = compare::locate_side(stored.header.a_path, model->run.path);
    auto b = compare::locate_side(stored.header.b_path, model->run.path);
    if (!a || !b) {
      data->tensors_note = (!b ? "The reference " + stored.header.b_path : "The compared side " + stored.header.a_path) +
                           " is no longer there: the table, verdicts and first divergence come from the run file; the histograms, "
                           "per-channel errors and heat map need its tensors.";
    } else {
      data->tensors_note = "Reading the tensors for the detail plots...";
    }
    precision.loader.reset();
    precision.error.clear();
    precision.detail.reset();
    precision.selected = -1;
    precision.data = data;
    if (a && b) precision.loader = std::make_unique<PrecisionLoader>(data, *a, *b);
  } catch (const std::exception& e) {
    show_error(e.what(), "The stored comparison could not be read");
  }
}

std::string App::tuner_report() const {
  std::ostringstream out;
  char buf[160];
  auto line = [&](const char* key, double ns) {
    std::snprintf(buf, sizeof buf, "%s %.6f\n", key, ns / 1e6);
    out << buf;
  };
  if (!model || !model->ready() || !model->split_model) {
    out << "tuner none\n";
    return out.str();
  }
  const analysis::SplitModel& sm = *model->split_model;
  out << "run " << model->run.path.string() << "\n";
  out << "split " << join(tuner.initialised ? tuner.split : sm.current_split) << "\n";
  out << "trials " << model->run.split_trials.size() << "\n";
  if (tuner.outcome) {
    const auto& o = *tuner.outcome;
    line("predicted step_ms", o.predicted_step_ns);
    line("predicted exposed_ms", o.predicted_exposed_ns);
    line("measured step_ms", o.measured_step_ns);
    line("measured exposed_ms", o.measured_exposed_ns);
    out << "child_run " << o.run_path.string() << "\n";
    out << "child_split " << join(o.split) << "\n";
  } else {
    try {
      analysis::Prediction p = analysis::predict(sm, tuner.initialised ? tuner.split : sm.current_split);
      line("predicted step_ms", p.step_ns);
      line("predicted exposed_ms", p.exposed_ns);
    } catch (const std::exception& e) {
      out << "predicted none (" << e.what() << ")\n";
    }
  }
  return out.str();
}

std::string App::precision_report() const {
  std::ostringstream out;
  if (!precision.data) {
    out << "comparison none\n";
    return out.str();
  }
  const auto& c = precision.data->comparison;
  out << "comparison " << (precision.data->stored_id ? std::to_string(*precision.data->stored_id) : std::string("computed")) << "\n";
  out << "rows " << c.rows.size() << "\n";
  out << "passed " << c.passed << "\nfailed " << c.failed << "\nmissing_a " << c.missing_a << "\nmissing_b " << c.missing_b << "\n";
  out << "first_divergence " << (c.first_divergence ? c.first_divergence->name : std::string("none")) << "\n";
  out << "tensors " << (precision.data->has_tensors ? "loaded" : "absent") << "\n";
  return out.str();
}

}  // namespace wb::view
