// wb whatif RUN [--scale PATTERN:FACTOR]... [--add PATTERN:+US]... [--split S]: the run's steps replayed
// on their cross-rank graph with the changes (whatif.hpp), the predicted step time, and the critical path
// before and after.
#include <algorithm>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "allreduce/split_points.hpp"
#include "app/cli/cli.hpp"
#include "profiler/analysis/report.hpp"
#include "profiler/analysis/split_model.hpp"
#include "profiler/analysis/whatif.hpp"
#include "store/reader.hpp"

namespace wb::cli {

namespace {

using analysis::format_ns;

std::string signed_pct(double change, double base) {
  return analysis::fmt("%+.1f%%", base > 0 ? 100.0 * change / base : 0.0);
}

// The ops most on the path per step, before and after.
void write_path_ops(const analysis::CriticalPath& before, const analysis::CriticalPath& after, std::ostream& out) {
  if (after.steps.empty()) return;
  struct Row {
    double before = 0.0, after = 0.0;
  };
  std::map<std::pair<std::string, std::string>, Row> rows;  // (name, kind)
  const double nb = static_cast<double>(std::max<std::size_t>(1, before.steps.size()));
  const double na = static_cast<double>(after.steps.size());
  for (const auto& op : before.ops) rows[{op.name, op.kind}].before = static_cast<double>(op.total_ns) / nb;
  for (const auto& op : after.ops) rows[{op.name, op.kind}].after = static_cast<double>(op.total_ns) / na;
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::max(a.second.after, a.second.before) > std::max(b.second.after, b.second.before);
  });
  const double path_after = static_cast<double>(after.path_ns) / na;
  out << "\nCritical path per step (" << format_ns(static_cast<double>(before.path_ns) / nb) << " as recorded, "
      << format_ns(path_after) << " replayed with the changes): the ops most on it\n";
  analysis::Table t({"on the path", "kind", "recorded", "with the changes", "% of path after"});
  for (std::size_t i = 0; i < sorted.size() && i < 12; ++i) {
    const auto& [key, r] = sorted[i];
    t.add({key.first, key.second, format_ns(r.before), format_ns(r.after), analysis::fmt("%.1f%%", path_after > 0 ? 100.0 * r.after / path_after : 0.0)});
  }
  t.print(out);
}

// The median step's path after the changes, segment by segment (runs of short segments folded).
void write_step_path(const analysis::WhatIf& w, std::ostream& out) {
  const analysis::StepPath* p = nullptr;
  for (const auto& s : w.after.steps)
    if (s.step == w.median_step) p = &s;
  if (p == nullptr) return;
  const double total = static_cast<double>(p->end_ns - p->start_ns);
  out << "\nThe path of step " << p->step << " with the changes (" << format_ns(total) << "), segments over 2%:\n";
  analysis::Table t({"segment", "rank", "kind", "time", "share"});
  std::int64_t folded = 0;
  int folded_n = 0;
  for (const auto& seg : p->segments) {
    const std::int64_t d = seg.end_ns - seg.start_ns;
    if (static_cast<double>(d) < 0.02 * total) {
      folded += d;
      ++folded_n;
      continue;
    }
    t.add({seg.name, std::to_string(seg.rank), seg.kind, format_ns(static_cast<double>(d)), analysis::fmt("%.1f%%", 100.0 * static_cast<double>(d) / total)});
  }
  if (folded_n > 0)
    t.add({analysis::concat("(", std::to_string(folded_n), " shorter segments)"), "", "", format_ns(static_cast<double>(folded)),
           analysis::fmt("%.1f%%", 100.0 * static_cast<double>(folded) / total)});
  t.print(out);
}

nlohmann::json whatif_json(const analysis::WhatIf& w, const std::vector<analysis::WhatIfChange>& changes,
                           double split_delta, const std::string& caveat) {
  nlohmann::json j;
  j["steps_used"] = w.steps_used;
  j["measured_step_ns"] = w.measured_step_ns;
  j["replay_step_ns"] = w.replay_step_ns;
  j["split_delta_ns"] = split_delta;
  j["predicted_step_ns"] = w.predicted_step_ns + split_delta;
  j["batches_replayed"] = w.batches_replayed;
  j["caveat"] = caveat.empty() ? nlohmann::json(nullptr) : nlohmann::json(caveat);
  j["changes"] = nlohmann::json::array();
  for (std::size_t i = 0; i < changes.size(); ++i) j["changes"].push_back({{"change", changes[i].text}, {"matched", w.matched[i]}});
  j["median_step"] = w.median_step;
  j["path"] = nlohmann::json::array();
  for (const auto& s : w.after.steps)
    if (s.step == w.median_step)
      for (const auto& seg : s.segments)
        j["path"].push_back({{"rank", seg.rank}, {"name", seg.name}, {"kind", seg.kind}, {"start_ns", seg.start_ns}, {"end_ns", seg.end_ns}});
  return j;
}

}  // namespace

