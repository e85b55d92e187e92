#include "profiler/analysis/layer_diff.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "profiler/analysis/memory.hpp"
#include "profiler/analysis/report.hpp"
#include "profiler/analysis/steps.hpp"
#include "layout/resnet50.hpp"

namespace wb::analysis {

using store::Category;

const char* op_type_name(OpType t) {
  switch (t) {
    case OpType::conv: return "conv";
    case OpType::bn: return "bn";
    case OpType::relu: return "relu";
    case OpType::pool: return "pool";
    case OpType::fc: return "fc";
    case OpType::loss: return "loss";
    case OpType::optimizer: return "optimizer";
    case OpType::block: return "block";
    case OpType::other: return "other";
  }
  return "?";
}

bool is_layer_name(std::string_view s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  bool dot = true;
  for (char c : s) {
    if (c == '.') {
      if (dot) return false;
      dot = true;
      continue;
    }
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
    dot = false;
  }
  return !dot;
}

OpType op_type_of_layer(const std::string& name) {
  switch (layout::kind_of_name(name)) {
    case layout::NameKind::conv: return OpType::conv;
    case layout::NameKind::batch_norm: return OpType::bn;
    case layout::NameKind::relu: return OpType::relu;
    case layout::NameKind::maxpool:
    case layout::NameKind::avgpool: return OpType::pool;
    case layout::NameKind::fc: return OpType::fc;
    case layout::NameKind::block: return OpType::block;
    case layout::NameKind::loss: return OpType::loss;
    case layout::NameKind::optimizer: return OpType::optimizer;
    case layout::NameKind::other: return OpType::other;
  }
  return OpType::other;
}

namespace {

bool leaf(OpType t) { return t != OpType::block && t != OpType::other; }

int direction_rank(Category c) {
  switch (c) {
    case Category::forward: return 0;
    case Category::loss: return 1;
    case Category::backward: return 2;
    case Category::optimizer: return 3;
    default: return 4;
  }
}

bool layer_category(std::uint8_t c) {
  return c == static_cast<std::uint8_t>(Category::forward) || c == static_cast<std::uint8_t>(Category::backward) ||
         c == static_cast<std::uint8_t>(Category::loss) || c == static_cast<std::uint8_t>(Category::optimizer);
}

std::string meta_or(const RunData& run, const char* key, const char* fallback) {
  auto it = run.meta.find(key);
  return it == run.meta.end() ? fallback : it->second;
}

// The rank's steps to measure, by step, less the first `skip_steps` (or the default skip).
std::vector<store::StepRow> measured_steps(const RunData& run, const LayerOptions& options) {
  std::vector<store::StepRow> steps;
  for (const auto& s : run.steps)
    if (s.rank == options.rank) steps.push_back(s);
  std::sort(steps.begin(), steps.end(), [](const auto& x, const auto& y) { return x.step < y.step; });
  if (steps.empty())
    throw AnalysisError(concat(run.path.string(), ": rank ", std::to_string(options.rank), " has no steps to compare"));
  int skip = options.skip_steps >= 0 ? options.skip_steps : (steps.size() >= 3 ? 1 : 0);
  if (static_cast<std::size_t>(skip) >= steps.size())
    throw AnalysisError(concat(run.path.string(), ": --skip ", std::to_string(skip), " leaves none of its ",
                               std::to_string(steps.size()), " steps"));
  steps.erase(steps.begin(), steps.begin() + skip);
  return steps;
}

// The memory peak: the allocator's own high-water mark when the run recorded one, else the largest
// peak of the measured steps from the memory events.
void find_peak_memory(const RunData& run, int rank, RunLayers& out) {
  if (auto it = run.meta.find("max_memory_allocated"); it != run.meta.end()) {
    try {
      out.peak_memory = std::stoll(it->second);
      out.peak_memory_source = "max_memory_allocated";
    } catch (const std::exception&) {
      out.peak_memory = 0;
    }
  }
  if (out.peak_memory <= 0) {
    const std::set<int> measured(out.steps.begin(), out.steps.end());
    for (const StepMemory& m : analyze_memory(run).steps)
      if (m.rank == rank && measured.count(m.step) && m.peak_bytes > out.peak_memory) {
        out.peak_memory = m.peak_bytes;
        out.peak_memory_source = "memory events";
        out.peak_memory_op = m.peak_op;
      }
  }
}

// How the importer found each layer (meta.layer_match), or an empty object.
nlohmann::json layer_match(const RunData& run) {
  nlohmann::json match = nlohmann::json::object();
  if (auto it = run.meta.find("layer_match"); it != run.meta.end()) {
    match = nlohmann::json::parse(it->second, nullptr, false);
    if (match.is_discarded()) match = nlohmann::json::object();
  }
  return match;
}

// How a layer was found; wb-train's own layers (no layer_match) are named by the trainer.
std::string match_method(const nlohmann::json& match, const std::string& name, Category dir) {
  if (match.empty()) return "name";
  const char* key = dir == Category::backward ? "backward" : "forward";
  if (match.contains(key) && match[key].contains(name) && match[key][name].is_string()) return match[key][name].get<std::string>();
  return dir == Category::loss || dir == Category::optimizer ? "name" : "derived";
}

// One layer's time summed over the measured steps, until it is divided into means.
struct LayerAcc {
  LayerTime t;
  bool seen = false;
};

// The layer ranges of a rank's threads in the measured steps, by layer and direction, and the
// innermost layer of each range that launched device work, by correlation id.
struct LayerScan {
  std::map<std::pair<std::string, Category>, LayerAcc> acc;
  std::map<std::uint64_t, std::pair<const store::RangeRow*, LayerAcc*>> layer_of_corr;
};

LayerScan scan_layers(const RunData& run, int rank, std::map<int, std::int64_t>& step_start) {
  const nlohmann::json match = layer_match(run);
  LayerScan scan;
  for (const auto& track : run.tracks) {
    if (track.rank != rank || track.kind != store::TrackKind::thread) continue;
    const auto& rows = run.ranges_of(track.id);
    // Ranges come by start, enclosing first: a stack of the open layer ranges gives each launching
    // range its innermost layer.
    std::vector<std::pair<const store::RangeRow*, LayerAcc*>> open;
    for (const auto& r : rows) {
      while (!open.empty() && open.back().first->end_ns <= r.start_ns) open.pop_back();
      LayerAcc* layer = nullptr;
      const std::string& name = run.name(r.name);
      if (layer_category(r.category) && step_start.count(r.step) && is_layer_name(name) &&
          op_type_of_layer(name) != OpType::other) {
        auto dir = static_cast<Category>(r.category);
        LayerAcc& a = scan.acc[{name, dir}];
        std::int64_t off = r.start_ns - step_start[r.step];
        if (!a.seen || off < a.t.first_ns) a.t.first_ns = off;
        if (!a.seen) {
          a.t.name = name;
          a.t.direction = dir;
          a.t.type = op_type_of_layer(name);
          a.t.method = match_method(match, name, dir);
          a.seen = true;
        }
        a.t.ns += static_cast<double>(r.end_ns - r.start_ns);
        a.t.calls += 1;
        layer = &a;
        open.push_back({&r, layer});
      }
      if (r.corr_id != 0 && !open.empty()) scan.layer_of_corr[r.corr_id] = open.back();
    }
  }
  return scan;
}

// Adds the rank's device activities to the layers whose ranges launched them.
void count_kernels(const RunData& run, int rank, LayerScan& scan) {
  std::set<std::uint32_t> rank_streams;
  for (const auto& t : run.tracks)
    if (t.rank == rank && t.kind == store::TrackKind::stream) rank_streams.insert(t.id);
  for (const auto& [track, ks] : run.kernels) {
    if (!rank_streams.count(track)) continue;
    for (const auto& k : ks) {
      auto it = scan.layer_of_corr.find(k.corr_id);
      if (k.corr_id == 0 || it == scan.layer_of_corr.end()) continue;
      it->second.second->t.kernels += 1;
      it->second.second->t.kernel_ns += static_cast<double>(k.end_ns - k.start_ns);
    }
  }
}

// The layers' means over `n` steps: forward, loss, backward, optimizer, each in execution order.
std::vector<LayerTime> mean_layers(std::map<std::pair<std::string, Category>, LayerAcc>& acc, double n) {
  std::vector<LayerTime> layers;
  for (auto& [key, a] : acc) {
    a.t.ns /= n;
    a.t.calls /= n;
    a.t.kernels /= n;
    a.t.kernel_ns /= n;
    layers.push_back(a.t);
  }
  std::sort(layers.begin(), layers.end(), [](const LayerTime& x, const LayerTime& y) {
    int dx = direction_rank(x.direction), dy = direction_rank(y.direction);
    if (dx != dy) return dx < dy;
    if (x.first_ns != y.first_ns) return x.first_ns < y.first_ns;
    return x.name < y.name;
  });
  return layers;
}

// The step split, and what leaf layers of each type take of it.
void split_steps(const RunData& run, int rank, const std::map<int, std::int64_t>& step_start, double n,
                 RunLayers& out) {
  for (const auto& b : step_breakdown(run)) {
    if (b.rank != rank || !step_start.count(b.step)) continue;
    out.split.step_ns += static_cast<double>(b.total_ns) / n;
    out.split.compute_ns += static_cast<double>(b.compute_ns) / n;
    out.split.data_wait_ns += static_cast<double>(b.data_wait_ns) / n;
    out.split.comm_exposed_ns += static_cast<double>(b.comm_exposed_ns) / n;
    out.split.other_ns += static_cast<double>(b.other_ns) / n;
  }
  double in_layers = 0.0;
  for (OpType t : {OpType::conv, OpType::bn, OpType::relu, OpType::pool, OpType::fc, OpType::loss, OpType::optimizer})
    out.type_ns[t] = 0.0;
  for (const auto& l : out.layers)
    if (leaf(l.type)) {
      out.type_ns[l.type] += l.ns;
      in_layers += l.ns;
    }
  out.type_ns[OpType::other] = std::max(0.0, out.split.step_ns - in_layers);
}

}  // namespace

RunLayers layer_times(const RunData& run, const LayerOptions& options) {
  RunLayers out;
  out.rank = options.rank;
  out.framework = meta_or(run, "framework", "wb");
  out.device = meta_or(run, "device", "?");
  out.gpu = run.kernel_rows > 0;

  const std::vector<store::StepRow> steps = measured_steps(run, options);
  std::map<int, std::int64_t> step_start;
  for (const auto& s : steps) {
    out.steps.push_back(s.step);
    step_start[s.step] = s.start_ns;
  }
  const double n = static_cast<double>(steps.size());

  find_peak_memory(run, options.rank, out);

  LayerScan scan = scan_layers(run, options.rank, step_start);
  if (scan.acc.empty())
    throw AnalysisError(concat(run.path.string(), ": no layer ranges in the steps compared (expected module names like "
                               "layer1.0.conv1; a PyTorch trace is read with wb import torch-trace)"));
  count_kernels(run, options.rank, scan);
  out.layers = mean_layers(scan.acc, n);
  split_steps(run, options.rank, step_start, n, out);
  return out;
}

double LayerDiffRow::ratio() const {
  if (!a || !b || b->ns <= 0.0) return std::numeric_limits<double>::quiet_NaN();
  return a->ns / b->ns;
}

LayerDiff diff_layers(const RunLayers& a, const RunLayers& b, std::size_t top) {
  LayerDiff d;
  d.a = a;
  d.b = b;
  // A's layers in A's order; a layer only B has goes right after the layer B ran before it.
  auto make = [](const LayerTime& l) {
    LayerDiffRow r;
    r.name = l.name;
    r.direction = l.direction;
    r.type = l.type;
    return r;
  };
  std::map<std::pair<std::string, Category>, std::size_t> in_a;
  for (std::size_t i = 0; i < a.layers.size(); ++i) in_a[{a.layers[i].name, a.layers[i].direction}] = i;
  std::vector<std::vector<LayerDiffRow>> after(a.layers.size() + 1);  // [0]: before every A row
  std::vector<std::optional<LayerTime>> b_of_a(a.layers.size());
  std::size_t slot = 0;
  for (const auto& l : b.layers) {
    auto it = in_a.find({l.name, l.direction});
    if (it != in_a.end()) {
      b_of_a[it->second] = l;
      slot = it->second + 1;
      continue;
    }
    // a new direction starts after A's last row of the direction before it
    if (slot == 0 || a.layers[slot - 1].direction != l.direction) {
      slot = 0;
      for (std::size_t i = 0; i < a.layers.size(); ++i)
        if (direction_rank(a.layers[i].direction) < direction_rank(l.direction)) slot = i + 1;
    }
    LayerDiffRow r = make(l);
    r.b = l;
    after[slot].push_back(r);
  }
  for (const auto& r : after[0]) d.rows.push_back(r);
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    LayerDiffRow r = make(a.layers[i]);
    r.a = a.layers[i];
    r.b = b_of_a[i];
    d.rows.push_back(r);
    for (const auto& x : after[i + 1]) d.rows.push_back(x);
  }
  for (std::size_t i = 0; i < d.rows.size(); ++i)
    if (leaf(d.rows[i].type) && d.rows[i].a && d.rows[i].b) d.top_lost.push_back(i);
  std::stable_sort(d.top_lost.begin(), d.top_lost.end(),
                   [&](std::size_t x, std::size_t y) { return d.rows[x].lost_ns() > d.rows[y].lost_ns(); });
  if (d.top_lost.size() > top) d.top_lost.resize(top);
  return d;
}

