#include "compare/compare.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <cstdio>
#include <numeric>
#include <thread>
#include <tuple>

namespace wb::compare {
namespace {

// A reference whose own float32 noise is over this share of its norm is noise-dominated.
constexpr double kNoiseDominated = 0.5;

// Below this many elements in all, threads cost more than they save.
constexpr std::int64_t kParallelMinElements = 1 << 20;

std::string dtype_text(store::DType d) { return std::string(store::dtype_name(d)); }

// A 0-d scalar against a one-element tensor ([] vs [1]): frameworks save a loss either way.
bool one_element_each(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  auto one = [](const std::vector<std::int64_t>& s) { return s.empty() || (s.size() == 1 && s[0] == 1); };
  return one(a) && one(b);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

SideStats stats_of(const NamedTensor& t) {
  if (t.stats) {
    SideStats s;
    s.max = t.stats->max;
    s.min = t.stats->min;
    s.mean = t.stats->mean;
    s.l2norm = t.stats->norm;
    return s;
  }
  return compute_metrics(t.tensor, t.tensor).a;
}

// A pair where one side recorded statistics only (msprobe's task "statistics"): what they allow.
// The norm ratio bounds rel-L2 from below (| ||a|| - ||b|| | <= ||a - b||) and the differences of
// max, min and mean bound the max abs error from below; cosine, rel-L2 itself, the scale and
// element-wise checks need the elements and stay NaN.
void compute_stats_row(RowResult& row, const NamedTensor& ta, const NamedTensor& tb) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  Metrics m;
  m.numel = m.compared = tb.tensor.numel();
  m.a = stats_of(ta);
  m.b = stats_of(tb);
  m.norm_ratio = m.b.l2norm > 0 ? m.a.l2norm / m.b.l2norm : (m.a.l2norm == 0 ? 1.0 : kNaN);
  m.rel_l2 = std::isfinite(m.norm_ratio) ? std::fabs(1.0 - m.norm_ratio) : kNaN;
  m.max_abs = std::max({std::fabs(m.a.max - m.b.max), std::fabs(m.a.min - m.b.min), std::fabs(m.a.mean - m.b.mean)});
  m.mean_abs = m.max_rel = m.rmse = m.euc_dist = m.cosine = m.sqnr_db = kNaN;
  m.allclose_ratio = m.one_thousandth_ratio = m.five_thousandths_ratio = kNaN;
  m.scale = m.scale_stderr = m.scale_z = m.scale_noise_p = m.residual_rel_l2 = kNaN;
  row.metrics = m;
  const Thresholds& t = row.thresholds;
  const std::string allows =
      "statistics only: norm ratio, max, min and mean compared; rel-L2, cosine, max abs error and the scale need "
      "the tensors";
  auto fail = [&](const std::string& why) {
    row.status = RowStatus::fail;
    row.reason = why + " (" + allows + ")";
  };
  char buf[160];
  if (t.bit_exact) {
    // Recorded by the producer in fp32: Max and Min exactly, Mean and Norm as fp32 reductions over n
    // elements, whose rounding grows like sqrt(n) ulps (3.5e-5 relative on a 2.4M-element weight).
    const double n = static_cast<double>(std::max<std::int64_t>(m.numel, 1));
    const double tol = 4.0 * 0x1p-23 * std::sqrt(n);
    const double rms = m.b.l2norm / std::sqrt(n);
    const bool same = m.a.max == m.b.max && m.a.min == m.b.min &&
                      std::fabs(m.a.mean - m.b.mean) <= tol * (std::fabs(m.b.mean) + rms) &&
                      std::fabs(m.a.l2norm - m.b.l2norm) <= tol * m.b.l2norm;
    if (!same) {
      std::snprintf(buf, sizeof buf, "statistics differ: max %.7g vs %.7g, min %.7g vs %.7g, norm %.7g vs %.7g",
                    m.a.max, m.b.max, m.a.min, m.b.min, m.a.l2norm, m.b.l2norm);
      return fail(buf);
    }
  }
  if (t.rel_l2_max && !(m.rel_l2 <= *t.rel_l2_max)) {
    std::snprintf(buf, sizeof buf, "norm ratio %.6g: rel-L2 is at least %.4g > %.4g", m.norm_ratio, m.rel_l2,
                  *t.rel_l2_max);
    return fail(buf);
  }
  if (t.max_abs_max && m.max_abs > *t.max_abs_max) {
    std::snprintf(buf, sizeof buf, "max abs error at least %.4g > %.4g", m.max_abs, *t.max_abs_max);
    return fail(buf);
  }
  row.status = RowStatus::pass;
  row.reason = allows;
}

// The row's bounds from the reference's noise, and its error in units of that noise.
void apply_noise(RowResult& row, const NoiseScale& n) {
  const Metrics& m = *row.metrics;
  const Metrics* u = row.update_metrics ? &*row.update_metrics : nullptr;
  row.bounds = with_noise(row.thresholds, n, m, u);
  row.noise_applied = true;
  row.noise_flips = n.flip_l2.has_value();
  row.noise_rel_l2 = norm_ratio(n.value_l2(), m.b.l2norm);
  row.noise_ratio = norm_ratio(m.euc_dist, n.value_l2());
  if (u != nullptr && n.update_value_l2()) {
    row.update_noise_rel_l2 = norm_ratio(*n.update_value_l2(), u->b.l2norm);
    row.update_noise_ratio = norm_ratio(u->euc_dist, *n.update_value_l2());
  }
}

// The largest error / bound over the checks with a bound (RowResult::bound_use).
std::optional<double> bound_use(const Thresholds& t, const Metrics& m, const Metrics* u) {
  std::optional<double> use;
  auto add = [&](double error, double bound) {
    if (!(bound > 0.0) || std::isnan(error)) return;
    use = std::max(use.value_or(0.0), error / bound);
  };
  if (t.rel_l2_max) add(m.rel_l2, *t.rel_l2_max);
  if (t.cosine_min) add(1.0 - m.cosine, 1.0 - *t.cosine_min);
  if (t.max_abs_max) add(m.max_abs, *t.max_abs_max);
  if (u != nullptr && t.update_rel_l2_max) add(u->rel_l2, *t.update_rel_l2_max);
  if (u != nullptr && t.update_cosine_min) add(1.0 - u->cosine, 1.0 - *t.update_cosine_min);
  return use;
}

// The noise a row is judged against: the reference's own (B's wb.noise); when B records none, our own
// step's (A's estimate from a replay with another summation order, noise_estimate.hpp).
const NoiseScale* noise_for(const TensorSet& a, const TensorSet& b, const std::string& a_key, const std::string& b_key) {
  const bool ours = b.noise.empty();
  const auto& noise = ours ? a.noise : b.noise;
  const auto it = noise.find(ours ? a_key : b_key);
  return it != noise.end() ? &it->second : nullptr;
}

void compute_row(RowResult& row, const TensorSet& a, const TensorSet& b) {
  const NamedTensor& ta = a.tensors[*row.a_index];
  const NamedTensor& tb = b.tensors[*row.b_index];
  if (ta.stats_only() || tb.stats_only()) {
    compute_stats_row(row, ta, tb);
    return;
  }
  row.metrics = compute_metrics(ta.tensor, tb.tensor, row.thresholds.tolerance);
  if (row.kind == TensorKind::param_after || row.kind == TensorKind::momentum) {
    const NamedTensor* a0 = base_of(a, ta.key);
    const NamedTensor* b0 = base_of(b, tb.key);
    if (a0 != nullptr && b0 != nullptr && !a0->stats_only() && !b0->stats_only() &&
        a0->tensor.numel() == ta.tensor.numel() &&
        b0->tensor.numel() == tb.tensor.numel()) {
      row.update_metrics = compute_update_metrics(view_of(ta.tensor), view_of(a0->tensor), view_of(tb.tensor),
                                                  view_of(b0->tensor), row.thresholds.tolerance);
    }
  }
  row.bounds = row.thresholds;
  if (row.thresholds.noise_k) {
    if (const NoiseScale* n = noise_for(a, b, ta.key, tb.key)) apply_noise(row, *n);
  }
  row.bound_use = bound_use(row.bounds, *row.metrics, row.update_metrics ? &*row.update_metrics : nullptr);
  const bool same_dtype = ta.tensor.dtype == tb.tensor.dtype;
  const Verdict v = judge(row.bounds, *row.metrics, row.update_metrics ? &*row.update_metrics : nullptr, same_dtype,
                          row.kind == TensorKind::momentum ? "momentum-grad" : "update");
  row.status = v.pass ? RowStatus::pass : RowStatus::fail;
  row.reason = v.reason;
  auto add_note = [&](const std::string& note) { row.reason = row.reason.empty() ? note : row.reason + "; " + note; };
  // A row failing on another check still says when its error is a systematic scale (a doubled gradient).
  if (!v.pass && row.bounds.scale_shift_min && v.reason.find("(systematic)") == std::string::npos) {
    const Metrics& scaled = row.update_metrics ? *row.update_metrics : *row.metrics;
    if (systematic_scale(scaled, *row.bounds.scale_shift_min)) {
      char s[32];
      std::snprintf(s, sizeof s, "%.4g", scaled.scale);
      add_note(std::string(row.update_metrics ? "update " : "") + "scaled by " + s + " (systematic)");
    }
  }
  if (!same_dtype) add_note("dtypes differ: " + dtype_text(ta.tensor.dtype) + " vs " + dtype_text(tb.tensor.dtype));
  if (ta.tensor.shape != tb.tensor.shape) {
    add_note("shapes " + shape_text(ta.tensor.shape) + " vs " + shape_text(tb.tensor.shape) + " hold one value each");
  }
}

}  // namespace

std::string_view status_name(RowStatus status) {
  switch (status) {
    case RowStatus::pass: return "pass";
    case RowStatus::fail: return "fail";
    case RowStatus::shape_mismatch: return "shape_mismatch";
    case RowStatus::missing_a: return "missing_a";
    case RowStatus::missing_b: return "missing_b";
    case RowStatus::skipped: return "skipped";
  }
  return "?";
}

namespace {

// Each tensor's position in its side's walk order.
std::vector<std::int64_t> walk_positions(const TensorSet& set) {
  std::vector<std::int64_t> pos(set.tensors.size());
  const auto walk = set.walk_order();
  for (std::size_t p = 0; p < walk.size(); ++p) pos[walk[p]] = static_cast<std::int64_t>(p);
  return pos;
}

// Which side's execution order the walk follows, and why.
void describe_order(Comparison& cmp, const TensorSet& a, const TensorSet& b) {
  if (a.order_source == OrderSource::recorded) {
    cmp.order_side = "A";
    cmp.order_note = "execution order: A's (" + a.order_origin + ")";
  } else if (b.order_source == OrderSource::recorded) {
    cmp.order_side = "B";
    cmp.order_note = "execution order: B's (" + b.order_origin + ")";
  } else {
    cmp.order_side = "none";
    cmp.order_note = "execution order: neither side recorded one (A: " + a.order_origin + "; B: " + b.order_origin +
                     "), so the walk follows the ResNet-50 module order known from the names";
  }
}

// Position of each row on the leading side; for a row only on the other side, the leading position
// of the nearest earlier row (in the other side's walk) that has one, and its own position there.
std::vector<std::pair<std::int64_t, std::int64_t>> lead_positions(const std::vector<MatchedPair>& pairs, const TensorSet& a,
                                                                  const TensorSet& b, bool a_leads) {
  const std::vector<std::int64_t> a_pos = walk_positions(a), b_pos = walk_positions(b);
  std::vector<std::pair<std::int64_t, std::int64_t>> lead_pos(pairs.size());
  for (std::size_t r = 0; r < pairs.size(); ++r) {
    const auto& p = pairs[r];
    if (a_leads ? p.a.has_value() : p.b.has_value()) lead_pos[r] = {a_leads ? a_pos[*p.a] : b_pos[*p.b], -1};
  }
  // The other side's walk over every row it holds, to find each orphan's predecessor.
  std::vector<std::pair<std::int64_t, std::size_t>> other;
  for (std::size_t r = 0; r < pairs.size(); ++r) {
    const auto& p = pairs[r];
    const auto& side = a_leads ? p.b : p.a;
    if (side) other.emplace_back(a_leads ? b_pos[*side] : a_pos[*side], r);
  }
  std::sort(other.begin(), other.end());
  std::int64_t last = -1;
  for (const auto& [pos, r] : other) {
    const auto& p = pairs[r];
    if (a_leads ? p.a.has_value() : p.b.has_value()) {
      last = lead_pos[r].first;
    } else {
      lead_pos[r] = {last, pos};
    }
  }
  return lead_pos;
}

// A matched pair's row: its keys, dtypes, shapes, kind and thresholds (defaults, the loss bound scaled
// by the summed micro-batch losses, then the mapping's overrides), and its status when one side is
// missing or the shapes differ. Pairs to measure stay at pass until their metrics judge them.
RowResult pair_row(const MatchedPair& p, const TensorSet& a, const TensorSet& b, const CompareOptions& options) {
  RowResult row;
  row.a_index = p.a;
  row.b_index = p.b;
  row.method = p.method;
  if (p.a) {
    const auto& t = a.tensors[*p.a];
    row.a_key = t.key;
    row.a_dtype = t.tensor.dtype;
    row.a_shape = t.tensor.shape;
  }
  if (p.b) {
    const auto& t = b.tensors[*p.b];
    row.b_key = t.key;
    row.b_dtype = t.tensor.dtype;
    row.b_shape = t.tensor.shape;
  }
  row.name = p.b ? row.b_key : row.a_key;
  row.kind = kind_of_key(row.name);
  if (row.kind == TensorKind::other && p.a) row.kind = kind_of_key(row.a_key);
  row.thresholds = default_thresholds(options.profile, row.kind, row.b_dtype ? *row.b_dtype : *row.a_dtype);
  // A pipeline step's summed loss: the bound holds for each micro-batch loss in the sum.
  if (row.kind == TensorKind::loss && row.thresholds.max_abs_max) {
    *row.thresholds.max_abs_max *= std::max(a.loss_terms, b.loss_terms);
  }
  if (options.mapping != nullptr) {
    for (const auto& rule : options.mapping->thresholds) {
      if ((!row.a_key.empty() && std::regex_search(row.a_key, rule.re)) ||
          (!row.b_key.empty() && std::regex_search(row.b_key, rule.re))) {
        apply_threshold_override(row.thresholds, rule.fields, options.mapping->origin + ": thresholds \"" + rule.pattern + "\"");
      }
    }
  }
  row.bounds = row.thresholds;
  if (!p.a) {
    row.status = RowStatus::missing_a;
    row.reason = "missing in A";
  } else if (!p.b) {
    row.status = RowStatus::missing_b;
    row.reason = "missing in B";
  } else if (row.a_shape != row.b_shape && !one_element_each(row.a_shape, row.b_shape)) {
    row.status = RowStatus::shape_mismatch;
    row.reason = "shape mismatch: " + shape_text(row.a_shape) + " vs " + shape_text(row.b_shape);
  }
  return row;
}

// Metrics of every pair still to judge, largest tensors first so the threads finish together.
void compute_rows(std::vector<RowResult>& rows, const TensorSet& a, const TensorSet& b, unsigned threads_option) {
  std::vector<std::size_t> work;
  std::int64_t total_elements = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const RowResult& row = rows[r];
    if (row.a_index && row.b_index && row.status == RowStatus::pass) {
      work.push_back(r);
      total_elements += b.tensors[*row.b_index].tensor.numel();
    }
  }
  std::stable_sort(work.begin(), work.end(), [&](std::size_t x, std::size_t y) {
    return b.tensors[*rows[x].b_index].tensor.numel() > b.tensors[*rows[y].b_index].tensor.numel();
  });
  unsigned threads = threads_option != 0 ? threads_option : std::max(1u, std::thread::hardware_concurrency());
  if (total_elements < kParallelMinElements) threads = 1;
  threads = std::min<unsigned>(threads, static_cast<unsigned>(std::max<std::size_t>(work.size(), 1)));
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t k = next++; k < work.size(); k = next++) compute_row(rows[work[k]], a, b);
  };
  if (threads <= 1) {
    worker();
  } else {
    std::vector<std::jthread> pool;
    for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
  }
}

