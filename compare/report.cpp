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
  j["bounds"] = to_json(r.bounds);
  auto opt = [](const std::optional<double>& v) { return v ? num(*v) : nlohmann::json(nullptr); };
  j["noise"] = {{"applied", r.noise_applied},
                {"flips", r.noise_flips},
                {"rel_l2", opt(r.noise_rel_l2)},
                {"ratio", opt(r.noise_ratio)},
                {"update_rel_l2", opt(r.update_noise_rel_l2)},
                {"update_ratio", opt(r.update_noise_ratio)}};
  j["bound_use"] = opt(r.bound_use);
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
  j["noise_note"] = c.noise_note;
  j["noise_source"] = c.noise_source.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.noise_source);
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

namespace {

struct TableStyle {
  const char* reset = "";
  const char* bold = "";
  bool color = false;
};

std::string opt_cell(const std::optional<double>& v, const char* spec) { return v ? fmt(*v, spec) : "-"; }

// The bound of the row's main check: its rel-L2 bound, else its absolute bound (the loss).
std::string bound_cell(const RowResult& r) {
  if (r.bounds.rel_l2_max) return fmt(*r.bounds.rel_l2_max, "%.2e");
  if (r.bounds.max_abs_max) return "abs " + fmt(*r.bounds.max_abs_max, "%.1e");
  if (r.bounds.bit_exact) return "exact";
  return "-";
}

void print_rows(std::ostream& out, const std::vector<const RowResult*>& rows, const TableStyle& st) {
  std::size_t name_w = 4;
  for (const RowResult* r : rows) name_w = std::max(name_w, std::min<std::size_t>(r->name.size(), 44));
  out << st.bold << pad("#", 5, true) << "  " << pad("status", 6) << "  " << pad("name", name_w) << "  " << pad("shape", 16)
      << "  " << pad("max abs", 10, true) << "  " << pad("cosine", 12, true) << "  " << pad("rel-L2", 10, true) << "  "
      << pad("bound", 10, true) << "  " << pad("noise", 9, true) << "  " << pad("x noise", 8, true) << "  "
      << pad("use", 6, true) << "  " << pad("nan/inf", 7, true) << "  reason" << st.reset << "\n";
  for (const RowResult* r : rows) {
    std::string cells[4] = {"", "", "", ""};
    if (r->metrics) {
      const Metrics& m = *r->metrics;
      cells[0] = fmt(m.max_abs, "%.3e");
      cells[1] = fmt(m.cosine, "%.9f");
      cells[2] = fmt(m.rel_l2, "%.3e");
      const std::int64_t nf = m.a.nan_count + m.a.inf_count + m.b.nan_count + m.b.inf_count;
      cells[3] = nf == 0 ? "-" : std::to_string(nf) + (m.nonfinite_positions_match() ? "" : "!");
    }
    const auto& shape = r->b_key.empty() ? r->a_shape : r->b_shape;
    out << pad(std::to_string(r->walk_position), 5, true) << "  " << (st.color ? color_of(r->status) : "")
        << pad(status_label(r->status), 6) << st.reset << "  " << pad(fit(r->name, 44), name_w) << "  "
        << pad(fit(shape_text(shape), 16), 16) << "  " << pad(cells[0], 10, true) << "  " << pad(cells[1], 12, true)
        << "  " << pad(cells[2], 10, true) << "  " << pad(r->metrics ? bound_cell(*r) : "", 10, true) << "  "
        << pad(r->metrics ? opt_cell(r->noise_rel_l2, "%.2e") : "", 9, true) << "  "
        << pad(r->metrics ? opt_cell(r->noise_ratio, "%.3g") : "", 8, true) << "  "
        << pad(r->metrics ? opt_cell(r->bound_use, "%.3g") : "", 6, true) << "  " << pad(cells[3], 7, true) << "  "
        << r->reason;
    if (r->method != MatchMethod::exact && r->method != MatchMethod::none) {
      out << (r->reason.empty() ? "" : "; ") << "matched by " << method_name(r->method) << " (A: " << r->a_key << ")";
    }
    out << "\n";
  }
}

// Per kind: tensors, pass, fail, not judged, missing, and the row nearest its bound.
void print_kind_counts(std::ostream& out, const Comparison& c, const TableStyle& st) {
  struct Count {
    std::int64_t total = 0, pass = 0, fail = 0, skipped = 0, missing = 0;
    const RowResult* nearest = nullptr;
  };
  std::map<int, std::pair<TensorKind, Count>> kinds;
  for (const RowResult& r : c.rows) {
    auto& [kind, n] = kinds[walk_rank(r.kind)];
    kind = r.kind;
    ++n.total;
    if (r.status == RowStatus::pass) ++n.pass;
    else if (r.failed()) ++n.fail;
    else if (r.status == RowStatus::skipped) ++n.skipped;
    else ++n.missing;
    if (r.bound_use && (n.nearest == nullptr || *r.bound_use > *n.nearest->bound_use)) n.nearest = &r;
  }
  out << st.bold << pad("kind", 13) << "  " << pad("tensors", 7, true) << "  " << pad("pass", 5, true) << "  "
      << pad("fail", 5, true) << "  " << pad("other", 5, true) << "  nearest its bound (error / bound)" << st.reset << "\n";
  for (const auto& [rank, entry] : kinds) {
    const auto& [kind, n] = entry;
    out << pad(std::string(kind_name(kind)), 13) << "  " << pad(std::to_string(n.total), 7, true) << "  "
        << pad(std::to_string(n.pass), 5, true) << "  " << pad(std::to_string(n.fail), 5, true) << "  "
        << pad(std::to_string(n.skipped + n.missing), 5, true) << "  ";
    if (n.nearest != nullptr) {
      out << fmt(*n.nearest->bound_use, "%.3g") << " at " << n.nearest->name;
      if (n.nearest->noise_ratio) out << " (" << fmt(*n.nearest->noise_ratio, "%.3g") << "x its noise)";
    } else {
      out << "-";
    }
    out << "\n";
  }
}

void print_legend(std::ostream& out, const Comparison& c) {
  // The thresholds in force, per kind (several lines for a kind when the mapping file overrode some).
  std::map<std::string, std::map<std::string, int>> legend;
  for (const RowResult& r : c.rows) ++legend[std::string(kind_name(r.kind))][describe(r.thresholds, r.noise_applied, r.noise_flips)];
  out << "\nthresholds (" << profile_name(c.profile) << "):\n";
  for (const auto& [kind, descs] : legend) {
    for (const auto& [desc, count] : descs) {
      out << "  " << pad(kind, 13) << (desc.empty() ? "(none)" : desc);
      if (descs.size() > 1) out << "  [" << count << " tensors]";
      out << "\n";
    }
  }
}

void print_ambiguities(std::ostream& out, const Comparison& c, std::size_t max_ambiguities) {
  if (c.ambiguities.empty()) return;
  out << "\norder+shape matching was ambiguous for " << c.ambiguities.size() << " tensors:\n";
  for (std::size_t i = 0; i < c.ambiguities.size() && i < max_ambiguities; ++i) {
    const Ambiguity& a = c.ambiguities[i];
    out << "  " << (a.in_a ? "A " : "B ") << a.key << " -> "
        << (a.chosen.empty() ? std::string("(left unmatched)") : a.chosen) << "; could be:";
    for (const auto& cand : a.candidates) out << " " << cand;
    out << "\n";
  }
  if (c.ambiguities.size() > max_ambiguities) {
    out << "  ... and " << c.ambiguities.size() - max_ambiguities << " more (see --json)\n";
  }
}

void print_divergence(std::ostream& out, const Comparison& c, const TableStyle& st) {
  if (c.first_divergence) {
    const FirstDivergence& d = *c.first_divergence;
    out << "\n" << (st.color ? "\x1b[1;31m" : "") << d.summary << st.reset << "\n";
    if (!d.worst.empty()) {
      out << "  worst elements (index: A vs B, |A-B|):\n";
      for (const WorstElement& w : d.worst) {
        out << "    " << pad(shape_text(w.coord), 20) << "  " << pad(fmt(w.a, "%.8g"), 16, true) << " vs "
            << pad(fmt(w.b, "%.8g"), 16) << "  " << fmt(w.abs_err, "%.3e") << "\n";
      }
    }
  } else if (c.failed == 0) {
    out << (st.color ? "\x1b[32m" : "") << "No divergence: every compared tensor passes." << st.reset << "\n";
  }
}

}  // namespace