namespace {

const char* dir_name(Category c) { return store::category_name(c).data(); }

nlohmann::json layer_json(const std::optional<LayerTime>& l) {
  if (!l) return nullptr;
  return {{"ns", l->ns}, {"calls", l->calls}, {"kernels", l->kernels}, {"kernel_ns", l->kernel_ns}, {"method", l->method}};
}

nlohmann::json run_json(const RunLayers& r) {
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [t, ns] : r.type_ns) types[op_type_name(t)] = ns;
  return {{"framework", r.framework},
          {"device", r.device},
          {"rank", r.rank},
          {"steps", r.steps},
          {"gpu", r.gpu},
          {"step_ns", r.split.step_ns},
          {"compute_ns", r.split.compute_ns},
          {"data_wait_ns", r.split.data_wait_ns},
          {"comm_exposed_ns", r.split.comm_exposed_ns},
          {"other_ns", r.split.other_ns},
          {"peak_memory_bytes", r.peak_memory},
          {"peak_memory_source", r.peak_memory_source},
          {"peak_memory_op", r.peak_memory_op},
          {"type_ns", types}};
}

std::string ratio_text(double a, double b) {
  if (!(b > 0.0) || !(a > 0.0)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", a / b);
  return buf;
}

std::string signed_ns(double ns) { return concat(ns < 0 ? "-" : "+", format_ns(std::fabs(ns))); }

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

}  // namespace