// Kinds a side marked as not comparable keep their metrics but no verdict.
void skip_not_comparable(std::vector<RowResult>& rows, const TensorSet& a, const TensorSet& b) {
  for (RowResult& row : rows) {
    if (!row.metrics || !(a.not_comparable.count(row.kind) || b.not_comparable.count(row.kind))) continue;
    row.status = RowStatus::skipped;
    row.reason = "not judged: " + std::string(kind_name(row.kind)) + " marked not comparable (" +
                 (b.not_comparable.count(row.kind) ? b.source : a.source) + ")";
  }
}

// The rows in walk order (by their sort keys, stably), numbered by their walk position.
void sort_walk_order(std::vector<RowResult>& rows, const std::vector<std::tuple<int, std::int64_t, std::int64_t>>& sort_keys) {
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return sort_keys[x] < sort_keys[y]; });
  std::vector<RowResult> sorted;
  sorted.reserve(rows.size());
  for (std::size_t p = 0; p < order.size(); ++p) {
    sorted.push_back(std::move(rows[order[p]]));
    sorted.back().walk_position = static_cast<std::int64_t>(p);
  }
  rows = std::move(sorted);
}

// Rows whose reference is more noise than signal (its own float32 noise over half its norm), or whose
// input row is such, are not judged: nothing a port does can show there (the loss of a step whose
// logits are noise, and the backward that starts from it). Returns how many.
std::int64_t skip_ill_conditioned(std::vector<RowResult>& rows, const Comparison& cmp) {
  char buf[160];
  std::int64_t skipped = 0;
  std::vector<char> ill(rows.size(), 0);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    RowResult& row = rows[r];
    if (!row.metrics || (row.status != RowStatus::pass && row.status != RowStatus::fail)) continue;
    const auto in = input_row(cmp, r);
    if (row.noise_applied && row.noise_rel_l2 && *row.noise_rel_l2 > kNoiseDominated) {
      std::snprintf(buf, sizeof buf, "not judged: ill-conditioned (PyTorch's own float32 is %.3g from float64 here)",
                    *row.noise_rel_l2);
    } else if (in && ill[*in]) {
      std::snprintf(buf, sizeof buf, "not judged: ill-conditioned (its input %s is)", rows[*in].name.c_str());
    } else {
      continue;
    }
    ill[r] = 1;
    row.status = RowStatus::skipped;
    row.reason = buf;
    ++skipped;
  }
  return skipped;
}

