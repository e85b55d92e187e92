#include "app/model/precision_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compare/load.hpp"
#include "compare/stored_comparison.hpp"

namespace wb::app_model {

PrecisionLoader::PrecisionLoader(std::filesystem::path run, std::filesystem::path reference)
    : run_(std::move(run)), reference_(std::move(reference)) {
  thread_ = std::thread([this] {
    try {
      auto data = std::make_shared<PrecisionData>();
      data->a_path = run_.string();
      data->b_path = reference_.string();
      {
        std::lock_guard lock(mutex_);
        stage_ = "reading " + run_.filename().string();
      }
      data->a = compare::load_tensor_set(run_);
      {
        std::lock_guard lock(mutex_);
        stage_ = "reading " + reference_.filename().string();
      }
      data->b = compare::load_tensor_set(reference_);
      {
        std::lock_guard lock(mutex_);
        stage_ = "comparing";
      }
      data->comparison = compare::compare_sets(data->a, data->b);
      std::lock_guard lock(mutex_);
      result_ = std::move(data);
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      error_ = e.what();
    }
    done_.store(true);
  });
}

PrecisionLoader::PrecisionLoader(std::shared_ptr<const PrecisionData> stored, std::filesystem::path a, std::filesystem::path b)
    : run_(std::move(a)), reference_(std::move(b)) {
  thread_ = std::thread([this, stored = std::move(stored)] {
    auto data = std::make_shared<PrecisionData>();
    data->a_path = stored->a_path;
    data->b_path = stored->b_path;
    data->comparison = stored->comparison;
    data->stored_id = stored->stored_id;
    data->stored_created = stored->stored_created;
    try {
      {
        std::lock_guard lock(mutex_);
        stage_ = "reading the tensors of " + run_.filename().string();
      }
      data->a = compare::load_tensor_set(run_);
      {
        std::lock_guard lock(mutex_);
        stage_ = "reading the tensors of " + reference_.filename().string();
      }
      data->b = compare::load_tensor_set(reference_);
      compare::attach_sets(data->comparison, data->a, data->b);
      data->has_tensors = true;
    } catch (const std::exception& e) {
      data->a = {};
      data->b = {};
      data->has_tensors = false;
      data->tensors_note = std::string("The tensors could not be read (") + e.what() + "); the table comes from the run file.";
    }
    std::lock_guard lock(mutex_);
    result_ = std::move(data);
    done_.store(true);
  });
}

PrecisionLoader::~PrecisionLoader() {
  if (thread_.joinable()) thread_.join();
}

std::string PrecisionLoader::stage() const {
  std::lock_guard lock(mutex_);
  return stage_;
}

std::shared_ptr<const PrecisionData> PrecisionLoader::result() const {
  std::lock_guard lock(mutex_);
  return result_;
}

std::string PrecisionLoader::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

int channel_axis(compare::TensorKind kind, const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return -1;
  if (kind == compare::TensorKind::act || kind == compare::TensorKind::input) return shape.size() >= 2 ? 1 : 0;
  return 0;
}

ChannelErrors channel_errors(const std::vector<double>& a, const std::vector<double>& b,
                             const std::vector<std::int64_t>& shape, int axis) {
  ChannelErrors out;
  out.axis = axis;
  if (axis < 0 || axis >= static_cast<int>(shape.size())) return out;
  std::int64_t channels = shape[static_cast<std::size_t>(axis)];
  std::int64_t inner = 1;
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<double> diff2(static_cast<std::size_t>(channels), 0.0), ref2(static_cast<std::size_t>(channels), 0.0);
  out.max_abs.assign(static_cast<std::size_t>(channels), 0.0);
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    auto ch = static_cast<std::size_t>((static_cast<std::int64_t>(i) / inner) % channels);
    double d = a[i] - b[i];
    if (!std::isfinite(d)) continue;
    diff2[ch] += d * d;
    ref2[ch] += b[i] * b[i];
    out.max_abs[ch] = std::max(out.max_abs[ch], std::abs(d));
  }
  out.rel_l2.resize(static_cast<std::size_t>(channels));
  for (std::size_t c = 0; c < out.rel_l2.size(); ++c) {
    if (diff2[c] == 0.0) out.rel_l2[c] = 0.0;
    else if (ref2[c] == 0.0) out.rel_l2[c] = std::numeric_limits<double>::infinity();
    else out.rel_l2[c] = std::sqrt(diff2[c] / ref2[c]);
  }
  return out;
}