nlohmann::json to_json(const LayerDiff& d) {
  nlohmann::json j;
  j["a"] = run_json(d.a);
  j["b"] = run_json(d.b);
  j["layers"] = nlohmann::json::array();
  for (const auto& r : d.rows) {
    double ratio = r.ratio();
    j["layers"].push_back({{"name", r.name},
                           {"direction", dir_name(r.direction)},
                           {"type", op_type_name(r.type)},
                           {"a", layer_json(r.a)},
                           {"b", layer_json(r.b)},
                           {"ratio", std::isnan(ratio) ? nlohmann::json(nullptr) : nlohmann::json(ratio)},
                           {"lost_ns", r.lost_ns()}});
  }
  j["top_lost"] = nlohmann::json::array();
  for (std::size_t i : d.top_lost)
    j["top_lost"].push_back({{"name", d.rows[i].name}, {"direction", dir_name(d.rows[i].direction)}, {"lost_ns", d.rows[i].lost_ns()}});
  return j;
}

std::string to_csv(const LayerDiff& d) {
  std::ostringstream o;
  o << "name,direction,type,a_ns,b_ns,ratio,lost_ns,a_calls,b_calls,a_kernels,b_kernels,a_kernel_ns,b_kernel_ns,a_method,b_method\n";
  for (const auto& r : d.rows) {
    double ratio = r.ratio();
    o << csv_quote(r.name) << ',' << dir_name(r.direction) << ',' << op_type_name(r.type) << ',';
    o << (r.a ? std::to_string(r.a->ns) : "") << ',' << (r.b ? std::to_string(r.b->ns) : "") << ',';
    o << (std::isnan(ratio) ? "" : std::to_string(ratio)) << ',' << r.lost_ns() << ',';
    o << (r.a ? std::to_string(r.a->calls) : "") << ',' << (r.b ? std::to_string(r.b->calls) : "") << ',';
    o << (r.a ? std::to_string(r.a->kernels) : "") << ',' << (r.b ? std::to_string(r.b->kernels) : "") << ',';
    o << (r.a ? std::to_string(r.a->kernel_ns) : "") << ',' << (r.b ? std::to_string(r.b->kernel_ns) : "") << ',';
    o << (r.a ? r.a->method : "") << ',' << (r.b ? r.b->method : "") << '\n';
  }
  return o.str();
}

