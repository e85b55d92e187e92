#include "compare/stored_comparison.hpp"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "store/reader.hpp"
#include "store/tensor_file.hpp"

namespace wb::compare {

namespace {

using nlohmann::json;

// Numbers as compare/report writes them: non-finite values are the strings "nan", "inf", "-inf".
double num(const json& j, const char* key, double fallback = 0.0) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return fallback;
}

std::optional<double> opt_num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return num(j, key);
}

std::int64_t integer(const json& j, const char* key, std::int64_t fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

bool flag(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::vector<std::int64_t> shape(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return {};
  return it->get<std::vector<std::int64_t>>();
}

SideStats side(const json& j) {
  SideStats s;
  if (!j.is_object()) return s;
  s.min = num(j, "min");
  s.max = num(j, "max");
  s.mean = num(j, "mean");
  s.l2norm = num(j, "l2norm");
  s.nan_count = integer(j, "nan_count");
  s.inf_count = integer(j, "inf_count");
  return s;
}

Metrics metrics(const json& j) {
  Metrics m;
  m.numel = integer(j, "numel");
  m.compared = integer(j, "compared");
  m.max_abs = num(j, "max_abs");
  m.max_abs_index = integer(j, "max_abs_index", -1);
  m.mean_abs = num(j, "mean_abs");
  m.max_rel = num(j, "max_rel");
  m.max_rel_index = integer(j, "max_rel_index", -1);
  m.rel_l2 = num(j, "rel_l2");
  m.rmse = num(j, "rmse");
  m.euc_dist = num(j, "euc_dist");
  m.cosine = num(j, "cosine", 1.0);
  m.sqnr_db = num(j, "sqnr_db");
  m.norm_ratio = num(j, "norm_ratio", 1.0);
  m.scale = num(j, "scale", 1.0);
  m.scale_stderr = num(j, "scale_stderr");
  m.scale_z = num(j, "scale_z");
  m.scale_noise_p = num(j, "scale_noise_p", 1.0);
  m.residual_rel_l2 = num(j, "residual_rel_l2");
  m.allclose_ratio = num(j, "allclose_ratio", 1.0);
  m.allclose_count = integer(j, "allclose_count");
  m.tolerance.rtol = num(j, "rtol", m.tolerance.rtol);
  m.tolerance.atol = num(j, "atol", m.tolerance.atol);
  m.one_thousandth_ratio = num(j, "one_thousandth_ratio", 1.0);
  m.five_thousandths_ratio = num(j, "five_thousandths_ratio", 1.0);
  m.bit_exact = flag(j, "bit_exact");
  m.nonfinite_mismatch = integer(j, "nonfinite_mismatch");
  if (j.contains("a")) m.a = side(j["a"]);
  if (j.contains("b")) m.b = side(j["b"]);
  return m;
}

Thresholds thresholds(const json& j) {
  Thresholds t;
  if (!j.is_object()) return t;
  t.bit_exact = flag(j, "bit_exact");
  t.cosine_min = opt_num(j, "cosine_min");
  t.rel_l2_max = opt_num(j, "rel_l2_max");
  t.max_abs_max = opt_num(j, "max_abs_max");
  t.allclose_ratio_min = opt_num(j, "allclose_ratio_min");
  t.update_cosine_min = opt_num(j, "update_cosine_min");
  t.update_rel_l2_max = opt_num(j, "update_rel_l2_max");
  t.all_close = flag(j, "all_close");
  t.dtype_must_match = flag(j, "dtype_must_match");
  t.nan_fails = flag(j, "nan_fails");
  t.nonfinite_fails = flag(j, "nonfinite_fails");
  t.msprobe_rule = flag(j, "msprobe_rule");
  t.scale_shift_min = opt_num(j, "scale_shift_min");
  t.noise_k = opt_num(j, "noise_k");
  t.noise_floor = opt_num(j, "noise_floor");
  t.update_noise_floor = opt_num(j, "update_noise_floor");
  t.flip_floor = opt_num(j, "flip_floor");
  t.update_flip_floor = opt_num(j, "update_flip_floor");
  t.tolerance.rtol = num(j, "rtol", t.tolerance.rtol);
  t.tolerance.atol = num(j, "atol", t.tolerance.atol);
  return t;
}

std::optional<RowStatus> status_from_name(std::string_view name) {
  for (RowStatus s : {RowStatus::pass, RowStatus::fail, RowStatus::shape_mismatch, RowStatus::missing_a, RowStatus::missing_b,
                      RowStatus::skipped})
    if (status_name(s) == name) return s;
  return std::nullopt;
}

std::string where(const store::ComparisonRow& header) { return "stored comparison #" + std::to_string(header.id); }

}  // namespace

Comparison comparison_from_stored(const store::ComparisonRow& header, const std::vector<store::ComparisonEntryRow>& rows) {
  Comparison c;
  c.a_source = header.a_path;
  c.b_source = header.b_path;
  c.profile = profile_from_name(header.profile);
  // Whose execution order the walk followed (reports saved before it was recorded have none).
  if (!header.json.empty()) {
    try {
      const json whole = json::parse(header.json);
      if (whole.contains("order") && whole["order"].is_object()) {
        c.order_side = text(whole["order"], "side");
        c.order_note = text(whole["order"], "note");
      }
      c.noise_note = text(whole, "noise_note");
      c.noise_source = text(whole, "noise_source");
    } catch (const json::exception&) {
      // The rows and the first divergence below are what matter; the order note is only shown.
    }
  }
  c.rows.reserve(rows.size());
  for (const auto& e : rows) {
    json j;
    try {
      j = json::parse(e.metrics_json);
    } catch (const json::exception& ex) {
      throw CompareError(where(header) + ", row " + e.name + ": metrics are not JSON (" + ex.what() + ")");
    }
    if (!j.is_object()) throw CompareError(where(header) + ", row " + e.name + ": expected a JSON object");
    RowResult r;
    r.name = e.name;
    r.a_key = text(j, "a_name");
    r.b_key = text(j, "b_name");
    auto kind = kind_from_name(e.kind);
    r.kind = kind ? *kind : TensorKind::other;
    auto status = status_from_name(e.status);
    if (!status) throw CompareError(where(header) + ", row " + e.name + ": unknown status '" + e.status + "'");
    r.status = *status;
    if (auto d = store::dtype_from_name(text(j, "a_dtype"))) r.a_dtype = d;
    if (auto d = store::dtype_from_name(text(j, "b_dtype"))) r.b_dtype = d;
    r.a_shape = shape(j, "a_shape");
    r.b_shape = shape(j, "b_shape");
    if (j.contains("metrics") && j["metrics"].is_object()) r.metrics = metrics(j["metrics"]);
    if (j.contains("update_metrics") && j["update_metrics"].is_object()) r.update_metrics = metrics(j["update_metrics"]);
    if (j.contains("thresholds")) r.thresholds = thresholds(j["thresholds"]);
    // Comparisons saved before bounds were recorded were judged by their thresholds.
    r.bounds = j.contains("bounds") ? thresholds(j["bounds"]) : r.thresholds;
    if (j.contains("noise") && j["noise"].is_object()) {
      const json& n = j["noise"];
      r.noise_applied = flag(n, "applied");
      r.noise_flips = flag(n, "flips");
      r.noise_rel_l2 = opt_num(n, "rel_l2");
      r.noise_ratio = opt_num(n, "ratio");
      r.update_noise_rel_l2 = opt_num(n, "update_rel_l2");
      r.update_noise_ratio = opt_num(n, "update_ratio");
    }
    r.bound_use = opt_num(j, "bound_use");
    r.reason = text(j, "reason");
    r.walk_position = e.exec_order;
    switch (r.status) {
      case RowStatus::pass: ++c.passed; break;
      case RowStatus::fail:
      case RowStatus::shape_mismatch: ++c.failed; break;
      case RowStatus::missing_a: ++c.missing_a; break;
      case RowStatus::missing_b: ++c.missing_b; break;
      case RowStatus::skipped: ++c.skipped; break;
    }
    c.rows.push_back(std::move(r));
  }
  if (!header.first_divergence.empty()) {
    json j;
    try {
      j = json::parse(header.first_divergence);
    } catch (const json::exception& ex) {
      throw CompareError(where(header) + ": first divergence is not JSON (" + ex.what() + ")");
    }
    FirstDivergence d;
    d.name = text(j, "name");
    auto kind = kind_from_name(text(j, "kind"));
    d.kind = kind ? *kind : TensorKind::other;
    d.reason = text(j, "reason");
    d.local = flag(j, "local");
    d.optimizer_only = flag(j, "optimizer_only");
    d.input_name = text(j, "input");
    d.rel_l2 = opt_num(j, "rel_l2");
    d.input_rel_l2 = opt_num(j, "input_rel_l2");
    d.jump = opt_num(j, "jump");
    d.noise_ratio = opt_num(j, "noise_ratio");
    d.input_noise_ratio = opt_num(j, "input_noise_ratio");
    d.summary = text(j, "summary");
    if (j.contains("worst") && j["worst"].is_array())
      for (const auto& w : j["worst"]) {
        WorstElement we;
        we.index = integer(w, "index");
        if (w.contains("coord") && w["coord"].is_array()) we.coord = w["coord"].get<std::vector<std::int64_t>>();
        we.a = num(w, "a");
        we.b = num(w, "b");
        we.abs_err = num(w, "abs_err");
        d.worst.push_back(std::move(we));
      }
    // The row it names; the first failing row when the name is not among them.
    bool found = false;
    for (std::size_t i = 0; i < c.rows.size() && !found; ++i)
      if (c.rows[i].name == d.name) d.row = i, found = true;
    for (std::size_t i = 0; i < c.rows.size() && !found; ++i)
      if (c.rows[i].failed()) d.row = i, found = true;
    c.first_divergence = std::move(d);
  }
  return c;
}

StoredComparison read_stored_comparison(const std::filesystem::path& run, std::int64_t id) {
  store::Reader reader(run);
  StoredComparison out;
  std::string ids;
  bool found = false;
  for (auto& h : reader.comparisons()) {
    ids += (ids.empty() ? "" : ", ") + std::to_string(h.id);
    if (h.id == id) {
      out.header = std::move(h);
      found = true;
    }
  }
  if (!found)
    throw CompareError(run.string() + ": no stored comparison " + std::to_string(id) +
                                (ids.empty() ? std::string(" (it holds none; wb compare RUN REF saves one)") : " (it holds " + ids + ")"));
  out.comparison = comparison_from_stored(out.header, reader.comparison_rows(id));
  return out;
}

void attach_sets(Comparison& comparison, const TensorSet& a, const TensorSet& b) {
  for (auto& r : comparison.rows) {
    r.a_index = r.a_key.empty() ? std::nullopt : a.position(r.a_key);
    r.b_index = r.b_key.empty() ? std::nullopt : b.position(r.b_key);
  }
}

std::optional<std::filesystem::path> locate_side(const std::string& saved, const std::filesystem::path& run) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(saved);
  if (fs::exists(p, ec)) return p;
  if (p.is_relative()) {
    fs::path beside = run.parent_path() / p.filename();
    if (fs::exists(beside, ec)) return beside;
  }
  if (p.filename() == run.filename() && fs::exists(run, ec)) return run;
  return std::nullopt;
}

}  // namespace wb::compare
