// Step one of a real run against PyTorch, end to end: wb-train dumps step 0 into its run file,
// compare/reference/torch_step.py replays that step with torchvision's ResNet-50, and `wb compare`
// judges every tensor with the default migration-fp32 profile.
//
//   - one rank (32x32 and 224x224): every tensor passes; the worst metrics per kind are printed;
//   - two ranks dumping every rank (--dump-ranks all) against torch_step.py's DDP replay: all pass,
//     while rank 0's batch replayed alone gives gradients far off the run's (the average matters);
//   - no false alarms: a dump against itself, and two replays of one run against each other;
//   - localisation: faults planted into the PyTorch side (torch_step.py --fault NAME), each of which
//     `wb compare` must report as the first divergence at the tensor where it first shows.
//
// The run files and replays are made once per test process and shared by the test cases. The fault
// replays run a few at a time, one thread each.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/reader.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "support/peers.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using wb::test::TempDir;

std::string quote(const fs::path& p) { return wb::test::shell_quote(p.string()); }

struct CommandResult {
  std::string command;
  int exit_code = -1;  // 128 + signal when killed, -1 when it could not be started
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

CommandResult run_command(const std::string& command) {
  CommandResult r;
  r.command = command;
  const auto t0 = std::chrono::steady_clock::now();
  wb::test::ProcessResult p = wb::test::run_command(command);
  r.exit_code = p.exit_code;
  r.output = std::move(p.output);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Runs each job's commands one after the other, `at_once` jobs at a time; results in the jobs' order.
std::vector<std::vector<CommandResult>> run_jobs(const std::vector<std::vector<std::string>>& jobs,
                                                 std::size_t at_once) {
  std::vector<std::vector<CommandResult>> results(jobs.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  for (std::size_t w = 0; w < std::min(at_once, jobs.size()); ++w) {
    workers.emplace_back([&] {
      for (std::size_t i = next++; i < jobs.size(); i = next++) {
        for (const std::string& command : jobs[i]) results[i].push_back(run_command(command));
      }
    });
  }
  for (auto& t : workers) t.join();
  return results;
}

// Batch of the 224x224 run: its dump is ~110 MB of activations per image on each side. Batch 8 (1.5 GB
// per side) took 4 minutes on 2 cores at load average 20 (train, replay, compare; 30 s at load 5).
constexpr int kBatch224 = 2;

// Fault jobs (replay, then compare) at once, one thread each: three keep two cores busy while the
// others read or write their ~400 MB of tensors.
constexpr std::size_t kJobsAtOnce = 3;

std::string tail(const std::string& text, std::size_t chars = 3000) {
  return text.size() <= chars ? text : "..." + text.substr(text.size() - chars);
}

void require_ok(const CommandResult& r) {
  INFO(r.command << "\n" << tail(r.output));
  REQUIRE(r.exit_code == 0);
}

std::string torch_step_command(const fs::path& run, const fs::path& out, int threads, const std::string& extra = "") {
  const fs::path script = fs::path(WB_SOURCE_DIR) / "compare" / "reference" / "torch_step.py";
  return quote(std::string(WB_PYTHON)) + " " + quote(script) + " " + quote(run) + " --out " + quote(out) +
         " --threads " + std::to_string(threads) + (extra.empty() ? "" : " " + extra);
}

std::string compare_command(const fs::path& a, const fs::path& b, const fs::path& json_out,
                            const std::string& extra = "") {
  return quote(std::string(WB_CLI)) + " compare " + quote(a) + " " + quote(b) + " --json " + quote(json_out) +
         " --no-save --no-color" + (extra.empty() ? "" : " " + extra);
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return json::parse(in);
}

// A metric from the JSON report: numbers, or "nan"/"inf"/"-inf" strings, or null (absent).
double number(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// The files shared by the test cases, made on first use.
class Workspace {
 public:
  static Workspace& get() {
    static Workspace w;
    return w;
  }

  const fs::path& dir() const { return tmp_.path(); }

  // wb-train, one rank, synthetic data, fp32 CPU: `--steps 1 --dump-step 0`.
  fs::path train(const std::string& name, int image_size, int batch, const std::string& extra = "") {
    auto it = runs_.find(name);
    if (it != runs_.end()) return it->second;
    const fs::path run = dir() / (name + ".sqlite");
    const std::string command =
        quote(std::string(WB_TRAIN)) + " --data synthetic --synthetic-samples 64 --steps 1 --dump-step 0" +
        " --batch-size " + std::to_string(batch) + " --image-size " + std::to_string(image_size) +
        " --seed 7 --device cpu --precision fp32 --run " + quote(run) + (extra.empty() ? "" : " " + extra);
    const CommandResult r = run_command(command);
    std::cout << "wb-train " << name << " (" << image_size << "x" << image_size << ", batch " << batch
              << (extra.empty() ? "" : ", " + extra) << "): " << std::fixed << std::setprecision(1) << r.seconds
              << " s\n"
              << std::flush;
    require_ok(r);
    REQUIRE(fs::exists(run));
    runs_[name] = run;
    return run;
  }

  // torch_step.py's replay of `run`, made once per label.
  fs::path replay(const fs::path& run, const std::string& label, int threads, const std::string& extra = "") {
    auto it = replays_.find(label);
    if (it != replays_.end()) return it->second;
    const fs::path ref = dir() / (label + "_ref.safetensors");
    const CommandResult r = run_command(torch_step_command(run, ref, threads, extra));
    std::cout << "torch_step.py " << label << ": " << std::fixed << std::setprecision(1) << r.seconds << " s\n"
              << std::flush;
    require_ok(r);
    replays_[label] = ref;
    return ref;
  }

 private:
  TempDir tmp_;
  std::map<std::string, fs::path> runs_;
  std::map<std::string, fs::path> replays_;
};

// Worst metrics of the rows of one kind.
struct KindSummary {
  int rows = 0;
  double max_rel_l2 = 0, min_cosine = 1, max_abs = 0;
  std::string rel_l2_at, cosine_at, abs_at;
  double max_update_rel_l2 = 0, min_update_cosine = 1;  // param_after: after - before
  std::string update_rel_l2_at, update_cosine_at;
};

std::map<std::string, KindSummary> summarise(const json& report) {
  std::map<std::string, KindSummary> out;
  for (const json& row : report.at("rows")) {
    if (row.at("metrics").is_null()) continue;
    KindSummary& k = out[row.at("kind").get<std::string>()];
    const std::string name = row.at("name").get<std::string>();
    const json& m = row.at("metrics");
    ++k.rows;
    // Worst first: a NaN metric (an all-zero tensor's cosine) must not hide behind the comparisons.
    const double rel = number(m.at("rel_l2")), cos = number(m.at("cosine")), abs = number(m.at("max_abs"));
    if (k.rel_l2_at.empty() || !(rel <= k.max_rel_l2)) k.max_rel_l2 = rel, k.rel_l2_at = name;
    if (!std::isnan(cos) && (k.cosine_at.empty() || cos < k.min_cosine)) k.min_cosine = cos, k.cosine_at = name;
    if (k.abs_at.empty() || !(abs <= k.max_abs)) k.max_abs = abs, k.abs_at = name;
    if (!row.at("update_metrics").is_null()) {
      const json& u = row.at("update_metrics");
      const double urel = number(u.at("rel_l2")), ucos = number(u.at("cosine"));
      if (k.update_rel_l2_at.empty() || !(urel <= k.max_update_rel_l2)) {
        k.max_update_rel_l2 = urel, k.update_rel_l2_at = name;
      }
      if (!std::isnan(ucos) && (k.update_cosine_at.empty() || ucos < k.min_update_cosine)) {
        k.min_update_cosine = ucos, k.update_cosine_at = name;
      }
    }
  }
  return out;
}

void print_summary(const std::string& title, const json& report) {
  const auto kinds = summarise(report);
  std::ostringstream s;
  s << title << ": " << report.at("summary").at("passed") << " passed, " << report.at("summary").at("failed")
    << " failed (profile " << report.at("profile").get<std::string>() << ")\n";
  s << std::scientific << std::setprecision(2);
  for (const char* kind : {"input", "param", "buffer", "act", "loss", "grad", "param_after", "buffer_after", "momentum"}) {
    auto it = kinds.find(kind);
    if (it == kinds.end()) continue;
    const KindSummary& k = it->second;
    s << "  " << std::left << std::setw(13) << kind << std::right << std::setw(4) << k.rows << " rows  ";
    if (std::string(kind) == "loss") {
      s << "|d| " << k.max_abs << "\n";
      continue;
    }
    s << "max relL2 " << k.max_rel_l2 << " (" << k.rel_l2_at << ")  min cos " << std::fixed << std::setprecision(8)
      << k.min_cosine << std::scientific << std::setprecision(2) << " (" << k.cosine_at << ")";
    if (std::string(kind) == "param_after") {
      s << "\n  " << std::setw(21) << "" << "update: max relL2 " << k.max_update_rel_l2 << " (" << k.update_rel_l2_at
        << ")  min cos " << std::fixed << std::setprecision(8) << k.min_update_cosine << std::scientific
        << std::setprecision(2) << " (" << k.update_cosine_at << ")";
    }
    s << "\n";
  }
  std::cout << s.str() << std::flush;
}

// The names of failing rows, for messages.
std::string failures(const json& report, std::size_t limit = 8) {
  std::string s;
  std::size_t n = 0;
  for (const json& row : report.at("rows")) {
    const std::string status = row.at("status").get<std::string>();
    if (status != "fail" && status != "shape_mismatch") continue;
    if (n++ < limit) s += row.at("name").get<std::string>() + " (" + row.at("reason").get<std::string>() + "); ";
  }
  return n == 0 ? "none" : std::to_string(n) + " failing: " + s;
}

// Replays `run` with torch_step.py and compares; requires exit 0 and every tensor passing.
json replay_and_compare(const fs::path& run, const std::string& label, const std::string& torch_extra = "",
                        const std::string& compare_extra = "") {
  const fs::path ref = Workspace::get().replay(run, label, 2, torch_extra);
  const fs::path report = Workspace::get().dir() / (label + "_compare.json");
  const CommandResult cmp = run_command(compare_command(run, ref, report, compare_extra));
  const json j = read_json(report);
  print_summary("wb compare " + label, j);
  INFO(cmp.command << "\n" << failures(j) << "\n" << tail(cmp.output, 1500));
  CHECK(j.at("summary").at("failed") == 0);
  CHECK(j.at("first_divergence").is_null());
  CHECK(cmp.exit_code == 0);
  return j;
}

// The kinds every comparison of a full step must cover, with how many rows (ResNet-50: 161 params,
// 159 buffers, 174 activations).
void check_coverage(const json& report) {
  std::map<std::string, int> rows;
  for (const json& row : report.at("rows")) {
    if (row.at("status").get<std::string>() == "pass") ++rows[row.at("kind").get<std::string>()];
  }
  CHECK(rows["input"] == 1);
  CHECK(rows["label"] == 1);
  CHECK(rows["param"] == 161);
  CHECK(rows["buffer"] == 159);
  CHECK(rows["act"] == 174);
  CHECK(rows["loss"] == 1);
  CHECK(rows["grad"] == 161);
  CHECK(rows["param_after"] == 161);
  CHECK(rows["buffer_after"] == 159);
  CHECK(rows["momentum"] == 161);
}

// The run most cases share: one rank, 32x32, batch 8. Weight decay 5e-4 (the CIFAR-10 recipe, rather
// than the default 1e-4) makes decaying the BatchNorm parameters visible in the first update.
fs::path single_run() { return Workspace::get().train("single32", 32, 8, "--weight-decay 5e-4"); }

}  // namespace

TEST_CASE("wb-train's dumped step 0 passes against torch_step.py (32x32, batch 8)", "[compare][trainer][python]") {
  const fs::path run = single_run();
  const json report = replay_and_compare(run, "single32");
  check_coverage(report);
}

TEST_CASE("wb-train's dumped step 0 passes against torch_step.py (224x224)", "[compare][trainer][python]") {
  const fs::path run = Workspace::get().train("single224", 224, kBatch224);
  const json report = replay_and_compare(run, "single224");
  check_coverage(report);
}

TEST_CASE("a 2-rank step 0 dumped on every rank passes against torch_step.py's DDP replay",
          "[compare][trainer][python][mpi]") {
  const fs::path run = Workspace::get().train("ranks2", 32, 8, "--nproc 2 --threads 1 --dump-ranks all");
  const fs::path dir = Workspace::get().dir();
  const json rank0 = replay_and_compare(run, "ranks2_rank0", "--rank 0", "--rank 0");
  check_coverage(rank0);
  const json rank1 = replay_and_compare(run, "ranks2_rank1", "--rank 1", "--rank 1");
  check_coverage(rank1);

  // The two ranks saw different batches, so their own gradients differ. With rank 1's dump removed,
  // torch_step.py replays rank 0's batch alone and marks grad, param_after and momentum as not
  // comparable: wb compare shows their metrics without judging them, and judged they would fail
  // against the run's averaged gradients (the comparisons above could not pass without the average).
  const fs::path alone = dir / "ranks2_rank0_alone.sqlite";
  fs::copy_file(run, alone, fs::copy_options::overwrite_existing);
  require_ok(run_command(quote(std::string(WB_PYTHON)) + " -c " +
                         quote(std::string("import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
                                           "db.execute('DELETE FROM tensor WHERE rank = 1'); db.commit()")) +
                         " " + quote(alone)));
  const fs::path ref = Workspace::get().replay(alone, "ranks2_rank0_alone", 2);
  const fs::path report = dir / "ranks2_alone_compare.json";
  const CommandResult cmp = run_command(compare_command(run, ref, report, "--rank 0"));
  const json j = read_json(report);
  INFO(tail(cmp.output, 1500));
  CHECK(cmp.exit_code == 0);
  CHECK(j.at("summary").at("failed") == 0);
  int skipped = 0, grads_off = 0, forward_passed = 0;
  for (const json& row : j.at("rows")) {
    const std::string kind = row.at("kind").get<std::string>();
    const std::string status = row.at("status").get<std::string>();
    if (kind == "grad" || kind == "param_after" || kind == "momentum") {
      skipped += status == "skipped";
      if (kind != "grad" || row.at("metrics").is_null()) continue;
      // Judged by the row's own thresholds, as if it were comparable.
      const json& m = row.at("metrics");
      const json& t = row.at("thresholds");
      const bool off = (t.contains("rel_l2_max") && number(m.at("rel_l2")) > t.at("rel_l2_max").get<double>()) ||
                       (t.contains("cosine_min") && number(m.at("cosine")) < t.at("cosine_min").get<double>());
      grads_off += off;
    } else if (kind == "act" || kind == "loss" || kind == "buffer_after") {
      forward_passed += status == "pass";
    }
  }
  std::cout << "without rank 1's dump: " << skipped << " grad/param_after/momentum rows not judged; " << grads_off
            << " of 161 gradients off the run's averaged ones beyond the grad thresholds; " << forward_passed
            << " of 334 act/loss/buffer_after rows pass\n";
  CHECK(skipped == 3 * 161);
  CHECK(grads_off >= 100);
  CHECK(forward_passed == 174 + 1 + 159);
}

TEST_CASE("no false alarms: a dump against itself, two replays of one run against each other",
          "[compare][trainer][python]") {
  const fs::path run = single_run();
  const fs::path dir = Workspace::get().dir();

  const CommandResult self = run_command(compare_command(run, run, dir / "self.json"));
  const json j = read_json(dir / "self.json");
  INFO(failures(j));
  CHECK(self.exit_code == 0);
  CHECK(j.at("summary").at("failed") == 0);
  CHECK(j.at("summary").at("passed") == 1139);
  for (const json& row : j.at("rows")) {
    if (!row.at("metrics").is_null()) CHECK(row.at("metrics").at("bit_exact").get<bool>());
  }

  // Two replays with different thread counts: the convolutions split their work differently, so the
  // results differ in the last bits; none of that may fail.
  const fs::path replay_a = Workspace::get().replay(run, "single32_1thread", 1);
  const fs::path replay_b = Workspace::get().replay(run, "single32", 2);
  const CommandResult cmp =
      run_command(compare_command(replay_a, replay_b, dir / "replays.json"));
  const json k = read_json(dir / "replays.json");
  print_summary("two torch_step.py replays (1 vs 2 threads)", k);
  INFO(failures(k));
  CHECK(cmp.exit_code == 0);
  CHECK(k.at("summary").at("failed") == 0);
  CHECK(k.at("summary").at("passed") == 1139);
}

// The matrix bench's quick cases (bench/compare_noise_matrix.py --quick: batch 4 on one rank, batch 4 on
// two ranks, seed 1): correct runs that the fixed thresholds fail (act.layer4.2.bn3 over 4 values per
// channel) pass within the reference's own noise. The full matrix is the bench.
TEST_CASE("no false alarms at batch 4: fixed thresholds fail correct runs, noise-aware bounds pass them",
          "[compare][trainer][python]") {
  const std::string command = quote(std::string(WB_PYTHON)) + " " +
                              quote(fs::path(WB_SOURCE_DIR) / "bench" / "compare_noise_matrix.py") + " --quick";
  const std::string env = "WB_BUILD_DIR=" + quote(fs::path(WB_BINARY_DIR)) + " ";
  const CommandResult r = run_command(env + command);
  std::cout << r.output << std::flush;
  INFO(tail(r.output, 3000));
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("noise-aware 0 runs (0 tensors)") != std::string::npos);
  // The same runs under the fixed thresholds: at least one false alarm, which the noise removes.
  CHECK(r.output.find("fixed thresholds 0 runs") == std::string::npos);
}

// A reference that records no noise of its own (torch_step.py --no-noise, as msprobe's or a user's dump):
// `wb estimate-noise` replays the run's step with other kernels and threads, and wb compare then judges
// each row within 5x that noise. A correct run at batch 4 passes; a planted fault still fails where it
// shows.
TEST_CASE("our own noise: wb estimate-noise judges a reference without noise of its own",
          "[compare][trainer][python]") {
  const fs::path run = Workspace::get().train("ours_b4", 32, 4);
  const fs::path ref = Workspace::get().replay(run, "ours_b4", 2, "--no-noise");
  const fs::path fault = Workspace::get().replay(run, "ours_b4_bn_eps", 2, "--no-noise --fault bn_eps");
  const fs::path dir = Workspace::get().dir();

  const CommandResult before = run_command(compare_command(run, ref, dir / "ours_before.json"));
  CHECK(read_json(dir / "ours_before.json").at("noise_note").get<std::string>().find("fixed thresholds") !=
        std::string::npos);

  // oneDNN's reference kernels alone (the third replay of a machine without AVX-512): another order, so
  // they move the ill-conditioned tensors; the default estimate below replaces what they stored.
  const CommandResult ref_kernels =
      run_command(quote(std::string(WB_CLI)) + " estimate-noise " + quote(run) + " --isa ref");
  INFO(ref_kernels.output);
  require_ok(ref_kernels);
  CHECK(ref_kernels.output.find("with reference kernels and") != std::string::npos);
  CHECK(ref_kernels.output.find("Estimated our own float32 noise on 764 tensors") != std::string::npos);
  {
    const json noise = json::parse(wb::store::Reader(run).meta().at("noise_estimate.step0.rank0"));
    CHECK(noise.at("method").get<std::string>().find("oneDNN's reference kernels") != std::string::npos);
    CHECK(noise.at("tensors").at("act.layer4.2.bn3").at("l2").get<double>() > 0.0);
  }

  const CommandResult est = run_command(quote(std::string(WB_CLI)) + " estimate-noise " + quote(run));
  std::cout << est.output << std::flush;
  require_ok(est);
  CHECK(est.output.find("Estimated our own float32 noise on 764 tensors of step 0, rank 0") != std::string::npos);

  const CommandResult after = run_command(compare_command(run, ref, dir / "ours_after.json"));
  const json j = read_json(dir / "ours_after.json");
  INFO(after.command << "\n" << failures(j) << "\n" << tail(after.output, 1500));
  CHECK(after.exit_code == 0);
  CHECK(j.at("summary").at("failed") == 0);
  CHECK(j.at("noise_note").get<std::string>().find("our own step's float32 noise") != std::string::npos);
  CHECK(j.at("noise_source") == "ours");
  int applied = 0;
  for (const json& row : j.at("rows")) applied += row.at("noise").at("applied").get<bool>();
  CHECK(applied > 700);  // of the 764 float tensors the step computes

  const CommandResult planted = run_command(compare_command(run, fault, dir / "ours_fault.json"));
  const json f = read_json(dir / "ours_fault.json");
  CHECK(planted.exit_code == 1);
  REQUIRE(!f.at("first_divergence").is_null());
  CHECK(f.at("first_divergence").at("name") == "act.layer2.1.bn2");
}

TEST_CASE("planted faults: wb compare names the tensor where each first shows", "[compare][trainer][python]") {
  const fs::path run = single_run();
  const fs::path dir = Workspace::get().dir();

  struct Fault {
    std::string name;
    std::string first;     // expected first divergence (a prefix ending in '.' for "any of these")
    std::string kind;
    bool optimizer_only;
    std::string status;    // of the first divergence's row
  };
  const std::vector<Fault> faults = {
      {"bn_eps", "act.layer2.1.bn2", "act", false, "fail"},
      {"conv_transpose", "act.layer3.0.conv2", "act", false, "fail"},
      {"missing_relu", "act.layer1.1.relu.0", "act", false, "fail"},
      {"stride", "act.layer2.0.conv2", "act", false, "shape_mismatch"},
      {"no_smoothing", "loss", "loss", false, "fail"},
      {"grad_scale", "grad.layer4.2.conv3.weight", "grad", false, "fail"},
      {"bn_momentum", "buffer_after.layer3.1.bn1.", "buffer_after", false, "fail"},
      {"lr", "param_after.", "param_after", true, "fail"},
      {"nesterov", "param_after.", "param_after", true, "fail"},
      {"wd_on_bn", "param_after.", "param_after", true, "fail"},
  };
  std::vector<std::vector<std::string>> jobs;
  for (const auto& f : faults) {
    const fs::path ref = dir / ("fault_" + f.name + ".safetensors");
    jobs.push_back({torch_step_command(run, ref, 1, "--fault " + f.name),
                    compare_command(run, ref, dir / ("fault_" + f.name + ".json"), "--threads 1")});
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = run_jobs(jobs, kJobsAtOnce);
  std::cout << faults.size() << " faults replayed and compared in " << std::fixed << std::setprecision(1)
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
  for (const auto& f : faults) fs::remove(dir / ("fault_" + f.name + ".safetensors"));

  for (std::size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    CAPTURE(f.name);
    require_ok(results[i].at(0));
    const json j = read_json(dir / ("fault_" + f.name + ".json"));
    INFO(tail(results[i].at(1).output, 1500));
    CHECK(results[i].at(1).exit_code == 1);
    REQUIRE(!j.at("first_divergence").is_null());
    const json& d = j.at("first_divergence");
    const std::string name = d.at("name").get<std::string>();
    std::string row_status = "(no row)";
    for (const json& row : j.at("rows")) {
      if (row.at("name") == name) row_status = row.at("status").get<std::string>();
    }
    std::ostringstream rel;
    if (d.at("rel_l2").is_null()) rel << "-";
    else rel << std::scientific << std::setprecision(2) << number(d.at("rel_l2"));
    std::cout << "fault " << std::left << std::setw(15) << f.name << std::right << "-> " << name << " ("
              << d.at("classification").get<std::string>() << ", relL2 " << rel.str() << "; "
              << d.at("reason").get<std::string>() << "); " << j.at("summary").at("failed") << " tensors fail\n";
    // Weight decay on BatchNorm moves an update by wd x p, under the gradients' own float32 noise at a
    // small batch; the momentum buffer's optimizer share (momentum - grad) shows it first then.
    const bool optimizer_share = f.name == "wd_on_bn" && name.rfind("momentum.", 0) == 0;
    if (optimizer_share) {
      CHECK(d.at("kind") == "momentum");
    } else if (f.first.back() == '.') {
      CHECK(name.rfind(f.first, 0) == 0);
      CHECK(d.at("kind") == f.kind);
    } else {
      CHECK(name == f.first);
      CHECK(d.at("kind") == f.kind);
    }
    CHECK(row_status == f.status);
    CHECK(d.at("optimizer_only").get<bool>() == f.optimizer_only);
    if (f.optimizer_only) {
      CHECK(d.at("summary").get<std::string>().find("Optimizer-only") != std::string::npos);
    }
    if (f.kind == "act" && f.status == "fail") CHECK(d.at("local").get<bool>());
    if (f.name == "wd_on_bn") {  // the first updated parameter that decays only under the fault
      const bool bn = name.find(".bn") != std::string::npos || name.rfind("param_after.bn", 0) == 0 ||
                      name.rfind("momentum.bn", 0) == 0 ||
                      name.find("downsample.1.") != std::string::npos;
      CHECK(bn);
    }
  }
  std::cout << std::flush;
}
