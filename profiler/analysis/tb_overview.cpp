// tb_overview: a rank's host ranges and device rows -> classes of intervals -> device-side step bounds ->
// the priority split of each step -> the GPU summary -> recommendations. Each rule names the function of
// the plugin it reproduces (kineto tb_plugin/torch_tb_profiler/profiler/).
#include "profiler/analysis/tb_overview.hpp"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "profiler/analysis/intervals.hpp"


namespace wb::analysis {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// A runtime API call by name: CUDA runtime ("cudaLaunchKernel"), driver ("cuLaunchKernel") or HIP.
bool is_runtime_call(std::string_view n) {
  auto api = [&](std::string_view prefix) {
    return starts_with(n, prefix) && n.size() > prefix.size() && std::isupper(static_cast<unsigned char>(n[prefix.size()]));
  };
  return api("cuda") || api("cu") || api("hip");
}

bool is_comm_kernel(std::string_view n) {
  return n.size() >= 4 && std::tolower(static_cast<unsigned char>(n[0])) == 'n' && std::tolower(static_cast<unsigned char>(n[1])) == 'c' &&
         std::tolower(static_cast<unsigned char>(n[2])) == 'c' && std::tolower(static_cast<unsigned char>(n[3])) == 'l';
}

// The device a stream track runs on: "cuda:N stream S" (imports and wb-train's CUDA runs), else 0.
int device_of_track(const std::string& label) {
  int d = 0;
  if (std::sscanf(label.c_str(), "cuda:%d", &d) == 1) return d;
  return 0;
}

// One rank's rows, classified.
struct RankRows {
  std::array<Intervals, kStepClasses - 1> roles;  // every class but Other, unmerged
  std::int64_t cpu_min = std::numeric_limits<std::int64_t>::max(), cpu_max = std::numeric_limits<std::int64_t>::min();
  std::unordered_map<std::uint64_t, const store::RangeRow*> launcher;  // corr id -> launching range
  struct Device {
    const store::KernelRow* row;
    int device;
  };
  std::vector<Device> device_rows;
};

RankRows classify(const RunData& run, int rank) {
  RankRows out;
  const bool imported = run.meta.count("framework") && run.meta.at("framework") == "pytorch";
  std::unordered_set<std::string> added;  // layer ranges the importer added: not PyTorch's ops
  if (auto it = run.meta.find("layer_ranges_added"); it != run.meta.end()) {
    const auto names = nlohmann::json::parse(it->second, nullptr, false);
    if (names.is_array())
      for (const auto& n : names)
        if (n.is_string()) added.insert(n.get<std::string>());
  }
  for (const auto& [track_id, rows] : run.ranges) {
    const store::TrackRow* t = run.track(track_id);
    if (!t || t->rank != rank || ends_with(run.name(t->name), store::kPythonTrackSuffix)) continue;
    for (const store::RangeRow& r : rows) {
      if (r.corr_id != 0) out.launcher.emplace(r.corr_id, &r);
      const auto cat = static_cast<store::Category>(r.category);
      if (cat == store::Category::step) continue;
      const std::string& name = run.name(r.name);
      if (added.count(name)) continue;
      const Interval iv{r.start_ns, r.end_ns};
      StepClass c = StepClass::cpu_exec;
      if (is_runtime_call(name)) c = StepClass::runtime;
      else if (starts_with(name, "nccl:") || starts_with(name, "gloo:") || (!imported && cat == store::Category::comm))
        c = StepClass::communication;
      else if (cat == store::Category::data) c = StepClass::dataloader;
      out.roles[static_cast<std::size_t>(c)].push_back(iv);
      if (c != StepClass::runtime) {
        out.cpu_min = std::min(out.cpu_min, r.start_ns);
        out.cpu_max = std::max(out.cpu_max, r.end_ns);
      }
    }
  }
  for (const auto& [track_id, rows] : run.kernels) {
    const store::TrackRow* t = run.track(track_id);
    if (!t || t->rank != rank) continue;
    const int device = device_of_track(run.name(t->name));
    for (const store::KernelRow& k : rows) {
      out.device_rows.push_back({&k, device});
      const Interval iv{k.start_ns, k.end_ns};
      switch (static_cast<store::KernelKind>(k.kind)) {
        case store::KernelKind::kernel:
          out.roles[static_cast<std::size_t>(is_comm_kernel(run.name(k.name)) ? StepClass::communication : StepClass::kernel)]
              .push_back(iv);
          break;
        case store::KernelKind::memcpy: out.roles[static_cast<std::size_t>(StepClass::memcpy)].push_back(iv); break;
        case store::KernelKind::memset: out.roles[static_cast<std::size_t>(StepClass::memset)].push_back(iv); break;
      }
    }
  }
  return out;
}

// event_parser.StepParser._find_device_steps and _update_steps_duration: a step's device rows are those
// launched from inside its host span; the step then runs from the previous step's end (or its own host
// start) to the later of its host end and its last device row's end; trailing steps that launched
// nothing, or under 0.8x the device rows of the step before, are removed.
void device_side_steps(RankOverview& ro, const RankRows& rows) {
  auto& steps = ro.steps;
  const std::size_t n = steps.size();
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  std::vector<Interval> device(n, {kNone, std::numeric_limits<std::int64_t>::min()});
  std::vector<std::int64_t> matched(n, 0);
  std::vector<bool> row_matched(rows.device_rows.size(), false);
  bool any = false;
  for (std::size_t i = 0; i < rows.device_rows.size(); ++i) {
    const store::KernelRow& k = *rows.device_rows[i].row;
    auto it = k.corr_id != 0 ? rows.launcher.find(k.corr_id) : rows.launcher.end();
    if (it == rows.launcher.end()) continue;
    const store::RangeRow& l = *it->second;
    auto s = std::upper_bound(steps.begin(), steps.end(), l.start_ns,
                              [](std::int64_t t, const OverviewStep& st) { return t < st.host_start_ns; });
    if (s == steps.begin()) continue;
    --s;
    if (l.end_ns > s->host_end_ns) continue;  // straddles the step's end
    const std::size_t si = static_cast<std::size_t>(s - steps.begin());
    device[si].first = std::min(device[si].first, k.start_ns);
    device[si].second = std::max(device[si].second, k.end_ns);
    ++matched[si];
    row_matched[i] = any = true;
  }
  if (!any) return;
  std::int64_t prev_end = steps[0].host_start_ns;
  if (device[0].first != kNone)
    for (std::size_t i = 0; i < rows.device_rows.size(); ++i)
      if (!row_matched[i] && rows.device_rows[i].row->end_ns < device[0].first)
        prev_end = std::max(prev_end, rows.device_rows[i].row->end_ns);
  for (std::size_t i = 0; i < n; ++i) {
    OverviewStep& s = steps[i];
    s.start_ns = std::max(prev_end, s.host_start_ns);
    s.end_ns = device[i].first == kNone ? std::max(s.host_end_ns, s.start_ns) : std::max(s.host_end_ns, device[i].second);
    s.end_ns = std::max(s.end_ns, s.start_ns);
    prev_end = s.end_ns;
  }
  if (n > 1) {
    std::ptrdiff_t last = static_cast<std::ptrdiff_t>(n) - 1;
    while (last >= 0 && matched[static_cast<std::size_t>(last)] == 0) --last;
    if (last >= 0) {
      std::size_t keep = static_cast<std::size_t>(last) + 1;
      if (last > 0 && static_cast<double>(matched[static_cast<std::size_t>(last) - 1]) * 0.8 >
                          static_cast<double>(matched[static_cast<std::size_t>(last)]))
        keep = static_cast<std::size_t>(last);
      ro.removed_tail_steps = static_cast<int>(n - keep);
      steps.resize(keep);
    }
  }
}

// overall_parser.Statistics.create_from_range: each class takes what the classes before it left of the
// steps; Other is the rest.
void split_steps(RankOverview& ro, const RankRows& rows) {
  Intervals step_spans;
  for (const OverviewStep& s : ro.steps) step_spans.emplace_back(s.start_ns, s.end_ns);
  Intervals slots = merged(step_spans);
  std::array<Intervals, kStepClasses> cost;
  for (int c = 0; c < kStepClasses - 1; ++c) {
    cost[static_cast<std::size_t>(c)] = intersect(merged(rows.roles[static_cast<std::size_t>(c)]), slots);
    slots = subtract(slots, cost[static_cast<std::size_t>(c)]);
  }
  cost[kStepClasses - 1] = slots;
  for (OverviewStep& s : ro.steps)
    for (int c = 0; c < kStepClasses; ++c) s.class_ns[static_cast<std::size_t>(c)] = length_within(cost[static_cast<std::size_t>(c)], s.start_ns, s.end_ns);
  if (ro.steps.empty()) return;
  double total = 0.0;
  for (const OverviewStep& s : ro.steps) {
    total += static_cast<double>(s.end_ns - s.start_ns);
    for (int c = 0; c < kStepClasses; ++c) ro.mean_ns[static_cast<std::size_t>(c)] += static_cast<double>(s.class_ns[static_cast<std::size_t>(c)]);
  }
  const double n = static_cast<double>(ro.steps.size());
  for (double& v : ro.mean_ns) v /= n;
  ro.mean_step_ns = total / n;
}

// gpu_metrics_parser.GPUMetricsParser and tensor_cores_parser.TensorCoresParser, for the rank's first
// device that ran kernels, over the span from the first step's start to the last one's end.
std::optional<GpuSummary> gpu_summary(const RunData& run, const RankOverview& ro, const RankRows& rows) {
  int device = std::numeric_limits<int>::max();
  for (const auto& d : rows.device_rows)
    if (d.row->kind == static_cast<std::uint8_t>(store::KernelKind::kernel)) device = std::min(device, d.device);
  if (device == std::numeric_limits<int>::max()) return std::nullopt;
  GpuSummary g;
  g.device = device;
  const std::int64_t lo = ro.steps.empty() ? 0 : ro.steps.front().start_ns;
  const std::int64_t hi = ro.steps.empty() ? 0 : ro.steps.back().end_ns;
  const double span = static_cast<double>(hi - lo);
  Intervals busy;
  struct Endpoint {
    std::int64_t t;
    int type;  // 0 start, 1 end: starts first at equal times
    double value;
  };
  std::vector<Endpoint> endpoints;
  double occ_sum = 0.0, occ_time = 0.0, tc_ns = 0.0, linked_ns = 0.0;
  bool linked_any = false;
  for (const auto& d : rows.device_rows) {
    if (d.row->kind != static_cast<std::uint8_t>(store::KernelKind::kernel)) continue;
    const store::KernelRow& k = *d.row;
    if (k.corr_id != 0 && rows.launcher.count(k.corr_id)) {
      linked_any = true;
      if (d.device == device) {
        const double dur = static_cast<double>(k.end_ns - k.start_ns);
        linked_ns += dur;
        if (uses_tensor_cores(run.name(k.name))) tc_ns += dur;
      }
    }
    if (d.device != device) continue;
    busy.emplace_back(k.start_ns, k.end_ns);
    if (k.blocks_per_sm > 0.0f) {
      endpoints.push_back({k.start_ns, 0, k.blocks_per_sm});
      endpoints.push_back({k.end_ns, 1, k.blocks_per_sm});
    }
    if (k.occupancy >= 0.0f) {
      const std::int64_t a = std::max(k.start_ns, lo), b = std::min(k.end_ns, hi);
      if (a < b) {
        occ_sum += static_cast<double>(k.occupancy) * static_cast<double>(b - a);
        occ_time += static_cast<double>(b - a);
      }
    }
  }
  g.utilization = span > 0 ? static_cast<double>(length_within(merged(busy), lo, hi)) / span : 0.0;
  // range_utils.merge_ranges_with_value: concurrent kernels' blocks per SM add up, capped at 1.
  if (!endpoints.empty()) {
    std::stable_sort(endpoints.begin(), endpoints.end(),
                     [](const Endpoint& a, const Endpoint& b) { return a.t != b.t ? a.t < b.t : a.type < b.type; });
    double weighted = 0.0, value = endpoints[0].value;
    bool in_span = false;
    std::int64_t last = endpoints[0].t;
    for (std::size_t i = 1; i < endpoints.size(); ++i) {
      const Endpoint& e = endpoints[i];
      if (e.t > last && value > 0.0) {
        const std::int64_t a = std::max(last, lo), b = std::min(e.t, hi);
        if (a < b) {
          weighted += std::min(value, 1.0) * static_cast<double>(b - a);
          in_span = true;
        }
      }
      last = e.t;
      value += e.type == 0 ? e.value : -e.value;
    }
    if (in_span && span > 0) g.sm_efficiency = weighted / span;
  }
  if (occ_time > 0) g.achieved_occupancy = occ_sum / occ_time;
  if (linked_any) g.tensor_core_share = linked_ns > 0 ? tc_ns / linked_ns : 0.0;
  return g;
}

double amp_eligible_ns(const RunData& run, const RankRows& rows) {
  double ns = 0.0;
  for (const auto& d : rows.device_rows) {
    const store::KernelRow& k = *d.row;
    if (k.kind != static_cast<std::uint8_t>(store::KernelKind::kernel) || k.corr_id == 0) continue;
    auto it = rows.launcher.find(k.corr_id);
    if (it != rows.launcher.end() && tensor_core_eligible_op(run.name(it->second->name)))
      ns += static_cast<double>(k.end_ns - k.start_ns);
  }
  return ns;
}

RankOverview rank_overview(const RunData& run, int rank) {
  RankOverview ro;
  ro.rank = rank;
  const RankRows rows = classify(run, rank);
  for (const store::StepRow& s : run.steps) {
    if (s.rank != rank) continue;
    OverviewStep o;
    o.step = s.step;
    o.start_ns = o.host_start_ns = s.start_ns;
    o.end_ns = o.host_end_ns = s.end_ns;
    ro.steps.push_back(o);
  }
  std::sort(ro.steps.begin(), ro.steps.end(), [](const OverviewStep& a, const OverviewStep& b) { return a.host_start_ns < b.host_start_ns; });
  if (ro.steps.empty()) {
    // StepParser.parse_steps: no ProfilerStep, so one step "0" over the host ops: the span of PyTorch's
    // ops (not its annotations) that the importer recorded, else of every host range but runtime calls.
    std::int64_t lo = rows.cpu_min, hi = rows.cpu_max;
    if (auto it = run.meta.find("ops_span.rank" + std::to_string(rank)); it != run.meta.end())
      std::sscanf(it->second.c_str(), "%" SCNd64 " %" SCNd64, &lo, &hi);
    if (lo < hi) {
      ro.steps_from_trace = false;
      OverviewStep o;
      o.start_ns = o.host_start_ns = lo;
      o.end_ns = o.host_end_ns = hi;
      ro.steps.push_back(o);
    }
  }
  if (!ro.steps.empty()) {
    device_side_steps(ro, rows);
    split_steps(ro, rows);
  }
  ro.gpu = gpu_summary(run, ro, rows);
  ro.amp_eligible_ns = amp_eligible_ns(run, rows);
  return ro;
}

std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * f);
  return buf;
}