// A reference noise above this rel-L2 leaves a tensor unable to show small errors.
constexpr double kIllConditioned = 0.1;

void describe_noise(Comparison& cmp, const TensorSet& a, const TensorSet& b, std::int64_t not_judged) {
  std::int64_t used = 0, judged = 0, noisy = 0;
  for (const RowResult& row : cmp.rows) {
    if (row.metrics && row.thresholds.noise_k && !row.thresholds.bit_exact) ++judged;
    if (row.noise_applied) ++used;
    if (row.noise_applied && row.error_noise_rel_l2() && *row.error_noise_rel_l2() > kIllConditioned) ++noisy;
  }
  if (judged == 0) return;
  if (b.noise.empty() && a.noise.empty()) {
    cmp.noise_note = "bounds: fixed thresholds (the reference records no float32 noise; torch_step.py writes it "
                     "unless run with --no-noise, and wb estimate-noise measures our own step's)";
    return;
  }
  const bool ours = b.noise.empty();
  cmp.noise_source = ours ? "ours" : "reference";
  char k[32];
  std::snprintf(k, sizeof k, "%g", kNoiseK);
  cmp.noise_note = "bounds: within " + std::string(k) + "x " +
                   (ours ? "our own step's float32 noise (" + a.noise_method + "; the reference records none)"
                         : "the reference's own float32 noise (" + b.noise_method + ")") +
                   " on " + std::to_string(used) + " of " + std::to_string(judged) + " tensors" +
                   (used < judged ? "; fixed thresholds on the rest" : "");
  if (noisy > 0) {
    cmp.noise_note += "\nwarning: on " + std::to_string(noisy) + " tensors " +
                      (ours ? "our own float32 result moves by over 10% with the summation order"
                            : "PyTorch's own float32 result is over 10% from float64") +
                      ": this step is ill-conditioned (batch norms over a few values per channel), "
                      "so those tensors cannot show a port's small errors";
    if (not_judged > 0) cmp.noise_note += ", and " + std::to_string(not_judged) + " are not judged at all";
    cmp.noise_note += "; compare a step with a larger batch or images";
  }
}

