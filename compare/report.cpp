// Reports of a comparison (report.hpp): the console table, JSON, CSV with msprobe's column names, and
// the comparison tables a run file keeps for the app's Precision view.
#include "compare/report.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include "store/writer.hpp"

namespace wb::compare {
namespace {

std::string fmt(double v, const char* spec = "%.4g") {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

nlohmann::json num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string shape_text(const std::vector<std::int64_t>& shape, const char* sep = ",") {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string dtype_text(const std::optional<store::DType>& d) { return d ? std::string(store::dtype_name(*d)) : ""; }

// Keeps the informative end of long names ("...layer4.2.downsample.0").
std::string fit(const std::string& s, std::size_t width) {
  if (s.size() <= width) return s;
  return "..." + s.substr(s.size() - (width - 3));
}

std::string pad(const std::string& s, std::size_t width, bool right = false) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

const char* color_of(RowStatus s) {
  switch (s) {
    case RowStatus::pass: return "\x1b[32m";
    case RowStatus::fail:
    case RowStatus::shape_mismatch: return "\x1b[31m";
    case RowStatus::missing_a:
    case RowStatus::missing_b:
    case RowStatus::skipped: return "\x1b[33m";
  }
  return "";
}

std::string status_label(RowStatus s) {
  switch (s) {
    case RowStatus::pass: return "PASS";
    case RowStatus::fail: return "FAIL";
    case RowStatus::shape_mismatch: return "SHAPE";
    case RowStatus::missing_a: return "NO-A";
    case RowStatus::missing_b: return "NO-B";
    case RowStatus::skipped: return "SKIP";
  }
  return "?";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

nlohmann::json row_to_json(const RowResult& r) {
  nlohmann::json j;
  j["order"] = r.walk_position;
  j["name"] = r.name;
  j["a_name"] = r.a_key.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.a_key);
  j["b_name"] = r.b_key.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.b_key);
  j["kind"] = std::string(kind_name(r.kind));
  j["status"] = std::string(status_name(r.status));
  j["match"] = std::string(method_name(r.method));
  j["a_dtype"] = r.a_dtype ? nlohmann::json(dtype_text(r.a_dtype)) : nlohmann::json(nullptr);
  j["b_dtype"] = r.b_dtype ? nlohmann::json(dtype_text(r.b_dtype)) : nlohmann::json(nullptr);
  j["a_shape"] = r.a_key.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.a_shape);
  j["b_shape"] = r.b_key.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.b_shape);
  j["metrics"] = r.metrics ? metrics_to_json(*r.metrics) : nlohmann::json(nullptr);
  j["update_metrics"] = r.update_metrics ? metrics_to_json(*r.update_metrics) : nlohmann::json(nullptr);
  j["thresholds"] = to_json(r.thresholds);
  j["reason"] = r.reason;
  return j;
}

}  // namespace

RowOrder row_order_from_name(std::string_view name) {
  if (name == "failures") return RowOrder::failures_first;
  if (name == "exec") return RowOrder::exec;
  throw CompareError("--order: unknown order '" + std::string(name) + "' (expected failures or exec)");
}

nlohmann::json metrics_to_json(const Metrics& m) {
  nlohmann::json j;
  j["numel"] = m.numel;
  j["compared"] = m.compared;
  j["max_abs"] = num(m.max_abs);
  j["max_abs_index"] = m.max_abs_index;
  j["mean_abs"] = num(m.mean_abs);
  j["max_rel"] = num(m.max_rel);
  j["max_rel_index"] = m.max_rel_index;
  j["rel_l2"] = num(m.rel_l2);
  j["rmse"] = num(m.rmse);
  j["euc_dist"] = num(m.euc_dist);
  j["cosine"] = num(m.cosine);
  j["sqnr_db"] = num(m.sqnr_db);
  j["norm_ratio"] = num(m.norm_ratio);
  j["scale"] = num(m.scale);
  j["scale_stderr"] = num(m.scale_stderr);
  j["scale_z"] = num(m.scale_z);
  j["scale_noise_p"] = num(m.scale_noise_p);
  j["residual_rel_l2"] = num(m.residual_rel_l2);
  j["allclose_ratio"] = num(m.allclose_ratio);
  j["allclose_count"] = m.allclose_count;
  j["rtol"] = m.tolerance.rtol;
  j["atol"] = m.tolerance.atol;
  j["one_thousandth_ratio"] = num(m.one_thousandth_ratio);
  j["five_thousandths_ratio"] = num(m.five_thousandths_ratio);
  j["bit_exact"] = m.bit_exact;
  j["nonfinite_mismatch"] = m.nonfinite_mismatch;
  j["nonfinite_positions_match"] = m.nonfinite_positions_match();
  auto side = [](const SideStats& s) {
    return nlohmann::json{{"min", num(s.min)},       {"max", num(s.max)},
                          {"mean", num(s.mean)},     {"l2norm", num(s.l2norm)},
                          {"nan_count", s.nan_count}, {"inf_count", s.inf_count}};
  };
  j["a"] = side(m.a);
  j["b"] = side(m.b);
  return j;
}