std::string to_text(const LayerDiff& d, bool all_rows) {
  std::ostringstream o;
  char line[512];
  auto steps_text = [](const RunLayers& r) {
    if (r.steps.empty()) return std::string("no steps");
    return std::to_string(r.steps.size()) + " steps (" + std::to_string(r.steps.front()) + ".." + std::to_string(r.steps.back()) + ")";
  };
  std::snprintf(line, sizeof line, "A: %s, %s, rank %d, %s\nB: %s, %s, rank %d, %s\n", d.a.framework.c_str(), d.a.device.c_str(),
                d.a.rank, steps_text(d.a).c_str(), d.b.framework.c_str(), d.b.device.c_str(), d.b.rank, steps_text(d.b).c_str());
  o << line << "Times are means per step; ratio = A / B; lost = A - B (positive: A is slower).\n\n";

  o << "Step time\n";
  std::snprintf(line, sizeof line, "  %-14s %12s %12s %8s %12s\n", "", "A", "B", "ratio", "lost");
  o << line;
  auto split_row = [&](const char* name, double a, double b) {
    std::snprintf(line, sizeof line, "  %-14s %12s %12s %8s %12s\n", name, format_ns(a).c_str(), format_ns(b).c_str(),
                  ratio_text(a, b).c_str(), signed_ns(a - b).c_str());
    o << line;
  };
  split_row("step", d.a.split.step_ns, d.b.split.step_ns);
  split_row("compute", d.a.split.compute_ns, d.b.split.compute_ns);
  split_row("data wait", d.a.split.data_wait_ns, d.b.split.data_wait_ns);
  split_row("exposed comm", d.a.split.comm_exposed_ns, d.b.split.comm_exposed_ns);
  split_row("other", d.a.split.other_ns, d.b.split.other_ns);

  auto peak_text = [](const RunLayers& r) {
    if (r.peak_memory <= 0) return std::string("not recorded");
    return format_bytes(static_cast<double>(r.peak_memory)) + " (" + r.peak_memory_source +
           (r.peak_memory_op.empty() ? "" : ", at " + r.peak_memory_op) + ")";
  };
  o << "\npeak memory A vs B: " << peak_text(d.a) << " vs " << peak_text(d.b);
  if (d.a.peak_memory > 0 && d.b.peak_memory > 0)
    o << ", ratio " << ratio_text(static_cast<double>(d.a.peak_memory), static_cast<double>(d.b.peak_memory));
  o << "\n";

  o << "\nBy op type (leaf layers, forward + backward; other = the rest of the step)\n";
  std::snprintf(line, sizeof line, "  %-14s %12s %12s %8s %12s\n", "type", "A", "B", "ratio", "lost");
  o << line;
  for (OpType t : {OpType::conv, OpType::bn, OpType::relu, OpType::pool, OpType::fc, OpType::loss, OpType::optimizer, OpType::other}) {
    auto get = [&](const RunLayers& r) {
      auto it = r.type_ns.find(t);
      return it == r.type_ns.end() ? 0.0 : it->second;
    };
    split_row(op_type_name(t), get(d.a), get(d.b));
  }

  const bool gpu = d.a.gpu || d.b.gpu;
  auto layer_header = [&]() {
    if (gpu)
      std::snprintf(line, sizeof line, "  %-24s %-9s %12s %12s %8s %12s %9s %12s %12s %-9s %-9s\n", "layer", "dir", "A", "B",
                    "ratio", "lost", "kernels", "A kernel", "B kernel", "A match", "B match");
    else
      std::snprintf(line, sizeof line, "  %-24s %-9s %12s %12s %8s %12s %-9s %-9s\n", "layer", "dir", "A", "B", "ratio", "lost",
                    "A match", "B match");
    o << line;
  };
  auto layer_row = [&](const LayerDiffRow& r) {
    std::string a = r.a ? format_ns(r.a->ns) : "-", b = r.b ? format_ns(r.b->ns) : "-";
    std::string ma = r.a ? r.a->method : "-", mb = r.b ? r.b->method : "-";
    if (gpu) {
      char k[32];
      std::snprintf(k, sizeof k, "%.0f/%.0f", r.a ? r.a->kernels : 0.0, r.b ? r.b->kernels : 0.0);
      std::snprintf(line, sizeof line, "  %-24s %-9s %12s %12s %8s %12s %9s %12s %12s %-9s %-9s\n", r.name.c_str(),
                    dir_name(r.direction), a.c_str(), b.c_str(), ratio_text(r.a_ns(), r.b_ns()).c_str(),
                    signed_ns(r.lost_ns()).c_str(), k, r.a ? format_ns(r.a->kernel_ns).c_str() : "-",
                    r.b ? format_ns(r.b->kernel_ns).c_str() : "-", ma.c_str(), mb.c_str());
    } else {
      std::snprintf(line, sizeof line, "  %-24s %-9s %12s %12s %8s %12s %-9s %-9s\n", r.name.c_str(), dir_name(r.direction),
                    a.c_str(), b.c_str(), ratio_text(r.a_ns(), r.b_ns()).c_str(), signed_ns(r.lost_ns()).c_str(), ma.c_str(),
                    mb.c_str());
    }
    o << line;
  };

  o << "\nTop " << d.top_lost.size() << " layers by time lost\n";
  layer_header();
  for (std::size_t i : d.top_lost) layer_row(d.rows[i]);

  o << "\nLayers" << (all_rows ? "" : " (leaf layers; --all adds blocks)") << "\n";
  layer_header();
  for (const auto& r : d.rows)
    if (all_rows || leaf(r.type)) layer_row(r);
  return o.str();
}

}  // namespace wb::analysis