// data.RunProfileData.analyze (and _analyze_distributed_metrics, _analyze_gpu_metrics): the plugin's
// thresholds.
std::vector<Recommendation> recommendations(const RunData& run, const std::vector<RankOverview>& ranks) {
  std::map<std::string, std::vector<std::string>> found;  // id -> "rank R: figure"
  int compute_major = -1;
  if (auto it = run.meta.find("compute_major"); it != run.meta.end()) compute_major = std::atoi(it->second.c_str());
  // The device's memory (an imported GPU trace's deviceProperties totalGlobalMem) and each rank's peak
  // allocation on it (the trace's device "[memory]" events' Total Allocated, as memory rows).
  double device_memory = 0;
  if (auto it = run.meta.find("device_total_memory"); it != run.meta.end()) device_memory = std::atof(it->second.c_str());
  std::map<std::int32_t, std::int64_t> peak_by_rank;
  for (const store::MemoryRow& m : run.memory) peak_by_rank[m.rank] = std::max(peak_by_rank[m.rank], m.live_bytes);
  for (const RankOverview& r : ranks) {
    if (r.steps.empty() || r.mean_step_ns <= 0) continue;
    const std::string who = ranks.size() > 1 ? "rank " + std::to_string(r.rank) + ": " : "";
    const double data = r.mean_ns[static_cast<std::size_t>(StepClass::dataloader)] / r.mean_step_ns;
    const double comm = r.mean_ns[static_cast<std::size_t>(StepClass::communication)] / r.mean_step_ns;
    if (data > 0.05) found["dataloader"].push_back(who + percent(data));
    if (comm > 0.10) found["communication"].push_back(who + percent(comm));
    if (r.gpu && r.gpu->utilization < 0.5) found["gpu_utilization"].push_back(who + percent(r.gpu->utilization));
    if (r.gpu && compute_major >= 7 && r.gpu->tensor_core_share && *r.gpu->tensor_core_share == 0.0 && r.amp_eligible_ns > 0)
      found["amp"].push_back(who + "none of the kernel time");
    if (auto it = peak_by_rank.find(r.rank);
        r.gpu && device_memory > 0 && it != peak_by_rank.end() && static_cast<double>(it->second) > 0.9 * device_memory) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f%% of %.1f GB", 100.0 * static_cast<double>(it->second) / device_memory,
                    device_memory / (1024.0 * 1024.0 * 1024.0));
      found["memory"].push_back(who + buf);
    }
  }
  auto joined = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  std::vector<Recommendation> out;
  const std::pair<const char*, const char*> texts[] = {
      {"dataloader", "High time on input data loading (over 5%% of the step in DataLoader: %s). Set num_workers on "
                     "the DataLoader to load in several processes."},
      {"communication", "High time on communication (over 10%% of the step: %s). Try gradient compression or "
                        "accumulation, or a larger batch."},
      {"gpu_utilization", "Low GPU utilization (under 50%%: %s). Try a larger batch; it may change convergence."},
      {"amp", "Tensor-Core-eligible ops launched kernels, but Tensor Cores ran %s. Enable automatic mixed precision "
              "(torch.autocast) to use them."},
      {"memory", "Device memory is at its limit (the peak allocation over 90%% of the device's memory: %s). Gradient "
                 "checkpointing or automatic mixed precision frees room for a larger batch."},
  };
  for (const auto& [id, fmt] : texts) {
    auto it = found.find(id);
    if (it == found.end()) continue;
    char buf[512];
    std::snprintf(buf, sizeof buf, fmt, joined(it->second).c_str());
    out.push_back({id, buf});
  }
  return out;
}

}  // namespace