int cmd_whatif(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb whatif RUN [--scale PATTERN:FACTOR]... [--add PATTERN:+US]... [--split S] [--warmup W] [--json]\n"
            "Replays RUN's data-parallel steps on their graph across ranks (program order on each main thread,\n"
            "gradients ready -> bucket collectives that start when the last rank joins -> the wait for them, the\n"
            "input pipeline's batches -> the data wait) with the changes, and prints the predicted step time\n"
            "and the critical path before and after. PATTERN is terms joined by '&', all of which must hold:\n"
            "  GLOB or op:GLOB   a main-thread range by name (layer3.*, layer4.0, layer3.0.conv2)\n"
            "  class:C           a range category (forward, backward, loss, optimizer, data, comm),\n"
            "                    or class:communication: the allreduce collectives\n"
            "  bucket:K          allreduce bucket K   rank:R   on rank R only\n"
            "  data              each batch the data workers assemble (the input pipeline)\n"
            "--scale multiplies what matches by FACTOR; --add adds US microseconds (negative to take off) to each\n"
            "range, collective or batch that matches. Both repeat. --split S (as wb-train --allreduce-split\n"
            "takes it) adds the split model's predicted change for that split (wb suggest-split).\n"
            "Step times are the mean over the steps from --warmup W on (default 1: the first step creates the\n"
            "primitives). --json prints the figures and the path of the step nearest the mean as one JSON object.\n"
            "Example: wb whatif run.sqlite --add 'rank:1&layer3.0.conv2&class:forward:+20000'",
            {{"--scale"}, {"--add"}, {"--split"}, {"--warmup"}, {"--json", false}});
  const std::string path = args.positionals(1, 1)[0];
  std::vector<analysis::WhatIfChange> changes;
  try {
    for (const auto& v : args.values("--scale")) changes.push_back(analysis::parse_scale_change(v));
    for (const auto& v : args.values("--add")) changes.push_back(analysis::parse_add_change(v));
  } catch (const analysis::AnalysisError& e) {
    args.fail(std::string(e.what()));
  }
  analysis::RunData run;
  {
    store::Reader reader(path);
    run = analysis::load_run(reader);
  }
  double split_delta = 0.0;
  std::string split_line;
  if (auto s = args.value("--split")) {
    const analysis::SplitModel m = analysis::build_split_model(run);
    std::vector<int> split;
    try {
      split = allreduce::SplitPoints::parse(*s, "--split").points();
      analysis::validate_split(split, m.size());
    } catch (const std::exception& e) {
      args.fail(e.what());
    }
    const double now = analysis::predict(m, m.current_split).step_ns;
    const double then = analysis::predict(m, split).step_ns;
    split_delta = then - now;
    split_line = analysis::concat("  --split ", analysis::format_split(split), ": ", format_ns(split_delta), " on the step (",
                                  m.calibrated ? "the split model, calibrated" : "the alpha-beta fit: no calibration in the run, unreliable",
                                  ")\n");
  }
  const int warmup = static_cast<int>(args.int_value("--warmup", 0, 1'000'000'000).value_or(1));
  const analysis::WhatIf w = analysis::what_if(run, changes, warmup);
  const double predicted = w.predicted_step_ns + split_delta;
  const int ranks = static_cast<int>(run.rank_ids().size());
  const std::string caveat = analysis::shared_cpu_caveat(run);
  std::ostream& out = std::cout;
  if (args.has("--json")) {
    out << whatif_json(w, changes, split_delta, caveat).dump(1) << "\n";
    return 0;
  }
  out << "What if: " << path << " (" << ranks << (ranks == 1 ? " rank, " : " ranks, ") << w.steps_used
      << " steps counted from step " << warmup << "; input pipeline " << (w.batches_replayed ? "replayed from the data workers' batches" : "as recorded")
      << ")\n";
  for (std::size_t i = 0; i < changes.size(); ++i)
    out << "  " << (changes[i].factor != 1.0 ? "--scale " : "--add ") << changes[i].text << ": " << w.matched[i]
        << (changes[i].target == analysis::WhatIfChange::Target::collectives ? " collectives"
            : changes[i].target == analysis::WhatIfChange::Target::batches   ? " batches"
                                                                               : " ranges")
        << " changed\n";
  out << split_line;
  if (!caveat.empty()) out << "Caveat: " << caveat << ".\n";
  out << "Measured step (mean)         " << format_ns(w.measured_step_ns) << "\n";
  out << "Replayed, no change (check)  " << format_ns(w.replay_step_ns) << " ("
      << signed_pct(w.replay_step_ns - w.measured_step_ns, w.measured_step_ns) << " from measured)\n";
  out << "Predicted step               " << format_ns(predicted) << " ("
      << signed_pct(predicted - w.measured_step_ns, w.measured_step_ns) << ")\n";
  write_path_ops(w.before, w.after, out);
  write_step_path(w, out);
  return 0;
}

}  // namespace wb::cli
