// wb tune-split RUN: the split model's best candidates and the run's own split, each trained for a few
// steps with the run's own configuration, candidates alternated round by round; keeps the fastest
// measured one, and never one that did not beat the current split in every round. Every trial is
// recorded in RUN (split_trial).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "allreduce/split_points.hpp"

#include "app/cli/cli.hpp"
#include "app/model/child_process.hpp"
#include "app/model/tuner_logic.hpp"
#include "profiler/analysis/report.hpp"
#include "profiler/analysis/split_model.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"

namespace wb::cli {

namespace {

namespace fs = std::filesystem;

struct Candidate {
  std::string name;
  analysis::Prediction prediction;
  std::vector<std::int64_t> measured;  // median step per round; -1 for a failed trial
  double alpha_beta_ns = 0.0;          // the alpha-beta fit's prediction, for comparison
};

using app_model::trial_median;

// The median step of a trial run: over every rank's steps from `warmup` on.
std::int64_t median_step(const fs::path& run, int warmup) {
  store::Reader reader(run);
  std::vector<std::int64_t> d;
  for (const auto& s : reader.steps())
    if (s.step >= warmup) d.push_back(s.end_ns - s.start_ns);
  return trial_median(std::move(d));
}

std::string ms(double ns) { return ns < 0 ? "failed" : analysis::format_ns(ns); }

// The candidates: the run's own split, the model's best `count` others, then the splits of --try.
std::vector<Candidate> pick_candidates(const analysis::SplitModel& m, int count, const std::vector<std::vector<int>>& extra) {
  std::vector<Candidate> out{{"current", analysis::predict(m, m.current_split), {}}};
  std::set<std::vector<int>> seen{m.current_split};
  for (const auto& s : analysis::ranked_candidates(m)) {
    if (static_cast<int>(out.size()) > count) break;
    if (seen.insert(s.prediction.split).second) out.push_back({s.strategy, s.prediction, {}});
  }
  int tries = 0;
  for (const auto& split : extra)
    if (seen.insert(split).second) out.push_back({"try " + std::to_string(++tries), analysis::predict(m, split), {}});
  for (auto& c : out) c.alpha_beta_ns = analysis::predict_alpha_beta(m, c.prediction.split).step_ns;
  return out;
}

// --try "S1|S2|...": splits as --allreduce-split takes them, '|' between them.
std::vector<std::vector<int>> parse_tries(const Args& args, std::size_t params) {
  std::vector<std::vector<int>> out;
  const std::string text = args.value_or("--try", "");
  for (std::size_t start = 0; start < text.size();) {
    std::size_t bar = text.find('|', start);
    if (bar == std::string::npos) bar = text.size();
    try {
      const auto points = allreduce::SplitPoints::parse(text.substr(start, bar - start), "--try");
      out.push_back(points.points());
      analysis::validate_split(out.back(), params);
    } catch (const std::exception& e) {
      args.fail(e.what());
    }
    start = bar + 1;
  }
  return out;
}

// One trial: wb-train with the run's config and the candidate's split; the measured median step (-1 on
// failure) and the exit code. The trial's run file is removed unless `keep`.
std::pair<std::int64_t, int> run_trial(const nlohmann::json& config, int world, const Candidate& c, const fs::path& dir,
                                       const std::string& stem, int steps, int warmup, bool keep) {
  app_model::TrainLaunch launch = app_model::make_train_launch(config, world, c.prediction.split, dir, stem);
  std::vector<std::string> args = launch.args;
  for (const char* a : {"--no-calibrate-comm", "--no-memory-profile"}) args.emplace_back(a);
  std::error_code ec;
  fs::remove(launch.run_path, ec);  // an earlier tuning's trial
  args.insert(args.end(), {"--steps", std::to_string(warmup + steps), "--warmup-steps", "0", "--dump-step", "-1"});
  app_model::ChildProcess child(app_model::train_executable(), args);
  const int rc = child.wait();
  std::int64_t median = -1;
  if (rc == 0) median = median_step(launch.run_path, warmup);
  if (rc != 0) {
    const auto lines = child.lines();
    std::cerr << "    wb-train exited with " << rc << "; its last lines:\n";
    for (std::size_t i = lines.size() > 8 ? lines.size() - 8 : 0; i < lines.size(); ++i) std::cerr << "      " << lines[i] << "\n";
  }
  if (!keep) {  // the run file, its config, its rank files' folder and its synthetic data set
    fs::remove(launch.run_path, ec);
    fs::remove(launch.config_path, ec);
    fs::remove_all(dir / stem, ec);
    fs::remove_all(dir / (stem + "-synthetic-data"), ec);
  }
  return {median, rc};
}

// The candidate kept: the fastest median among those faster than the current split in every round.
std::size_t choose(const std::vector<Candidate>& cands) {
  std::size_t pick = 0;
  for (std::size_t i = 1; i < cands.size(); ++i) {
    bool every_round = true;
    for (std::size_t r = 0; r < cands[i].measured.size(); ++r) {
      const auto a = cands[i].measured[r], b = cands[0].measured[r];
      every_round = every_round && a >= 0 && (b < 0 || a < b);
    }
    if (every_round && (pick == 0 || trial_median(cands[i].measured) < trial_median(cands[pick].measured))) pick = i;
  }
  return pick;
}

void print_results(const std::vector<Candidate>& cands, std::size_t pick, int rounds, std::ostream& out) {
  std::vector<std::string> header = {"candidate", "buckets", "predicted", "alpha-beta fit"};
  for (int r = 0; r < rounds; ++r) header.push_back("round " + std::to_string(r + 1));
  header.insert(header.end(), {"median", "vs current"});
  analysis::Table t(header);
  const double current = static_cast<double>(trial_median(cands[0].measured));
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    std::vector<std::string> row = {c.name + (i == pick ? " *" : ""), std::to_string(c.prediction.buckets.size()),
                                    ms(c.prediction.step_ns), ms(c.alpha_beta_ns)};
    for (auto v : c.measured) row.push_back(ms(static_cast<double>(v)));
    const double med = static_cast<double>(trial_median(c.measured));
    row.push_back(ms(med));
    row.push_back(med > 0 && current > 0 ? analysis::fmt("%+.1f%%", 100.0 * (med / current - 1.0)) : "-");
    t.add(row);
  }
  t.print(out);
  for (const Candidate& c : cands)
    if (c.name.starts_with("try ")) out << "  " << c.name << ": " << analysis::format_split(c.prediction.split) << "\n";
}

}  // namespace