const char* step_class_key(StepClass c) {
  static const char* const keys[] = {"kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other"};
  return keys[static_cast<int>(c)];
}

const char* step_class_label(StepClass c) {
  static const char* const labels[] = {"Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec", "Other"};
  return labels[static_cast<int>(c)];
}

bool uses_tensor_cores(std::string_view kernel_name) {
  static const char* const patterns[] = {"h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816",
                                         "dgrad_1x1_stride_2x2", "first_layer_wgrad_kernel", "conv1x1",
                                         "conv2d_c1_k1", "direct_group", "xmma_implicit_gemm", "xmma_sparse_conv",
                                         "xmma_warp_specialized_implicit_gemm", "xmma_gemm", "xmma_sparse_gemm", "c1688"};
  for (const char* p : patterns)
    if (kernel_name.find(p) != std::string_view::npos) return true;
  return false;
}

bool tensor_core_eligible_op(std::string_view op) {
  static const std::set<std::string_view> ops = {
      "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv_tbc",
      "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::convolution",
      "aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::prelu", "aten::addmm", "aten::addmv",
      "aten::addr", "aten::matmul", "aten::mm", "aten::mv", "aten::linear", "aten::addbmm", "aten::baddbmm",
      "aten::bmm", "aten::chain_matmul", "aten::linalg_multi_dot", "aten::_thnn_fused_lstm_cell",
      "aten::_thnn_fused_gru_cell", "aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell",
      "CudnnConvolutionBackward", "BmmBackward0", "aten::cudnn_convolution_transpose_backward",
      "CudnnConvolutionTransposeBackward", "MmBackward", "aten::cudnn_convolution_backward_weight", "aten::addmm_",
      "AddmvBackward", "MvBackward", "aten::cudnn_convolution_transpose_backward_weight",
      "aten::cudnn_convolution_transpose_backward_input", "AddmmBackward", "aten::cudnn_convolution_backward_input",
      "AddbmmBackward", "aten::cudnn_convolution_backward"};
  return ops.count(op) > 0;
}

Overview tb_overview(const RunData& run) {
  Overview o;
  for (int rank : run.rank_ids()) o.ranks.push_back(rank_overview(run, rank));
  o.recommendations = recommendations(run, o.ranks);
  if (o.ranks.size() > 1) {
    std::map<int, std::vector<std::pair<std::int64_t, int>>> ends;  // step -> (end, rank)
    for (const RankOverview& r : o.ranks)
      for (const OverviewStep& s : r.steps) ends[s.step].emplace_back(s.end_ns, r.rank);
    for (auto& [step, v] : ends) {
      if (v.size() != o.ranks.size()) continue;
      std::sort(v.begin(), v.end());
      o.late.push_back({step, v.back().second, v.back().first - v.front().first});
    }
  }
  return o;
}

}  // namespace wb::analysis
