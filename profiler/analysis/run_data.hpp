// Everything the analyses read from a run file, loaded once (by `wb` and by wb-view alike). The analyses
// are pure functions over this struct (or over plain row vectors), so tests can hand-build runs with
// known answers.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/rows.hpp"

namespace wb::store {
class Reader;
}

namespace wb::analysis {

// Bad input to an analysis (an invalid split, a run without the rows an analysis needs).
class AnalysisError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct RunData {
  std::filesystem::path path;
  std::map<std::string, std::string> meta;
  nlohmann::json config = nlohmann::json::object();
  std::vector<std::string> strings;
  std::vector<store::RankRow> ranks;
  std::vector<store::TrackRow> tracks;
  std::map<std::uint32_t, std::vector<store::RangeRow>> ranges;      // thread tracks, by start
  std::map<std::uint32_t, std::vector<store::CounterRow>> counters;  // queue tracks, by time
  std::vector<store::StepRow> steps;
  std::vector<store::AllreduceRow> allreduces;
  std::vector<store::ParamRow> params;
  std::vector<store::EvaluationRow> evaluations;  // wb-train --eval results
  std::vector<store::CaptureWindowRow> capture_windows;  // wb-train --capture: the steps whose events were kept
  std::vector<store::CommCalibrationRow> calibration;  // the communicator's calibration (comm_calibration)
  std::vector<store::SplitTrialRow> split_trials;      // wb tune-split's trials
  std::vector<store::PipelineSpanRow> pipeline_spans;  // pipeline runs only
  std::vector<store::PipelineStepRow> pipeline_steps;
  std::vector<store::MemoryRow> memory;  // allocations and frees, by rank then time (memory.hpp)
  std::map<std::uint32_t, std::vector<store::KernelRow>> kernels;    // stream tracks, by start
  std::int64_t kernel_rows = 0;

  const std::string& name(std::uint32_t id) const;
  const store::TrackRow* track(std::uint32_t id) const;
  std::vector<int> rank_ids() const;  // ranks with any data, ascending
  // The thread track of a rank that runs the training loop: the one with the most step ranges, else
  // the one named "main", else the one with the most ranges; 0 when the rank has no thread track.
  std::uint32_t main_track(int rank) const;
  // Ranges of a track (empty when none).
  const std::vector<store::RangeRow>& ranges_of(std::uint32_t track) const;
  // Total events dropped over all ranks.
  std::int64_t dropped_events() const;
  bool complete() const;
};

// Thrown by load_run when LoadOptions::cancel is raised; the message names the file.
class LoadCancelled : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How load_run reads a big run (wb-view opens millions of rows). The range and kernel rows, nearly all of
// the work, can be read by several threads, each with its own connection to the file.
struct LoadOptions {
  unsigned threads = 1;
  // Range and kernel rows read so far and their total, called as they come in: from every reading
  // thread, so it must be safe to call concurrently.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
  // Polled between tracks: once it holds true, load_run stops and throws LoadCancelled.
  const std::atomic<bool>* cancel = nullptr;
  // false: leave out the rows that grow with the run's length (host ranges, kernels, memory events), for
  // a viewer that reads the timeline window by window (app_model::TimelineWindow). kernel_rows is 0.
  bool events = true;
};

// Every row the analyses read. Throws store::StoreError for a bad file (the message names it).
RunData load_run(store::Reader& reader, const LoadOptions& options = {});
RunData load_run(const std::filesystem::path& path, const LoadOptions& options = {});

// Concatenates text pieces. (Also sidesteps GCC 12's false -Wrestrict on `"literal" + std::string&&`.)
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

// The ranges of one track (by start, as RunData holds them) that overlap a time window, found without a
// scan of the track, so that a per-step analysis costs the step's rows, not the run's: those no longer
// than `short_ns` (say, the longest step) by a binary search on their start, the few longer ones (a range
// around the whole run) kept apart. The rows must outlive it.
class OverlapFinder {
 public:
  OverlapFinder(const std::vector<store::RangeRow>& rows, std::int64_t short_ns);
  // f(row) for every row with end > t0 and start < t1: the short ones by start, then the long ones.
  template <class F>
  void each(std::int64_t t0, std::int64_t t1, F&& f) const {
    for (std::size_t i = first_start_after(t0 - short_ns_); i < rows_->size() && (*rows_)[i].start_ns < t1; ++i) {
      const auto& r = (*rows_)[i];
      if (r.end_ns - r.start_ns <= short_ns_ && r.end_ns > t0) f(r);
    }
    for (std::size_t i : long_) {
      const auto& r = (*rows_)[i];
      if (r.end_ns > t0 && r.start_ns < t1) f(r);
    }
  }

 private:
  std::size_t first_start_after(std::int64_t t) const;  // the first row starting after t
  const std::vector<store::RangeRow>* rows_;
  std::int64_t short_ns_;
  std::vector<std::size_t> long_;
};

// Each rank's step rows by number, and the rows of its main track that overlap a time window, found by
// OverlapFinder (built per rank on first use), so that a per-step analysis costs the step's rows, not the
// run's. The run must outlive it.
class StepIndex {
 public:
  explicit StepIndex(const RunData& run);
  // The step row of a rank's step (the last one, should there be several), or null.
  const store::StepRow* step_row(int rank, int step) const;
  // The rank's main track's rows (RunData::main_track, found once per rank).
  const std::vector<store::RangeRow>& main_rows(int rank);
  // f(row) for every row of the rank's main track with end > t0 and start < t1.
  template <class F>
  void each(int rank, std::int64_t t0, std::int64_t t1, F&& f) {
    finder(rank).each(t0, t1, std::forward<F>(f));
  }

 private:
  const OverlapFinder& finder(int rank);
  const RunData& run_;
  std::map<std::pair<int, int>, const store::StepRow*> rows_;
  std::int64_t longest_ = 0;
  std::map<int, std::uint32_t> main_;
  std::map<int, OverlapFinder> finders_;
};

// Length of the union of [start, end) intervals, clipped to [lo, hi).
std::int64_t union_length(std::vector<std::pair<std::int64_t, std::int64_t>> intervals, std::int64_t lo,
                          std::int64_t hi);

}  // namespace wb::analysis
