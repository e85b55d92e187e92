// Plain row structs of a run file, one per table. All times are int64 nanoseconds on rank 0's clock.
// Names are interned: a uint32 `name` is an id into the `string` table (Writer::intern, Reader::strings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wb::store {

// What a track is a timeline of. Stored as text in track.kind.
enum class TrackKind : std::uint8_t { thread, stream, queue, comm };
// The name suffix of a thread track that holds a thread's Python functions (imported with_stack traces):
// the op analyses leave such tracks out.
inline constexpr std::string_view kPythonTrackSuffix = " (python)";
// The name suffix of a queue track that counts a GPU stream's launched, not yet started work (imported
// traces: HTA's queue length), as opposed to a batch queue of the input pipeline. Its samples are not
// stored: they follow from the stream's kernels (launch_queue), and Reader::counters derives them.
inline constexpr std::string_view kLaunchQueueSuffix = " launch queue";

// Range categories, stored as their small integer code in range.category (schema.sql lists the codes).
enum class Category : std::uint8_t { forward = 0, backward = 1, optimizer = 2, loss = 3, data = 4, h2d = 5, comm = 6, step = 7 };
inline constexpr int kCategories = 8;  // category_name() names each; the one table of their names

// Device activity kinds, stored as their small integer code in kernel.kind.
enum class KernelKind : std::uint8_t { kernel = 0, memcpy = 1, memset = 2 };

// A host range: one operator (or step, data wait, ...) on one thread.
struct RangeRow {
  std::uint32_t track = 0;
  std::uint32_t name = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::uint8_t category = 0;  // a Category
  std::uint8_t depth = 0;     // nesting level on its track, 0 = outermost
  std::int32_t step = -1;     // training step, -1 when outside a step
  std::uint64_t corr_id = 0;  // correlates a host launch with its kernels, 0 = none
  bool operator==(const RangeRow&) const = default;
};

// One device activity (kernel, memcpy or memset) on a stream track.
struct KernelRow {
  std::uint32_t track = 0;
  std::uint32_t name = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::uint64_t corr_id = 0;
  std::uint8_t kind = 0;  // a KernelKind
  std::int32_t grid[3] = {0, 0, 0};
  std::int32_t block[3] = {0, 0, 0};
  std::int64_t bytes = 0;  // memcpy/memset size, 0 for kernels
  float blocks_per_sm = -1.0f;  // thread blocks per SM, -1 unknown (Kineto's "blocks per SM")
  float occupancy = -1.0f;      // estimated achieved occupancy 0..1, -1 unknown
  std::int64_t launch_ns = -1;      // start of the runtime call that launched it, -1 unknown
  std::int64_t launch_end_ns = -1;  // end of that call, -1 unknown
  bool operator==(const KernelRow&) const = default;
};

// A sampled value (queue depth at every push and pop) on a queue track.
struct CounterRow {
  std::uint32_t track = 0;
  std::int64_t t_ns = 0;
  double value = 0.0;
  bool operator==(const CounterRow&) const = default;
};

// One allocation (bytes > 0) or free (bytes < 0) of a rank's device or host tensor memory (memory).
// role: 0 activation, 1 gradient, 2 parameter, 3 momentum, 4 workspace, 5 data, 6 other.
struct MemoryRow {
  std::int32_t rank = 0;
  std::int64_t t_ns = 0;
  std::int32_t step = -1;
  std::int64_t bytes = 0;
  std::int64_t live_bytes = 0;
  std::uint8_t role = 6;
  std::uint32_t name = 0;
  bool operator==(const MemoryRow&) const = default;
};
inline constexpr int kMemoryRoles = 7;
// "activation", ..., "other"; "other" for codes out of range.
std::string_view memory_role_name(int role);

// One gradient bucket's allreduce: parameters [first_param, last_param] (inclusive), when its last
// gradient was ready, and when the collective ran.
struct AllreduceRow {
  std::int32_t rank = 0;
  std::int32_t step = 0;
  std::int32_t bucket = 0;
  std::int32_t first_param = 0;
  std::int32_t last_param = 0;
  std::int64_t bytes = 0;
  std::int64_t ready_ns = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  bool operator==(const AllreduceRow&) const = default;
};

// One training step on one rank.
struct StepRow {
  std::int32_t rank = 0;
  std::int32_t step = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t data_wait_ns = 0;     // time blocked on the batch queue
  std::int64_t comm_exposed_ns = 0;  // allreduce time not hidden behind backward
  double loss = 0.0;
  double lr = 0.0;
  std::int64_t images = 0;
  bool operator==(const StepRow&) const = default;
};

// One measurement of the communicator's calibration (schema.sql, comm_calibration).
struct CommCalibrationRow {
  std::int32_t rank = 0;
  std::string kind;        // allreduce, compute, compute_during_allreduce, allreduce_during_compute, compute_while_waiting
  std::int64_t bytes = 0;  // message size (0 for compute)
  std::int32_t reps = 0;
  std::int64_t median_ns = 0;
  std::int64_t min_ns = 0;
  bool operator==(const CommCalibrationRow&) const = default;
};

// One trial of an allreduce split (wb tune-split; schema.sql, split_trial).
struct SplitTrialRow {
  std::int32_t round = 0;
  std::string candidate;
  std::string split;
  std::int32_t steps = 0;
  std::int64_t median_step_ns = -1;
  std::int64_t predicted_step_ns = -1;
  std::int64_t alpha_beta_ns = -1;
  std::int32_t exit_code = 0;
  std::string run;
  std::string utc;
  bool operator==(const SplitTrialRow&) const = default;
};

