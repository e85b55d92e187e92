// The Precision view's data: a comparison of the run's dump against a reference (a .safetensors, .npz,
// .npy or npy directory, or a second run) computed on a background thread with both tensor sets kept
// for the per-tensor details, plus those details themselves as plain functions: value and error
// histograms, per-channel errors, an |a-b| heat map of one channel.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/model/plot_logic.hpp"
#include "compare/compare.hpp"
#include "compare/metrics.hpp"
#include "compare/tensor_set.hpp"

namespace wb::app_model {

struct PrecisionData {
  std::string a_path, b_path;
  compare::TensorSet a, b;
  compare::Comparison comparison;
  std::optional<std::int64_t> stored_id;  // read back from the run file (not recomputed)
  std::string stored_created;
  bool has_tensors = true;   // a and b hold the tensors the detail plots need
  std::string tensors_note;  // why they are not there
};

// Loads both sides and compares them in a background thread.
class PrecisionLoader {
 public:
  PrecisionLoader(std::filesystem::path run, std::filesystem::path reference);
  // For a stored comparison: loads only the tensors of both sides and links the stored rows to them.
  // Never fails: when a side cannot be loaded the result keeps the rows and says why in tensors_note.
  PrecisionLoader(std::shared_ptr<const PrecisionData> stored, std::filesystem::path a, std::filesystem::path b);
  ~PrecisionLoader();
  PrecisionLoader(const PrecisionLoader&) = delete;
  PrecisionLoader& operator=(const PrecisionLoader&) = delete;
  bool done() const { return done_.load(); }
  std::string stage() const;
  std::shared_ptr<const PrecisionData> result() const;
  std::string error() const;

 private:
  std::filesystem::path run_, reference_;
  std::atomic<bool> done_{false};
  mutable std::mutex mutex_;
  std::string stage_;
  std::shared_ptr<const PrecisionData> result_;
  std::string error_;
  std::thread thread_;
};

// The per-channel axis of a tensor: 1 for activations with at least two dimensions (N, C, ...), 0 for
// parameters and their gradients ((O, I, kh, kw) or (C)); -1 for scalars.
int channel_axis(compare::TensorKind kind, const std::vector<std::int64_t>& shape);

struct ChannelErrors {
  int axis = -1;
  std::vector<double> max_abs;  // per channel
  std::vector<double> rel_l2;   // ||a-b|| / ||b|| per channel (0 when both are 0, +inf when only b is 0)
};
// a and b: the same number of values in C order with this shape.
ChannelErrors channel_errors(const std::vector<double>& a, const std::vector<double>& b,
                             const std::vector<std::int64_t>& shape, int axis);

// |a-b| over the last two dimensions of one (n, c) slice of an (N, C, H, W) tensor, or of the whole
// tensor when it has two dimensions (rows x cols); a 1-d tensor is one row.
struct HeatMap {
  int rows = 0;
  int cols = 0;
  std::vector<double> values;  // rows * cols, row-major
  double max = 0.0;
};
HeatMap heat_map(const std::vector<double>& a, const std::vector<double>& b, const std::vector<std::int64_t>& shape,
                 std::int64_t n, std::int64_t c);

// Everything the detail panes draw for one row.
struct TensorDetail {
  std::size_t row = 0;
  std::vector<std::int64_t> shape;
  Histogram a_hist, b_hist;  // values of both sides over a shared range
  Histogram err_hist;        // log10 |a-b| of unequal elements
  std::int64_t equal = 0;    // elements with a == b
  ChannelErrors channels;
  HeatMap heat;
  std::vector<compare::WorstElement> worst;
};
// Throws compare::CompareError when the row has no pair of same-shaped tensors.
TensorDetail tensor_detail(const PrecisionData& data, std::size_t row, std::int64_t n, std::int64_t c, int bins = 60);

}  // namespace wb::app_model