nlohmann::json to_json(const Comparison& c) {
  nlohmann::json j;
  j["a"] = c.a_source;
  j["b"] = c.b_source;
  j["profile"] = std::string(profile_name(c.profile));
  j["order"] = {{"side", c.order_side}, {"note", c.order_note}};
  j["summary"] = {{"total", c.rows.size()}, {"passed", c.passed},       {"failed", c.failed},
                  {"missing_a", c.missing_a}, {"missing_b", c.missing_b}, {"skipped", c.skipped},
                  {"all_pass", c.all_pass()}};
  nlohmann::json rows = nlohmann::json::array();
  for (const RowResult& r : c.rows) rows.push_back(row_to_json(r));
  j["rows"] = std::move(rows);
  nlohmann::json amb = nlohmann::json::array();
  for (const Ambiguity& a : c.ambiguities) {
    amb.push_back({{"name", a.key}, {"side", a.in_a ? "A" : "B"}, {"chosen", a.chosen}, {"candidates", a.candidates}});
  }
  j["ambiguities"] = std::move(amb);
  j["first_divergence"] = c.first_divergence ? to_json(*c.first_divergence) : nlohmann::json(nullptr);
  return j;
}

void print_table(std::ostream& out, const Comparison& c, const TableOptions& opt) {
  const char* reset = opt.color ? "\x1b[0m" : "";
  const char* bold = opt.color ? "\x1b[1m" : "";
  std::vector<const RowResult*> rows;
  for (const RowResult& r : c.rows) rows.push_back(&r);
  if (opt.order == RowOrder::failures_first) {
    std::stable_partition(rows.begin(), rows.end(), [](const RowResult* r) { return r->failed(); });
  }
  std::size_t name_w = 4;
  for (const RowResult* r : rows) name_w = std::max(name_w, std::min<std::size_t>(r->name.size(), 44));

  out << "A: " << c.a_source << "\nB: " << c.b_source << " (reference)\nprofile: " << profile_name(c.profile) << "\n";
  if (!c.order_note.empty()) out << c.order_note << "\n";
  out << "\n";
  out << bold << pad("#", 5, true) << "  " << pad("status", 6) << "  " << pad("name", name_w) << "  " << pad("shape", 16)
      << "  " << pad("max abs", 10, true) << "  " << pad("max rel", 10, true) << "  " << pad("cosine", 12, true) << "  "
      << pad("rel-L2", 10, true) << "  " << pad("rmse", 10, true) << "  " << pad("allclose", 8, true) << "  "
      << pad("nan/inf", 7, true) << "  reason" << reset << "\n";
  for (const RowResult* r : rows) {
    std::string cells[7];
    if (r->metrics) {
      const Metrics& m = *r->metrics;
      cells[0] = fmt(m.max_abs, "%.3e");
      cells[1] = fmt(m.max_rel, "%.3e");
      cells[2] = fmt(m.cosine, "%.9f");
      cells[3] = fmt(m.rel_l2, "%.3e");
      cells[4] = fmt(m.rmse, "%.3e");
      cells[5] = fmt(100.0 * m.allclose_ratio, "%.2f") + "%";
      const std::int64_t nf = m.a.nan_count + m.a.inf_count + m.b.nan_count + m.b.inf_count;
      cells[6] = nf == 0 ? "-" : std::to_string(nf) + (m.nonfinite_positions_match() ? "" : "!");
    }
    const auto& shape = r->b_key.empty() ? r->a_shape : r->b_shape;
    out << pad(std::to_string(r->walk_position), 5, true) << "  " << (opt.color ? color_of(r->status) : "")
        << pad(status_label(r->status), 6) << reset << "  " << pad(fit(r->name, 44), name_w) << "  "
        << pad(fit(shape_text(shape), 16), 16) << "  " << pad(cells[0], 10, true) << "  " << pad(cells[1], 10, true)
        << "  " << pad(cells[2], 12, true) << "  " << pad(cells[3], 10, true) << "  " << pad(cells[4], 10, true) << "  "
        << pad(cells[5], 8, true) << "  " << pad(cells[6], 7, true) << "  " << r->reason;
    if (r->method != MatchMethod::exact && r->method != MatchMethod::none) {
      out << (r->reason.empty() ? "" : "; ") << "matched by " << method_name(r->method) << " (A: " << r->a_key << ")";
    }
    out << "\n";
  }

  // The thresholds in force, per kind (several lines for a kind when the mapping file overrode some).
  std::map<std::string, std::map<std::string, int>> legend;
  for (const RowResult& r : c.rows) ++legend[std::string(kind_name(r.kind))][describe(r.thresholds)];
  out << "\nthresholds (" << profile_name(c.profile) << "):\n";
  for (const auto& [kind, descs] : legend) {
    for (const auto& [desc, count] : descs) {
      out << "  " << pad(kind, 13) << (desc.empty() ? "(none)" : desc);
      if (descs.size() > 1) out << "  [" << count << " tensors]";
      out << "\n";
    }
  }

  if (!c.ambiguities.empty()) {
    out << "\norder+shape matching was ambiguous for " << c.ambiguities.size() << " tensors:\n";
    for (std::size_t i = 0; i < c.ambiguities.size() && i < opt.max_ambiguities; ++i) {
      const Ambiguity& a = c.ambiguities[i];
      out << "  " << (a.in_a ? "A " : "B ") << a.key << " -> "
          << (a.chosen.empty() ? std::string("(left unmatched)") : a.chosen) << "; could be:";
      for (const auto& cand : a.candidates) out << " " << cand;
      out << "\n";
    }
    if (c.ambiguities.size() > opt.max_ambiguities) {
      out << "  ... and " << c.ambiguities.size() - opt.max_ambiguities << " more (see --json)\n";
    }
  }

  out << "\n" << bold << c.rows.size() << " tensors: " << c.passed << " pass, " << c.failed << " fail, " << c.missing_a
      << " only in B, " << c.missing_b << " only in A";
  if (c.skipped > 0) out << ", " << c.skipped << " not judged";
  out << reset << "\n";
  if (c.first_divergence) {
    const FirstDivergence& d = *c.first_divergence;
    out << "\n" << (opt.color ? "\x1b[1;31m" : "") << d.summary << reset << "\n";
    if (!d.worst.empty()) {
      out << "  worst elements (index: A vs B, |A-B|):\n";
      for (const WorstElement& w : d.worst) {
        out << "    " << pad(shape_text(w.coord), 20) << "  " << pad(fmt(w.a, "%.8g"), 16, true) << " vs "
            << pad(fmt(w.b, "%.8g"), 16) << "  " << fmt(w.abs_err, "%.3e") << "\n";
      }
    }
  } else if (c.failed == 0) {
    out << (opt.color ? "\x1b[32m" : "") << "No divergence: every compared tensor passes." << reset << "\n";
  }
}

