// What the views show of one run file, loaded once on a background thread: the run's rows
// (analysis::RunData, read by analysis::load_run), per-depth timeline levels, and every analysis the
// views need (step breakdown, op statistics, input starvation, allreduce overlap, warnings, the split
// model). Immutable once published, so views read it without locks.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/model/timeline_logic.hpp"
#include "app/model/timeline_window.hpp"
#include "profiler/analysis/allreduce.hpp"
#include "profiler/analysis/critical_path.hpp"
#include "profiler/analysis/hta.hpp"
#include "profiler/analysis/memory.hpp"
#include "profiler/analysis/op_stats.hpp"
#include "profiler/analysis/pipeline.hpp"
#include "profiler/analysis/report.hpp"
#include "profiler/analysis/run_data.hpp"
#include "profiler/analysis/tb_overview.hpp"
#include "profiler/analysis/split_model.hpp"
#include "profiler/analysis/steps.hpp"
#include "profiler/analysis/stragglers.hpp"

namespace wb::app_model {

// Loading publishes the model twice: once the rows are read and the timeline levels built (the timeline
// can draw), and again when the analyses are done. Fields below `analysed` are written by the loader
// thread in between and may be read only once ready() is true.
struct RunModel {
  analysis::RunData run;
  std::map<std::uint32_t, std::vector<Level>> levels;  // thread and stream tracks
  std::int64_t t_min_ns = 0;  // the extent of everything recorded
  std::int64_t t_max_ns = 0;
  std::int64_t range_count = 0;
  std::int64_t kernel_count = 0;
  std::int64_t counter_count = 0;
  std::string device;   // meta.device or the first rank's device
  int queue_capacity = 0;  // config.prefetch, 0 when unknown

  std::atomic<bool> analysed{false};
  bool ready() const { return analysed.load(std::memory_order_acquire); }

  std::vector<analysis::StepBreakdown> breakdown;
  analysis::OpStats ops;
  analysis::Starvation starvation;
  analysis::OpStats producer_ops;  // ranges on data-worker threads: the cost of each transform
  std::vector<analysis::StepComm> comms;
  std::vector<analysis::Warning> warnings;
  std::vector<analysis::Straggler> stragglers;
  analysis::StragglerAnalysis straggle;  // per step the last rank and every rank's wait for it
  analysis::MemoryAnalysis memory;       // per rank and step the peak and what holds it
  std::optional<analysis::Overview> tb;  // the TensorBoard plugin's Overview: runs with device rows only
  std::vector<analysis::HtaRank> hta;    // HTA's analyses per rank with device rows
  std::optional<analysis::SplitModel> split_model;
  std::string split_model_error;  // why there is none
  std::optional<analysis::PipelineAnalysis> pipeline;  // pipeline runs only
  std::optional<analysis::PipelinePlanInfo> pipeline_plan;  // known as soon as the file is open
  std::vector<store::ComparisonRow> comparisons;
  analysis::CriticalPath critical;          // the critical path across ranks (data-parallel runs)
  std::map<int, std::uint32_t> main_tracks;  // rank -> the thread track of its training loop
  // A run opened windowed (too large to hold, or --windowed): `run` holds no host ranges, kernels or
  // memory events but those of one time window, [rows_t0_ns, rows_t1_ns] (empty before the first read),
  // the timeline draws the rest from the window's summary, and the analyses are not run.
  std::shared_ptr<TimelineWindow> window;
  std::int64_t rows_t0_ns = 0;
  std::int64_t rows_t1_ns = -1;
  bool windowed() const { return window != nullptr; }
  // The model of a windowed run's analyses (TimelineWindow::sample): the rows of consecutive steps only,
  // analysed as a whole run is; these are the steps it covers, of how many the run has, and what it read.
  struct Sample {
    int first_step = 0, last_step = 0;
    int steps = 0;      // steps sampled (the step numbers in [first_step, last_step] that some rank has)
    int run_steps = 0;  // steps in the whole run
    std::int64_t rows = 0;      // ranges and kernels read
    std::int64_t run_rows = 0;  // ranges and kernels in the whole run
    double seconds = 0.0;       // reading and analysing them
  };
  std::optional<Sample> sample;
  // A window's model shares the run's step, collective and counter rows (which grow with its length)
  // with the model every window starts from, TimelineWindow's lean one, instead of copying them per
  // window: `tables` is that model, null for any other. Read those rows through these three.
  std::shared_ptr<const RunModel> tables;
  const std::vector<store::StepRow>& steps() const { return tables ? tables->run.steps : run.steps; }
  const std::vector<store::AllreduceRow>& allreduces() const {
    return tables ? tables->run.allreduces : run.allreduces;
  }
  const std::map<std::uint32_t, std::vector<store::CounterRow>>& counters() const {
    return tables ? tables->run.counters : run.counters;
  }
  double open_seconds = 0.0;      // rows read and levels built: the timeline can draw
  double analysis_seconds = 0.0;  // the analyses after that