// One evaluation of the model (wb-train --eval): accuracy over `images` held-out images, summed over
// every rank (rank 0 records it).
struct EvaluationRow {
  std::int32_t step = 0;   // training steps done before it
  double top1 = 0.0;       // percent
  double top5 = 0.0;       // percent
  std::int64_t images = 0;
  double seconds = 0.0;    // wall time of the evaluation
  bool operator==(const EvaluationRow&) const = default;
};

// A window of steps whose events a triggered capture kept (wb-train --capture; schema.sql,
// capture_window): steps first_step..last_step (inclusive) of one rank, and what triggered it.
struct CaptureWindowRow {
  std::int32_t rank = 0;
  std::int32_t first_step = 0;
  std::int32_t last_step = 0;
  std::string trigger;            // slow, signal or steps
  std::int32_t trigger_step = 0;  // the step that triggered it (steps: the window's first step)
  std::string detail;             // e.g. "412.0 ms, 9.8x the running median (42.1 ms)"
  bool operator==(const CaptureWindowRow&) const = default;
};

// Pipeline parallelism: one micro-batch's forward or backward on one stage, or one message between
// stages (schema.sql, pipeline_span).
struct PipelineSpanRow {
  std::int32_t rank = 0;
  std::int32_t step = 0;
  std::int32_t stage = 0;
  std::int32_t micro = 0;
  std::string kind;  // forward, backward, send_act, recv_act, send_grad, recv_grad
  std::int32_t peer = -1;
  std::int64_t bytes = 0;
  std::int64_t post_ns = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  bool operator==(const PipelineSpanRow&) const = default;
};

// Pipeline parallelism: one step of one stage, its busy time and its idle time by cause (pipeline_step).
struct PipelineStepRow {
  std::int32_t rank = 0;
  std::int32_t step = 0;
  std::int32_t stage = 0;
  std::int32_t replica = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t busy_ns = 0;
  std::int64_t wait_act_ns = 0;
  std::int64_t wait_grad_ns = 0;
  std::int64_t wait_allreduce_ns = 0;
  bool operator==(const PipelineStepRow&) const = default;
};

// One trainable parameter, in forward order.
struct ParamRow {
  std::int32_t idx = 0;
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::int32_t bucket = 0;
  bool decay = true;  // weight decay applies
  bool operator==(const ParamRow&) const = default;
};

// One dumped tensor. dtype spells like safetensors ("F32", "F64", "I32", "I64", ...); data is
// little-endian, C order.
struct TensorRow {
  std::string source = "run";  // "run" for our own dumps; other sources name where a tensor came from
  std::int32_t step = 0;
  std::int32_t rank = 0;
  std::string kind;  // input, label, param, buffer, act, loss, grad, param_after, buffer_after, momentum
  std::string name;
  std::int32_t exec_order = 0;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
  bool operator==(const TensorRow&) const = default;
};

// Tensor metadata without its data (Reader::tensors).
struct TensorInfo {
  std::string source;
  std::int32_t step = 0;
  std::int32_t rank = 0;
  std::string kind;
  std::string name;
  std::int32_t exec_order = 0;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::int64_t bytes = 0;
  bool operator==(const TensorInfo&) const = default;
};

// One process of the job.
struct RankRow {
  std::int32_t rank = 0;
  std::string host;
  std::string device;
  std::int64_t pid = 0;
  std::int64_t clock_offset_ns = 0;      // offset to rank 0's clock measured at start
  std::int64_t clock_offset_end_ns = 0;  // and at the end, to show drift
  std::int64_t dropped_events = 0;
  bool operator==(const RankRow&) const = default;
};

// A timeline track (Reader::tracks).
struct TrackRow {
  std::uint32_t id = 0;
  std::int32_t rank = 0;
  TrackKind kind = TrackKind::thread;
  std::uint32_t name = 0;
  bool operator==(const TrackRow&) const = default;
};

// One saved comparison (wb compare) and its per-tensor rows.
struct ComparisonRow {
  std::int64_t id = 0;  // assigned when saved
  std::string created_utc;
  std::string a_path;
  std::string b_path;
  std::string profile;
  std::int64_t passed = 0;
  std::int64_t failed = 0;
  std::string first_divergence;  // JSON text, empty when none
  std::string json;              // the full report as JSON
  bool operator==(const ComparisonRow&) const = default;
};

struct ComparisonEntryRow {
  std::int64_t comparison_id = 0;
  std::int32_t exec_order = 0;
  std::string name;
  std::string kind;
  std::string status;  // pass, fail, missing_a, missing_b, shape_mismatch, ...
  std::string metrics_json;
  bool operator==(const ComparisonEntryRow&) const = default;
};

std::string_view category_name(Category c);
// Throws std::invalid_argument naming the text and the valid names.
Category category_from_name(std::string_view name);
std::string_view track_kind_name(TrackKind k);
TrackKind track_kind_from_name(std::string_view name);
std::string_view kernel_kind_name(KernelKind k);

// Shapes are stored as JSON arrays ("[8,3,32,32]").
std::string shape_to_json(const std::vector<std::int64_t>& shape);
// Throws std::invalid_argument when the text is not a JSON array of integers.
std::vector<std::int64_t> shape_from_json(std::string_view text);

// A GPU stream's launch queue on `track` (HTA's queue length, trace_counters.py): +1 when a runtime call
// that launched work on the stream starts, -1 when that work starts, the calls first at equal times; one
// sample per change. `launches` holds each launched row's (call start, row start).
std::vector<CounterRow> launch_queue(std::uint32_t track, std::vector<std::pair<std::int64_t, std::int64_t>> launches);

// Sorts a track's ranges by start, an enclosing range (lower depth) before the ranges it contains;
// equal ones keep their order (the order every reader of ranges expects). Defined in reader.cpp.
void sort_by_start(std::vector<RangeRow>& rows);

}  // namespace wb::store
