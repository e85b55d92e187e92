#include "compare/divergence.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "compare/compare.hpp"
#include "compare/verdict.hpp"

namespace wb::compare {
namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  s += ']';
  return s;
}

bool forward_kind(TensorKind k) { return k == TensorKind::act || k == TensorKind::other; }

// The error a row carries into the walk: the update's for an updated parameter (momentum - grad for a
// momentum buffer), else the value's.
const Metrics* error_metrics(const RowResult& row) {
  if (row.update_metrics) return &*row.update_metrics;
  return row.metrics ? &*row.metrics : nullptr;
}

std::optional<std::size_t> find_row(const Comparison& cmp, const std::string& name) {
  for (std::size_t i = 0; i < cmp.rows.size(); ++i) {
    if (cmp.rows[i].name == name) return i;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::size_t> input_row(const Comparison& cmp, std::size_t r) {
  const RowResult& row = cmp.rows[r];
  auto previous = [&](auto pred) -> std::optional<std::size_t> {
    for (std::size_t i = r; i-- > 0;) {
      if (pred(cmp.rows[i].kind)) return i;
    }
    return std::nullopt;
  };
  switch (row.kind) {
    case TensorKind::act:
    case TensorKind::other:
      if (auto p = previous(forward_kind)) return p;
      return previous([](TensorKind k) { return k == TensorKind::input; });
    case TensorKind::loss: return previous(forward_kind);
    case TensorKind::grad:
      if (auto p = previous([](TensorKind k) { return k == TensorKind::grad; })) return p;
      return previous([](TensorKind k) { return k == TensorKind::loss; });
    case TensorKind::param_after:
    case TensorKind::momentum: return find_row(cmp, make_key("grad", base_name(row.name)));
    case TensorKind::buffer_after: {
      // Running statistics summarise the BatchNorm's input; its output is the closest dumped proxy.
      const std::string_view base = base_name(row.name);
      const auto dot = base.rfind('.');
      if (dot == std::string_view::npos) return std::nullopt;
      return find_row(cmp, make_key("act", base.substr(0, dot)));
    }
    case TensorKind::input:
    case TensorKind::label:
    case TensorKind::param:
    case TensorKind::buffer: return std::nullopt;
  }
  return std::nullopt;
}

std::optional<FirstDivergence> find_first_divergence(const Comparison& cmp, const TensorSet& a, const TensorSet& b,
                                                     std::size_t worst_count) {
  std::optional<std::size_t> first;
  for (std::size_t i = 0; i < cmp.rows.size() && !first; ++i) {
    if (cmp.rows[i].failed()) first = i;
  }
  if (!first) return std::nullopt;
  const RowResult& row = cmp.rows[*first];
  FirstDivergence d;
  d.row = *first;
  d.name = row.name;
  d.kind = row.kind;
  d.reason = row.reason;
  if (row.metrics && row.a_index && row.b_index && !a.tensors[*row.a_index].stats_only() &&
      !b.tensors[*row.b_index].stats_only()) {
    d.worst = worst_elements(view_of(a.tensors[*row.a_index].tensor), view_of(b.tensors[*row.b_index].tensor),
                             row.b_shape, worst_count);
  }
  const Metrics* own = error_metrics(row);
  if (own != nullptr) d.rel_l2 = own->rel_l2;

  const bool initial_state = row.kind == TensorKind::input || row.kind == TensorKind::label ||
                             row.kind == TensorKind::param || row.kind == TensorKind::buffer;
  const auto in = input_row(cmp, *first);
  const Metrics* in_m = in ? error_metrics(cmp.rows[*in]) : nullptr;
  if (in) d.input_name = cmp.rows[*in].name;
  if (in_m != nullptr) d.input_rel_l2 = in_m->rel_l2;
  d.noise_ratio = row.error_noise_ratio();
  if (in) d.input_noise_ratio = cmp.rows[*in].error_noise_ratio();
  if (own == nullptr || in_m == nullptr) {
    d.local = true;
  } else if (own->has_nonfinite() && !in_m->has_nonfinite()) {
    d.local = true;
    d.jump = std::numeric_limits<double>::infinity();
  } else if (d.noise_ratio && d.input_noise_ratio) {
    d.jump = *d.input_noise_ratio > 0.0 ? *d.noise_ratio / *d.input_noise_ratio : std::numeric_limits<double>::infinity();
    d.local = *d.jump >= kLocalJump;
  } else if (in_m->rel_l2 == 0.0) {
    d.local = true;
    d.jump = std::numeric_limits<double>::infinity();
  } else {
    d.jump = own->rel_l2 / in_m->rel_l2;
    d.local = *d.jump >= kLocalJump;
  }
  // A systematic scale is local when the input shows none, whatever their rel-L2s (the input's may be
  // plain noise as large as the scale itself).
  const bool scaled = row.reason.find("(systematic)") != std::string::npos;
  std::optional<double> input_scale;
  if (scaled && in_m != nullptr) {
    input_scale = systematic_scale(*in_m, 0.0);
    d.local = !input_scale.has_value();
  }
  const bool shape_mismatch = row.status == RowStatus::shape_mismatch;
  if (shape_mismatch) d.local = true;
  if (row.kind == TensorKind::param_after || row.kind == TensorKind::momentum) {
    for (const RowResult& r : cmp.rows) {
      if (r.kind == TensorKind::grad && r.status == RowStatus::pass) {
        d.optimizer_only = true;
        break;
      }
    }
  }

  std::string s = "First divergence: " + d.name + " (" + std::string(kind_name(d.kind)) + "): " + d.reason + ".";
  if (initial_state) {
    s += " A and B do not start from the same " +
         std::string(row.kind == TensorKind::input || row.kind == TensorKind::label ? "batch" : "state") +
         ": fix this before reading anything later.";
  } else if (d.optimizer_only) {
    s += " Optimizer-only divergence: the gradients match but the update does not; check the learning rate, "
         "momentum, dampening, weight decay and the update formula.";
    if (d.input_rel_l2) s += " (its gradient " + d.input_name + " has rel-L2 " + fmt(*d.input_rel_l2) + ")";
  } else if (shape_mismatch) {
    s += " A holds " + shape_text(row.a_shape) + " where B holds " + shape_text(row.b_shape) +
         ": the strongest sign of a divergence; the operation that produced it (its kernel, stride, padding or "
         "layout) is the likely cause" +
         (d.input_name.empty() ? std::string(".") : ", its input " + d.input_name + " having matching shapes.");
  } else if (d.input_name.empty() || in_m == nullptr) {
    s += " No input to compare with: treated as local.";
  } else if (scaled) {
    s += input_scale ? " Its input " + d.input_name + " is scaled too (by " + fmt(*input_scale) +
                           "): the scale is inherited."
                     : " Its input " + d.input_name + " shows no systematic scale (s = " + fmt(in_m->scale) +
                           ", rel-L2 " + fmt(in_m->rel_l2) + "): the scale is local, this operation is the likely cause.";
  } else if (d.noise_ratio && d.input_noise_ratio) {
    s += " Its input " + d.input_name + " is " + fmt(*d.input_noise_ratio) + "x the reference's own float32 noise, this row " +
         fmt(*d.noise_ratio) + "x (" + (!d.jump || std::isinf(*d.jump) ? std::string("from none") : fmt(*d.jump) + "x faster") +
         (d.local ? "): the error grows here faster than float32 noise does: this operation is the likely cause."
                  : ", under " + fmt(kLocalJump) + "x): the error grows as the reference's own noise does: inherited, "
                    "accumulated from earlier operations.");
  } else if (d.local) {
    s += " Its input " + d.input_name + " has rel-L2 " + fmt(*d.input_rel_l2) + (d.rel_l2 ? " against " + fmt(*d.rel_l2) : "") +
         " here (" + (!d.jump || std::isinf(*d.jump) ? std::string("from zero") : fmt(*d.jump) + "x") +
         "): the error is local, this operation is the likely cause.";
  } else {
    s += " Its input " + d.input_name + " already has rel-L2 " + fmt(*d.input_rel_l2) + " (x" + fmt(*d.jump) +
         " here, under " + fmt(kLocalJump) + "x): the error is inherited, accumulated from earlier operations.";
  }
  d.summary = s;
  return d;
}

nlohmann::json to_json(const FirstDivergence& d) {
  nlohmann::json j;
  j["name"] = d.name;
  j["kind"] = std::string(kind_name(d.kind));
  j["reason"] = d.reason;
  j["local"] = d.local;
  j["classification"] = d.optimizer_only ? "optimizer_only" : (d.local ? "local" : "inherited");
  j["optimizer_only"] = d.optimizer_only;
  j["input"] = d.input_name.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.input_name);
  auto num = [](const std::optional<double>& v) {
    if (!v) return nlohmann::json(nullptr);
    if (std::isinf(*v)) return nlohmann::json(*v > 0 ? "inf" : "-inf");
    if (std::isnan(*v)) return nlohmann::json("nan");
    return nlohmann::json(*v);
  };
  j["rel_l2"] = num(d.rel_l2);
  j["input_rel_l2"] = num(d.input_rel_l2);
  j["jump"] = num(d.jump);
  j["noise_ratio"] = num(d.noise_ratio);
  j["input_noise_ratio"] = num(d.input_noise_ratio);
  nlohmann::json worst = nlohmann::json::array();
  for (const auto& w : d.worst) {
    worst.push_back({{"index", w.index}, {"coord", w.coord}, {"a", num(w.a)}, {"b", num(w.b)}, {"abs_err", num(w.abs_err)}});
  }
  j["worst"] = worst;
  j["summary"] = d.summary;
  return j;
}

}  // namespace wb::compare