  std::string title() const;  // the file name
  std::int64_t event_count() const { return range_count + kernel_count + counter_count; }
  // Durations of every host range with this name and category, ascending.
  std::vector<std::int64_t> durations(std::uint32_t name, store::Category category) const;
  // The string id of a name, or nullopt.
  std::optional<std::uint32_t> find_name(std::string_view text) const;
};

// A model with `from`'s run minus its host ranges, kernels and memory events, its extent and the facts
// known at open (device, queue capacity, pipeline plan, counts), without levels or analyses. Its step,
// collective and counter rows are `from`'s, shared (RunModel::tables), not copied.
std::shared_ptr<RunModel> copy_without_rows(const std::shared_ptr<const RunModel>& from);

// How a run opens: every row in memory (full), or window by window from its summary (windowed; see
// TimelineWindow). automatic picks windowed for runs of more than kWindowedEvents ranges and kernels.
enum class OpenMode { automatic, full, windowed };
inline constexpr std::int64_t kWindowedEvents = 20'000'000;
// A windowed open analyses consecutive steps from the middle of the run, as many as hold about this many
// ranges and kernels by the summary's estimate (at most 64 steps).
inline constexpr std::int64_t kSampleRows = 2'000'000;

// The allocator's settings for the viewer: blocks up to 256 MiB come from the heap, and freed memory
// stays there, so that each window a windowed run reads (its steps, collectives and queue samples, tens of
// MB on a long run) reuses the memory of the window before instead of faulting in fresh pages. Call once
// at start.
void tune_allocator_for_viewer();

// Shared between a loader thread and the UI.
struct LoadProgress {
  std::atomic<double> fraction{0.0};
  std::atomic<bool> cancel{false};
  mutable std::mutex mutex;
  std::string stage;
  void set_stage(std::string text);
  std::string get_stage() const;
};

// Reads and analyses a run file. Throws store::StoreError for a missing, foreign, truncated or
// other-version file (the message names the file), analysis::AnalysisError for unusable contents.
// on_open, when given, receives the model as soon as the timeline can draw (before the analyses).
// A file without the summary a windowed open needs gets it built once, with progress, and saved in the
// file; a file that cannot take it (read-only, or of an older schema) opens in full instead.
std::shared_ptr<const RunModel> load_run_model(const std::filesystem::path& path, LoadProgress* progress = nullptr,
                                               const std::function<void(std::shared_ptr<const RunModel>)>& on_open = {},
                                               OpenMode mode = OpenMode::automatic,
                                               std::int64_t sample_rows = kSampleRows);

// One load on a background thread.
class RunLoader {
 public:
  explicit RunLoader(std::filesystem::path path, OpenMode mode = OpenMode::automatic);
  ~RunLoader();  // cancels and joins
  RunLoader(const RunLoader&) = delete;
  RunLoader& operator=(const RunLoader&) = delete;

  bool done() const { return done_.load(); }
  double fraction() const { return progress_.fraction.load(); }
  std::string stage() const { return progress_.get_stage(); }
  const std::filesystem::path& path() const { return path_; }
  // The model once the timeline can draw (its analyses may still be running), else null.
  std::shared_ptr<const RunModel> opened() const;
  // After done(): the model, or the error message.
  std::shared_ptr<const RunModel> result() const;
  std::string error() const;

 private:
  std::filesystem::path path_;
  LoadProgress progress_;
  std::atomic<bool> done_{false};
  mutable std::mutex mutex_;
  std::shared_ptr<const RunModel> opened_;
  std::shared_ptr<const RunModel> result_;
  std::string error_;
  std::thread thread_;
};

}  // namespace wb::app_model
