// Loading one side of a comparison: a run file (its `tensor` table), a .safetensors file, an .npz,
// a single .npy, a directory of .npy files (TroubleShooter's "{index}_{name}.npy" accepted), or an
// msprobe dump directory (dump.json, with .npy files in dump_tensor_data/ or statistics only).
//
// msprobe (L0, module level): "Module.<path>.<Class>.forward.<n>" gives act.<path> (act.<path>.<n>
// when the module ran more than once) from its output and param.<path>.<name> from its parameters;
// "Module.<path>.<Class>.parameters_grad[.<n>]" gives grad.<path>.<name>; API-level entries
// ("Functional.relu.0.forward", ...) keep their names with ".output.<i>" (kind other); backward
// entries (gradients of module inputs and outputs, which our dumps do not hold) are left out.
// dump.json lists the entries as they ran: that is the recorded order. A tensor whose data file is
// not an .npy (PyTorch's .pt) or is absent (task "statistics") keeps its Max/Min/Mean/Norm only.
//
// Execution order: a run file's exec_order column; a safetensors file's __metadata__["wb.exec_order"]
// (a JSON object key -> order) when present; otherwise derived from the kind order (input, label,
// param, buffer, act, loss, grad, param_after, buffer_after, momentum, other) and then file order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "compare/tensor_set.hpp"

namespace wb::compare {

enum class SetFormat { run_file, safetensors, npz, npy, npy_dir, msprobe };

// Which dump of a run file to read. Unset fields pick the only value present; with several, step
// and rank pick the smallest and source prefers "run".
struct LoadOptions {
  std::optional<std::string> source;
  std::optional<std::int32_t> step;
  std::optional<std::int32_t> rank;
};

// Detects the format by content (SQLite magic) and extension. Throws CompareError for a missing path
// or an unrecognised file, naming the path and the accepted formats.
SetFormat detect_format(const std::filesystem::path& path);

// Throws CompareError (bad path, unknown format, run file without tensors), store::StoreError or
// store::TensorFileError (malformed files); every message names the file.
TensorSet load_tensor_set(const std::filesystem::path& path, const LoadOptions& options = {});

// The safetensors metadata keys holding the execution order and the kinds not to judge.
inline constexpr const char* kExecOrderMetadataKey = "wb.exec_order";
inline constexpr const char* kNotComparableMetadataKey = "wb.not_comparable";
// The pipeline plan ({"micro_batches": M, "loss": "sum"|"mean", ...}) of a pipeline step's dump.
inline constexpr const char* kPipelineMetadataKey = "wb.pipeline";
// The reference's own float32 noise per tensor ({"version": 1, "method": ..., "tensors": {key: {"l2",
// "max_abs", "ref_l2"}}, "updates": {key: {"l2", "ref_l2"}}}; see NoiseScale in tensor_set.hpp).
inline constexpr const char* kNoiseMetadataKey = "wb.noise";

}  // namespace wb::compare