void count_statuses(Comparison& cmp) {
  for (const RowResult& row : cmp.rows) {
    switch (row.status) {
      case RowStatus::pass: ++cmp.passed; break;
      case RowStatus::fail:
      case RowStatus::shape_mismatch: ++cmp.failed; break;
      case RowStatus::missing_a: ++cmp.missing_a; break;
      case RowStatus::missing_b: ++cmp.missing_b; break;
      case RowStatus::skipped: ++cmp.skipped; break;
    }
  }
}

}  // namespace

Comparison compare_sets(const TensorSet& a, const TensorSet& b, const CompareOptions& options) {
  MatchOptions mo;
  mo.mapping = options.mapping;
  mo.auto_match = options.auto_match;
  MatchResult matched = match_tensors(a, b, mo);
  const bool any_pair = std::any_of(matched.pairs.begin(), matched.pairs.end(),
                                    [](const MatchedPair& p) { return p.a && p.b; });
  if (!any_pair && !a.tensors.empty() && !b.tensors.empty()) {
    throw CompareError(a.source + " vs " + b.source +
                       ": no tensor of A matches one of B by name, mapping or order and shape "
                       "(expected the same dump keys, or a mapping file given with --map)");
  }

  Comparison cmp;
  cmp.a_source = a.source;
  cmp.b_source = b.source;
  cmp.profile = options.profile;
  cmp.ambiguities = std::move(matched.ambiguities);

  // The walk follows the side that recorded its execution order, A first; a file's key order never
  // counts. Rows the ordering side lacks go right after the row before them in the other side's order.
  const bool a_leads = a.order_source == OrderSource::recorded || b.order_source != OrderSource::recorded;
  describe_order(cmp, a, b);
  const std::vector<std::pair<std::int64_t, std::int64_t>> lead_pos = lead_positions(matched.pairs, a, b, a_leads);

  std::vector<std::tuple<int, std::int64_t, std::int64_t>> sort_keys;
  for (const MatchedPair& p : matched.pairs) {
    RowResult row = pair_row(p, a, b, options);
    const auto [lead, tie] = lead_pos[cmp.rows.size()];
    sort_keys.emplace_back(walk_rank(row.kind), lead, tie);
    cmp.rows.push_back(std::move(row));
  }

  compute_rows(cmp.rows, a, b, options.threads);
  skip_not_comparable(cmp.rows, a, b);
  sort_walk_order(cmp.rows, sort_keys);
  const std::int64_t ill = skip_ill_conditioned(cmp.rows, cmp);
  count_statuses(cmp);
  describe_noise(cmp, a, b, ill);
  cmp.first_divergence = find_first_divergence(cmp, a, b, options.worst_count);
  return cmp;
}

}  // namespace wb::compare