std::string csv_header() {
  return "NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,Cosine,MaxAbsErr,"
         "MaxRelativeErr,One Thousandth Err Ratio,Five Thousandths Err Ratio,NPU max,NPU min,NPU mean,NPU l2norm,"
         "Bench max,Bench min,Bench mean,Bench l2norm,Accuracy Reached or Not,Err_message,"
         "MeanAbsErr,EucDist,RMSE,RelL2,AllcloseRatio,SQNR(dB),NaN/Inf Mismatch,Kind,Status,Match,"
         "NormRatio,Scale,ScaleStdErr,ScaleZ,ScaleNoiseP";
}

void write_csv(std::ostream& out, const Comparison& c) {
  out << csv_header() << "\n";
  for (const RowResult& r : c.rows) {
    std::vector<std::string> f;
    f.push_back(r.a_key.empty() ? "N/A" : r.a_key);
    f.push_back(r.b_key.empty() ? "N/A" : r.b_key);
    f.push_back(r.a_dtype ? dtype_text(r.a_dtype) : "N/A");
    f.push_back(r.b_dtype ? dtype_text(r.b_dtype) : "N/A");
    f.push_back(r.a_key.empty() ? "N/A" : shape_text(r.a_shape, ", "));
    f.push_back(r.b_key.empty() ? "N/A" : shape_text(r.b_shape, ", "));
    if (r.metrics) {
      const Metrics& m = *r.metrics;
      const char* g = "%.10g";
      for (double v : {m.cosine, m.max_abs, m.max_rel, m.one_thousandth_ratio, m.five_thousandths_ratio, m.a.max, m.a.min,
                       m.a.mean, m.a.l2norm, m.b.max, m.b.min, m.b.mean, m.b.l2norm}) {
        f.push_back(fmt(v, g));
      }
      f.push_back(r.status == RowStatus::pass ? "Yes" : (r.status == RowStatus::skipped ? "N/A" : "No"));
      f.push_back(r.reason);
      for (double v : {m.mean_abs, m.euc_dist, m.rmse, m.rel_l2, m.allclose_ratio, m.sqnr_db}) f.push_back(fmt(v, g));
      f.push_back(std::to_string(m.nonfinite_mismatch));
    } else {
      for (int i = 0; i < 13; ++i) f.push_back("N/A");
      f.push_back(r.status == RowStatus::shape_mismatch ? "No" : "N/A");
      f.push_back(r.reason);
      for (int i = 0; i < 7; ++i) f.push_back("N/A");
    }
    f.push_back(std::string(kind_name(r.kind)));
    f.push_back(std::string(status_name(r.status)));
    f.push_back(std::string(method_name(r.method)));
    if (r.metrics) {
      const Metrics& m = *r.metrics;
      for (double v : {m.norm_ratio, m.scale, m.scale_stderr, m.scale_z, m.scale_noise_p}) f.push_back(fmt(v, "%.10g"));
    } else {
      for (int i = 0; i < 5; ++i) f.push_back("N/A");
    }
    for (std::size_t i = 0; i < f.size(); ++i) out << (i ? "," : "") << csv_field(f[i]);
    out << "\n";
  }
}