HeatMap heat_map(const std::vector<double>& a, const std::vector<double>& b, const std::vector<std::int64_t>& shape,
                 std::int64_t n, std::int64_t c) {
  HeatMap h;
  std::int64_t offset = 0;
  if (shape.size() >= 3) {
    h.rows = static_cast<int>(shape[shape.size() - 2]);
    h.cols = static_cast<int>(shape[shape.size() - 1]);
    // Leading dimensions: (n, c) for 4-d, (c) for 3-d.
    std::int64_t plane = static_cast<std::int64_t>(h.rows) * h.cols;
    if (shape.size() == 4) {
      n = std::clamp<std::int64_t>(n, 0, shape[0] - 1);
      c = std::clamp<std::int64_t>(c, 0, shape[1] - 1);
      offset = (n * shape[1] + c) * plane;
    } else {
      c = std::clamp<std::int64_t>(c, 0, shape[0] - 1);
      offset = c * plane;
    }
  } else if (shape.size() == 2) {
    h.rows = static_cast<int>(shape[0]);
    h.cols = static_cast<int>(shape[1]);
  } else {
    h.rows = 1;
    h.cols = static_cast<int>(std::min(a.size(), b.size()));
  }
  const std::size_t count = static_cast<std::size_t>(h.rows) * static_cast<std::size_t>(h.cols);
  h.values.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::size_t k = static_cast<std::size_t>(offset) + i;
    double d = k < a.size() && k < b.size() ? std::abs(a[k] - b[k]) : 0.0;
    h.values[i] = d;
    if (std::isfinite(d)) h.max = std::max(h.max, d);
  }
  return h;
}

namespace {

std::vector<double> to_doubles(const store::HostTensor& t) {
  auto v = compare::view_of(t);
  std::vector<double> out(static_cast<std::size_t>(v.numel));
  compare::convert_to_double(v, 0, v.numel, out.data());
  return out;
}

}  // namespace

TensorDetail tensor_detail(const PrecisionData& data, std::size_t row, std::int64_t n, std::int64_t c, int bins) {
  const auto& rows = data.comparison.rows;
  if (row >= rows.size()) throw compare::CompareError("precision: no row " + std::to_string(row));
  const auto& r = rows[row];
  if (!r.a_index || !r.b_index) throw compare::CompareError(r.name + ": present on one side only");
  const auto& ta = data.a.tensors[*r.a_index].tensor;
  const auto& tb = data.b.tensors[*r.b_index].tensor;
  if (ta.numel() != tb.numel()) throw compare::CompareError(r.name + ": shapes differ");
  if (data.a.tensors[*r.a_index].stats_only() || data.b.tensors[*r.b_index].stats_only()) {
    throw compare::CompareError(r.name + ": statistics only (msprobe task \"statistics\"), no elements to plot");
  }
  TensorDetail d;
  d.row = row;
  d.shape = tb.shape;
  auto a = to_doubles(ta);
  auto b = to_doubles(tb);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto* v : {&a, &b})
    for (double x : *v)
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!(hi >= lo)) lo = 0, hi = 1;
  d.a_hist = make_histogram(a, bins, lo, hi, false);
  d.b_hist = make_histogram(b, bins, lo, hi, false);
  std::vector<double> err;
  err.reserve(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    double e = std::abs(a[i] - b[i]);
    if (e == 0.0) ++d.equal;
    else err.push_back(e);
  }
  d.err_hist = make_histogram(err, bins, true);
  d.channels = channel_errors(a, b, tb.shape, channel_axis(r.kind, tb.shape));
  d.heat = heat_map(a, b, tb.shape, n, c);
  d.worst = compare::worst_elements(compare::view_of(ta), compare::view_of(tb), tb.shape, 10);
  return d;
}

}  // namespace wb::app_model