void print_table(std::ostream& out, const Comparison& c, const TableOptions& opt) {
  TableStyle st;
  st.color = opt.color;
  st.reset = opt.color ? "\x1b[0m" : "";
  st.bold = opt.color ? "\x1b[1m" : "";
  out << "A: " << c.a_source << "\nB: " << c.b_source << " (reference)\nprofile: " << profile_name(c.profile) << "\n";
  if (!c.order_note.empty()) out << c.order_note << "\n";
  if (!c.noise_note.empty()) out << c.noise_note << "\n";
  out << "\n";
  if (opt.all) {
    std::vector<const RowResult*> rows;
    for (const RowResult& r : c.rows) rows.push_back(&r);
    if (opt.order == RowOrder::failures_first) {
      std::stable_partition(rows.begin(), rows.end(), [](const RowResult* r) { return r->failed(); });
    }
    print_rows(out, rows, st);
  } else {
    std::vector<const RowResult*> failing, nearest;
    for (const RowResult& r : c.rows) {
      if (r.failed()) failing.push_back(&r);
      else if (r.status == RowStatus::pass && r.bound_use) nearest.push_back(&r);
    }
    const std::size_t shown = std::min(opt.nearest_rows, nearest.size());
    std::partial_sort(nearest.begin(), nearest.begin() + static_cast<std::ptrdiff_t>(shown), nearest.end(),
                      [](const RowResult* x, const RowResult* y) { return *x->bound_use > *y->bound_use; });
    nearest.resize(shown);
    if (!failing.empty()) {
      out << st.bold << "failing (" << failing.size() << "):" << st.reset << "\n";
      print_rows(out, failing, st);
      out << "\n";
    }
    if (!nearest.empty()) {
      out << st.bold << "passing, nearest their bound (" << nearest.size() << " of " << c.passed << "):" << st.reset << "\n";
      print_rows(out, nearest, st);
      out << "\n";
    }
    print_kind_counts(out, c, st);
    out << "(--all lists every row; --json and --csv keep them all)\n";
  }
  print_legend(out, c);
  print_ambiguities(out, c, opt.max_ambiguities);
  out << "\n" << st.bold << c.rows.size() << " tensors: " << c.passed << " pass, " << c.failed << " fail, " << c.missing_a
      << " only in B, " << c.missing_b << " only in A";
  if (c.skipped > 0) out << ", " << c.skipped << " not judged";
  out << st.reset << "\n";
  print_divergence(out, c, st);
}

std::string csv_header() {
  return "NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,Cosine,MaxAbsErr,"
         "MaxRelativeErr,One Thousandth Err Ratio,Five Thousandths Err Ratio,NPU max,NPU min,NPU mean,NPU l2norm,"
         "Bench max,Bench min,Bench mean,Bench l2norm,Accuracy Reached or Not,Err_message,"
         "MeanAbsErr,EucDist,RMSE,RelL2,AllcloseRatio,SQNR(dB),NaN/Inf Mismatch,Kind,Status,Match,"
         "NormRatio,Scale,ScaleStdErr,ScaleZ,ScaleNoiseP,RelL2Bound,NoiseRelL2,NoiseRatio,UpdateNoiseRelL2,"
         "UpdateNoiseRatio,BoundUse";
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
    auto opt = [](const std::optional<double>& v) { return v ? fmt(*v, "%.10g") : std::string("N/A"); };
    f.push_back(opt(r.metrics ? r.bounds.rel_l2_max : std::nullopt));
    for (const auto& v : {r.noise_rel_l2, r.noise_ratio, r.update_noise_rel_l2, r.update_noise_ratio, r.bound_use}) {
      f.push_back(opt(v));
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
