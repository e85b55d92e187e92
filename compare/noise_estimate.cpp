#include "compare/noise_estimate.hpp"

#include "compare/metrics.hpp"

namespace wb::compare {

namespace {

bool is_float(store::DType d) {
  return d == store::DType::F32 || d == store::DType::F64 || d == store::DType::F16 || d == store::DType::BF16;
}

// What a replay of the same step must reproduce exactly: what the step starts from.
bool is_step_input(TensorKind k) {
  return k == TensorKind::input || k == TensorKind::label || k == TensorKind::param || k == TensorKind::buffer;
}

bool same_bytes(const NamedTensor& a, const NamedTensor& b) {
  return a.tensor.dtype == b.tensor.dtype && a.tensor.shape == b.tensor.shape && a.tensor.data == b.tensor.data;
}

bool comparable(const NamedTensor& a, const NamedTensor& b) {
  return !a.stats_only() && !b.stats_only() && is_float(a.tensor.dtype) && a.tensor.dtype == b.tensor.dtype &&
         a.tensor.shape == b.tensor.shape;
}

}  // namespace

std::string noise_estimate_key(std::int32_t step, std::int32_t rank) {
  return "noise_estimate.step" + std::to_string(step) + ".rank" + std::to_string(rank);
}

NoiseEstimate estimate_noise(const TensorSet& dump, const std::vector<const TensorSet*>& replays, const std::string& method) {
  NoiseEstimate out;
  nlohmann::json tensors = nlohmann::json::object(), updates = nlohmann::json::object();
  // The largest of the replays' distances, per tensor and per field.
  auto keep_max = [](nlohmann::json& entry, const char* field, double v) {
    if (!entry.contains(field) || entry[field].get<double>() < v) entry[field] = v;
  };
  for (const NamedTensor& d : dump.tensors) {
    const TensorKind kind = kind_of_key(d.key);
    bool looked = false, moved = false;
    for (const TensorSet* replay : replays) {
      const NamedTensor* r = replay->find(d.key);
      if (r == nullptr) continue;
      if (is_step_input(kind)) {
        if (!same_bytes(d, *r)) {
          throw CompareError(replay->source + ": " + d.key + " differs from " + dump.source +
                             "'s: the replay is not the same step (expected the same input, labels, parameters and "
                             "buffers; the same seed and data)");
        }
        continue;
      }
      if (!comparable(d, *r)) continue;
      looked = true;
      const Metrics m = compute_metrics(d.tensor, r->tensor);
      // A tensor the other order left unchanged measured nothing: it keeps the fixed bounds.
      if (m.bit_exact) continue;
      moved = true;
      nlohmann::json& e = tensors[d.key];
      keep_max(e, "l2", m.euc_dist);
      keep_max(e, "max_abs", m.max_abs);
      e["ref_l2"] = m.a.l2norm;
      const NamedTensor* d0 = base_of(dump, d.key);
      const NamedTensor* r0 = base_of(*replay, d.key);
      if (d0 != nullptr && r0 != nullptr && comparable(*d0, d) && comparable(*r0, *r)) {
        const Metrics u = compute_update_metrics(view_of(d.tensor), view_of(d0->tensor), view_of(r->tensor),
                                                 view_of(r0->tensor));
        nlohmann::json& ue = updates[d.key];
        keep_max(ue, "l2", u.euc_dist);
        ue["ref_l2"] = u.a.l2norm;
      }
    }
    out.tensors += looked;
    out.moved += moved;
  }
  out.json = {{"version", 1}, {"method", method}, {"tensors", tensors}, {"updates", updates}};
  return out;
}

}  // namespace wb::compare
