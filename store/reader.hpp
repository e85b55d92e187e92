// Read access to a run file, validated on open (open_run). Every query has an index behind it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/rows.hpp"

namespace wb::store {

class Db;

// Called during long reads with rows loaded so far and the expected total (0 when unknown).
using ProgressFn = std::function<void(std::uint64_t done, std::uint64_t total)>;

class Reader {
 public:
  explicit Reader(const std::filesystem::path& path);  // throws StoreError (see open_run)
  ~Reader();
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;

  const std::filesystem::path& path() const;

  std::map<std::string, std::string> meta();
  // meta.config_json parsed; an empty object when absent. Throws StoreError on malformed JSON.
  nlohmann::json config();
  bool complete();
  int world_size();  // meta.world_size, 1 when absent

  std::vector<RankRow> ranks();
  std::vector<TrackRow> tracks();
  // Interned strings indexed by id; ids never written are empty strings.
  const std::vector<std::string>& strings();
  // The text of one id; throws StoreError for an unknown id.
  const std::string& string_at(std::uint32_t id);

  // All ranges of a track, ordered by start_ns, an enclosing range (lower depth) first on ties.
  std::vector<RangeRow> ranges(std::uint32_t track, const ProgressFn& progress = {});
  // Ranges of a track that overlap [t0_ns, t1_ns], in the same order.
  std::vector<RangeRow> ranges(std::uint32_t track, std::int64_t t0_ns, std::int64_t t1_ns);
  // The ranges of a track that start at start_ns.
  std::vector<RangeRow> ranges_starting(std::uint32_t track, std::int64_t start_ns);
  // The longest range (or kernel) of a track, when known (store::SummaryTrack::longest_ns): the window
  // reads below then skip the scan of the whole track that finds it.
  void known_longest(std::uint32_t track, std::int64_t range_ns, std::int64_t kernel_ns);
  std::vector<KernelRow> kernels(std::uint32_t track, const ProgressFn& progress = {});
  std::vector<KernelRow> kernels(std::uint32_t track, std::int64_t t0_ns, std::int64_t t1_ns);
  // Kernels launched by one host range (same corr_id).
  std::vector<KernelRow> kernels_by_corr(std::uint64_t corr_id);
  std::vector<CounterRow> counters(std::uint32_t track);
  std::vector<StepRow> steps(std::optional<std::int32_t> rank = std::nullopt);
  std::vector<AllreduceRow> allreduces(std::optional<std::int32_t> rank = std::nullopt);
  // Pipeline runs only; empty for other runs and for files from before pipelines were recorded.
  std::vector<PipelineSpanRow> pipeline_spans();
  std::vector<PipelineStepRow> pipeline_steps();
  std::vector<ParamRow> params();
  // Memory events by rank, in time order; none for runs recorded without them or before the table existed.
  std::vector<MemoryRow> memory(std::optional<std::int32_t> rank = std::nullopt);
  // The memory events of each rank in its own window [t0, t1], by rank then time (one scan: the table has
  // no time index).
  std::vector<MemoryRow> memory_between(const std::map<int, std::pair<std::int64_t, std::int64_t>>& windows);
  // What each rank holds before its t0, as rows at t0 - 1 that replay to the same state: per (name, role)
  // the net bytes of its events before t0, each row with the live bytes of the last event before t0, the
  // last allocation before t0 replayed last (taken out of its row, then added again with its step). None
  // for a rank with no event before its t0. By rank; one scan of the table (it has no time index).
  std::vector<MemoryRow> memory_before(const std::map<int, std::int64_t>& t0_by_rank);

  // Tensor metadata (no data), ordered by source, step, rank, exec_order.
  std::vector<TensorInfo> tensors(std::optional<std::string_view> source = std::nullopt);
  // One tensor with its data. Throws StoreError when absent.
  TensorRow tensor(std::string_view source, std::string_view kind, std::string_view name, std::int32_t step,
                   std::int32_t rank);
  // Same, without the kind: throws StoreError when absent or when the name exists under several kinds.
  TensorRow tensor(std::string_view source, std::string_view name, std::int32_t step, std::int32_t rank);

  // Rows per table, for every table of the schema.
  std::map<std::string, std::int64_t> row_counts();

  std::vector<ComparisonRow> comparisons();
  // Evaluations in the order they were recorded; none for files that predate the evaluation table.
  std::vector<EvaluationRow> evaluations();
  // Triggered capture's windows by rank and first step; none for a full recording or an older file.
  std::vector<CaptureWindowRow> capture_windows();
  // The communicator's calibration by rank, kind and size; none for a run without one.
  std::vector<CommCalibrationRow> comm_calibrations();
  // wb tune-split's trials in the order they ran.
  std::vector<SplitTrialRow> split_trials();
  std::vector<ComparisonEntryRow> comparison_rows(std::int64_t comparison_id);

  // The connection, for queries this class does not offer.
  Db& db();

 private:
  std::unique_ptr<Db> db_;
  std::optional<std::vector<std::string>> strings_;
  std::map<std::uint32_t, std::int64_t> max_range_ns_;   // per track, for overlap queries
  std::optional<std::int64_t> time_origin_ns_;          // meta.time_origin_ns, read once
  std::int64_t time_origin_ns();
  std::map<std::uint32_t, std::int64_t> max_kernel_ns_;
};

}  // namespace wb::store