void write_json_file(const std::filesystem::path& path, const Comparison& c) {
  std::ofstream out(path);
  if (!out) throw CompareError(path.string() + ": cannot write the JSON report");
  out << to_json(c).dump(1) << "\n";
  if (!out) throw CompareError(path.string() + ": writing the JSON report failed");
}

void write_csv_file(const std::filesystem::path& path, const Comparison& c) {
  std::ofstream out(path);
  if (!out) throw CompareError(path.string() + ": cannot write the CSV report");
  write_csv(out, c);
  if (!out) throw CompareError(path.string() + ": writing the CSV report failed");
}

std::int64_t save_to_run(const std::filesystem::path& run, const Comparison& c) {
  store::ComparisonRow row;
  row.created_utc = utc_now();
  row.a_path = c.a_source;
  row.b_path = c.b_source;
  row.profile = std::string(profile_name(c.profile));
  row.passed = c.passed;
  row.failed = c.failed;
  row.first_divergence = c.first_divergence ? to_json(*c.first_divergence).dump() : std::string();
  row.json = to_json(c).dump();
  std::vector<store::ComparisonEntryRow> entries;
  entries.reserve(c.rows.size());
  for (const RowResult& r : c.rows) {
    store::ComparisonEntryRow e;
    e.exec_order = static_cast<std::int32_t>(r.walk_position);
    e.name = r.name;
    e.kind = std::string(kind_name(r.kind));
    e.status = std::string(status_name(r.status));
    e.metrics_json = row_to_json(r).dump();
    entries.push_back(std::move(e));
  }
  return store::save_comparison(run, row, entries);
}

}  // namespace wb::compare