int cmd_tune_split(int argc, char** argv) {
  Args args(argc, argv,
            "usage: wb tune-split RUN [--candidates K] [--rounds R] [--steps N] [--warmup W] [--try 'S1|S2'] [--keep]\n"
            "Trains RUN's own configuration for W + N steps with its current allreduce split and with the split\n"
            "model's best K other candidates (default 3), alternated, R rounds (default 2), and measures the\n"
            "median step after the W warmup steps (defaults: N 10, W 3). Keeps the candidate that measured faster\n"
            "than the current split in every round (the fastest such), else the current split. Prints the whole\n"
            "split and the wb-train command that applies it, and records every trial in RUN. --try adds splits of\n"
            "your own ('|' between them, each as --allreduce-split takes it). --keep keeps the\n"
            "trials' run files in RUN.tune/. wb-train is the one next to wb, or $WB_TRAIN_BIN.",
            {{"--candidates"}, {"--rounds"}, {"--steps"}, {"--warmup"}, {"--try"}, {"--keep", false}});
  const fs::path run_path = args.positionals(1, 1)[0];
  const int count = static_cast<int>(args.int_value("--candidates", 1, 12).value_or(3));
  const int rounds = static_cast<int>(args.int_value("--rounds", 1, 20).value_or(2));
  const int steps = static_cast<int>(args.int_value("--steps", 2, 100000).value_or(10));
  const int warmup = static_cast<int>(args.int_value("--warmup", 1, 100000).value_or(3));
  const bool keep = args.has("--keep");

  analysis::RunData run;
  {
    store::Reader reader(run_path);
    run = analysis::load_run(reader);
  }
  if (!run.config.is_object() || run.config.empty())
    args.fail(run_path.string() + ": no recorded configuration (meta config_json); tune-split reruns a wb-train run");
  const int world = run.meta.count("world_size") ? std::stoi(run.meta.at("world_size")) : 1;
  const analysis::SplitModel m = analysis::build_split_model(run);
  std::vector<Candidate> cands = pick_candidates(m, count, parse_tries(args, m.size()));
  const fs::path dir = run_path.string() + ".tune";

  std::cout << "Tuning the allreduce split of " << run_path.string() << ": " << cands.size() << " candidates x " << rounds
            << " rounds, " << warmup << " + " << steps << " steps each on " << world << " ranks ("
            << (m.calibrated ? "calibrated model" : "alpha-beta model: no calibration in the run") << ")\n";
  for (int r = 0; r < rounds; ++r) {
    // Alternated: every candidate once per round, the order reversed every other round.
    for (std::size_t k = 0; k < cands.size(); ++k) {
      const std::size_t i = r % 2 == 0 ? k : cands.size() - 1 - k;
      Candidate& c = cands[i];
      std::cout << "  round " << r + 1 << "/" << rounds << "  " << c.name << " (" << c.prediction.buckets.size()
                << " buckets) ... " << std::flush;
      const std::string stem = "trial-" + std::to_string(r + 1) + "-" + std::to_string(i);
      const auto [median, rc] = run_trial(run.config, world, c, dir, stem, steps, warmup, keep);
      c.measured.push_back(median);
      std::cout << (rc == 0 ? ms(static_cast<double>(median)) : "failed (exit " + std::to_string(rc) + ")") << "\n";
      store::SplitTrialRow row{r,
                               c.name,
                               analysis::format_split(c.prediction.split),
                               steps,
                               median,
                               static_cast<std::int64_t>(c.prediction.step_ns),
                               static_cast<std::int64_t>(c.alpha_beta_ns),
                               rc,
                               keep ? (dir / (stem + ".sqlite")).string() : "",
                               ""};
      store::save_split_trial(run_path, row);
    }
  }
  if (trial_median(cands[0].measured) < 0) {
    std::cerr << "wb tune-split: every trial of the current split failed (wb-train's last lines are above); nothing to "
                 "compare the candidates with\n";
    return 1;
  }
  // Rounds where a candidate came before the current one in alternation are compared as they ran.
  for (auto& c : cands) {
    if (c.measured.size() < static_cast<std::size_t>(rounds)) c.measured.resize(static_cast<std::size_t>(rounds), -1);
  }
  const std::size_t pick = choose(cands);
  std::cout << "\n";
  print_results(cands, pick, rounds, std::cout);
  const Candidate& best = cands[pick];
  const std::string split = analysis::format_split(best.prediction.split);
  if (pick == 0) {
    std::cout << "\nKeep the current split: no candidate measured faster than it in every round.\n"
              << "  current split: " << split << "\n";
  } else {
    // The run's own configuration with the kept split, as a file the printed command reads.
    const app_model::TrainLaunch apply = app_model::make_train_launch(run.config, world, best.prediction.split, dir, "apply");
    std::cout << "\nUse " << best.name << " (" << best.prediction.buckets.size()
              << " buckets): it measured faster than the current split in every round.\n"
              << "  split: " << split << "\n  with your flags: wb-train ... --allreduce-split " << split
              << "\n  the run's own configuration with it: wb-train --config " << apply.config_path.string() << "\n";
  }
  std::cout << "Trials recorded in " << run_path.string() << " (table split_trial).\n";
  return 0;
}

}  // namespace wb::cli
