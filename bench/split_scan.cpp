// split_scan: the measured effect of allreduce split points on a 2-rank CPU run. For each bucket layout
// it runs wb-train --nproc 2 (synthetic data, 32x32), reads the merged run file, and reports over the
// steady-state steps (the first two are warm-up): the median step time, the mean exposed communication
// (step.comm_exposed_ns: time the step waited for allreduces after backward) and the allreduce time
// per step (allreduce table). With --rounds R the layouts are run R times, interleaved, so a drift in
// machine load spreads over all of them; the step-time quartiles show how much the numbers can be
// trusted. The last line names the best layout and its step time relative to one bucket.
//
//   split_scan [--train PATH] [--steps N] [--batch N] [--rounds R] [--keep DIR]
//
// wb-train defaults to the one next to this program (build/bin/).
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "allreduce/split_points.hpp"
#include "store/reader.hpp"

namespace fs = std::filesystem;

namespace {

struct Layout {
  std::string name;
  std::vector<std::string> flags;
};

// Steady-state samples of one layout, over every round: one entry per rank and step.
struct Samples {
  int buckets = 0;
  std::vector<double> step_ms;
  std::vector<double> exposed_ms;    // step.comm_exposed_ns
  std::vector<double> allreduce_ms;  // the step's bucket allreduce times, summed
};

std::string quote(const std::string& s) {
  std::string out(1, '\'');
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  out += '\'';
  return out;
}

// The q-quantile (0..1) by linear interpolation between order statistics.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double mean(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
}

std::string every_n_params(int n, int total) {
  std::vector<int> points;
  for (int s = n; s < total; s += n) points.push_back(s);
  return wb::allreduce::SplitPoints::from_points(points).to_string();
}

void measure(const fs::path& run, int warmup, Samples& out) {
  wb::store::Reader reader(run);
  for (const auto& st : reader.steps()) {
    if (st.step < warmup) continue;
    out.step_ms.push_back(1e-6 * static_cast<double>(st.end_ns - st.start_ns));
    out.exposed_ms.push_back(1e-6 * static_cast<double>(st.comm_exposed_ns));
  }
  std::map<std::pair<int, int>, double> per_step;
  std::map<int, bool> buckets;
  for (const auto& a : reader.allreduces()) {
    buckets[a.bucket] = true;
    if (a.step >= warmup) per_step[{a.rank, a.step}] += 1e-6 * static_cast<double>(a.end_ns - a.start_ns);
  }
  out.buckets = static_cast<int>(buckets.size());
  for (const auto& [key, ms] : per_step) out.allreduce_ms.push_back(ms);
}

fs::path default_train() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path("wb-train") : self.parent_path() / "wb-train";
}

}  // namespace

int main(int argc, char** argv) {
  fs::path train = default_train();
  int steps = 12;
  int batch = 16;
  int rounds = 1;
  fs::path keep;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "split_scan: " << a << " expects a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--train") train = value();
      else if (a == "--steps") steps = std::stoi(value());
      else if (a == "--batch") batch = std::stoi(value());
      else if (a == "--rounds") rounds = std::stoi(value());
      else if (a == "--keep") keep = value();
      else {
        std::cerr << "split_scan: unknown argument '" << a << "' (expected --train, --steps, --batch, --rounds, --keep)\n";
        return 2;
      }
    } catch (const std::exception&) {
      std::cerr << "split_scan: " << a << ": expected a number\n";
      return 2;
    }
  }
  const int warmup = 2;
  if (steps <= warmup || batch < 1 || rounds < 1) {
    std::cerr << "split_scan: --steps must exceed the " << warmup << " warm-up steps, --batch and --rounds be >= 1\n";
    return 2;
  }
  if (!fs::exists(train)) {
    std::cerr << "split_scan: wb-train not found at " << train << " (give --train PATH)\n";
    return 2;
  }

  fs::path dir = keep;
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "wb-split-scan-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      std::cerr << "split_scan: cannot create a temporary directory\n";
      return 1;
    }
    dir = tmpl;
  }
  fs::create_directories(dir);

  const int kParams = 161;  // ResNet-50's trainable tensors
  const std::vector<Layout> layouts = {
      {"one bucket", {"--allreduce-split", "none"}},
      {"25 MB (default)", {}},
      {"85,160", {"--allreduce-split", "85,160"}},
      {"40,100,160", {"--allreduce-split", "40,100,160"}},
      {"every 20 params", {"--allreduce-split", every_n_params(20, kParams)}},
  };

  std::printf("split_scan: 2 ranks x batch %d, 32x32 synthetic, %d steps per run (first %d are warm-up), %d round(s)\n",
              batch, steps, warmup, rounds);
  std::vector<Samples> samples(layouts.size());
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t k = 0; k < layouts.size(); ++k) {
      const Layout& l = layouts[k];
      const std::string stem = "layout" + std::to_string(k) + "-round" + std::to_string(round);
      const fs::path run = dir / (stem + ".sqlite");
      const fs::path log = dir / (stem + ".log");
      std::string cmd = quote(train.string()) + " --nproc 2 --data synthetic --synthetic-samples " +
                        std::to_string(std::max(256, 2 * batch * steps)) + " --batch-size " + std::to_string(batch) +
                        " --image-size 32 --steps " + std::to_string(steps) + " --seed 1 --run " + quote(run.string());
      for (const auto& f : l.flags) {
        cmd += ' ';
        cmd += quote(f);
      }
      cmd += " >";
      cmd += quote(log.string());
      cmd += " 2>&1";
      const int status = std::system(cmd.c_str());
      if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::ifstream in(log);
        std::stringstream text;
        text << in.rdbuf();
        std::cerr << "split_scan: wb-train failed for layout '" << l.name << "':\n" << text.str();
        return 1;
      }
      measure(run, warmup, samples[k]);
    }
  }
  if (keep.empty()) fs::remove_all(dir);

  std::printf("%-16s %7s %9s %19s %11s %13s %8s %8s\n", "layout", "buckets", "step ms", "(p25..p75)", "exposed ms",
              "allreduce ms", "hidden%", "vs one");
  const double base = quantile(samples.front().step_ms, 0.5);
  std::size_t best = 0;
  for (std::size_t k = 0; k < layouts.size(); ++k) {
    const Samples& m = samples[k];
    const double step = quantile(m.step_ms, 0.5);
    const double exposed = mean(m.exposed_ms);
    const double allreduce = mean(m.allreduce_ms);
    // Hidden share: allreduce time the step did not have to wait for after backward.
    const double hidden = allreduce > 0 ? 100.0 * std::max(0.0, allreduce - exposed) / allreduce : 0.0;
    char spread[64];
    std::snprintf(spread, sizeof spread, "(%.0f..%.0f)", quantile(m.step_ms, 0.25), quantile(m.step_ms, 0.75));
    std::printf("%-16s %7d %9.1f %19s %11.1f %13.1f %8.1f %8.3f\n", layouts[k].name.c_str(), m.buckets, step, spread,
                exposed, allreduce, hidden, base > 0 ? step / base : 0.0);
    if (step < quantile(samples[best].step_ms, 0.5)) best = k;
  }
  const double best_step = quantile(samples[best].step_ms, 0.5);
  std::printf("best: %s, median step %.1f ms = %.3fx one bucket's %.1f ms (exposed comm %.1f ms vs %.1f ms)\n",
              layouts[best].name.c_str(), best_step, base > 0 ? best_step / base : 0.0, base,
              mean(samples[best].exposed_ms), mean(samples.front().exposed_ms));
  return 0;
}
