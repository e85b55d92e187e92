// wb estimate-noise RUN: our own step's float32 noise, for references that record none. Replays RUN's
// dumped step with wb-train (its own configuration) under another summation order, and stores per tensor
// how far the replay is from the dump (compare/noise_estimate.hpp) in RUN, where wb compare finds it.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/cli.hpp"
#include "app/model/child_process.hpp"
#include "compare/load.hpp"
#include "compare/noise_estimate.hpp"
#include "store/db.hpp"
#include "store/reader.hpp"

namespace wb::cli {

namespace {

namespace fs = std::filesystem;

const char* kUsage =
    "usage: wb estimate-noise RUN [--isa ISA|ref]... [--threads N] [--step S] [--rank R] [--keep]\n"
    "Replays RUN's dumped step with wb-train (RUN's own configuration, the same seed and data) under other\n"
    "summation orders: oneDNN's kernels of other ISAs or its reference kernels, and another thread count.\n"
    "The largest distance of a replay from the dump, per tensor, is our own float32 noise on it; it is stored\n"
    "in RUN, and wb compare judges each tensor within 5x that noise when the reference records none of its\n"
    "own (msprobe, TroubleShooter, torch.save, a dumper of your own). A replay must start from the same\n"
    "input, labels, parameters and buffers, bit for bit: a dump of step 0, or of a run resumed from a\n"
    "checkpoint.\n"
    "  --isa ISA     ONEDNN_MAX_CPU_ISA of a replay, once per replay; ref: oneDNN's reference kernels\n"
    "                (wb-train --reference-kernels, plain loops, slow). Default: the first two of AVX2,\n"
    "                AVX512_CORE, SSE41 (those the machine has) and ref, other than the run's: AVX2 and\n"
    "                SSE41 on an AVX-512 machine, SSE41 and ref on an AVX2 one\n"
    "  --threads N   the replays' threads (default: 1, or 2 when the run had 1)\n"
    "  --step S      the dump to estimate (default: the only or first one)\n"
    "  --rank R      its rank (default: the only or first one)\n"
    "  --keep        keep the replays' run files (RUN.noise/replay-<i>.sqlite)\n"
    "wb-train is the one next to wb, or $WB_TRAIN_BIN.";

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Two ISAs other than the one the run most likely used (the machine's best, or $ONEDNN_MAX_CPU_ISA's),
// among AVX2, AVX512_CORE, SSE41 (those the machine has) and oneDNN's reference kernels ("REF"), in that
// order: AVX2 and SSE41 on an AVX-512 machine, AVX512_CORE and SSE41 for a run capped at AVX2 there, SSE41
// and REF on an AVX2 machine. (AVX's kernels sum much as AVX2's do: SSE41 and AVX undershot an
// ill-conditioned step where SSE41 and REF, plain loops, keep twice the margin.)
std::vector<std::string> other_isas() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2"),
             avx = __builtin_cpu_supports("avx");
  const char* env = std::getenv("ONEDNN_MAX_CPU_ISA");
  std::string used = env ? upper(env) : "";
  if (used.empty() || used == "ALL") used = avx512 ? "AVX512_CORE" : avx2 ? "AVX2" : avx ? "AVX" : "SSE41";
  auto family = [](const std::string& isa) {
    if (isa.rfind("AVX512", 0) == 0 || isa.rfind("AVX10", 0) == 0) return std::string("AVX512");
    if (isa.rfind("AVX2", 0) == 0) return std::string("AVX2");
    return isa;
  };
  std::vector<std::string> out;
  for (const auto& [isa, have] : {std::pair<std::string, bool>{"AVX2", avx2}, {"AVX512_CORE", avx512}, {"SSE41", true},
                                  {"REF", true}})
    if (have && family(isa) != family(used) && out.size() < 2) out.push_back(isa);
  return out;
}

// "AVX2", or "reference" for REF: how the method line and the progress name a replay's kernels.
std::string kernels_name(const std::string& isa) { return isa == "REF" ? "reference" : isa; }

// The dump's step and rank: the flags', else the smallest of the run's own ("run") dumps.
std::pair<std::int32_t, std::int32_t> pick_dump(const Args& args, const fs::path& run) {
  store::Reader reader(run);
  std::set<std::pair<std::int32_t, std::int32_t>> dumps;
  for (const auto& t : reader.tensors())
    if (t.source == "run") dumps.insert({t.step, t.rank});
  if (dumps.empty()) args.fail(run.string() + ": no dumped step (record one with wb-train --dump-step 0)");
  const auto step = args.int_value("--step", 0, 1 << 30);
  const auto rank = args.int_value("--rank", 0, 1 << 20);
  for (const auto& [s, r] : dumps)
    if ((!step || s == *step) && (!rank || r == *rank)) return {s, r};
  args.fail(run.string() + ": no dump of step " + (step ? std::to_string(*step) : "any") + ", rank " +
            (rank ? std::to_string(*rank) : "any"));
}

// Sets an environment variable for the children started while it lives, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Runs the replay; returns its run file, or throws naming wb-train's last lines.
fs::path replay(const nlohmann::json& config, int world, const fs::path& dir, const std::string& stem,
               const std::string& isa, int threads) {
  nlohmann::json c = config;
  c.erase("config_file");
  c.erase("run");
  if (world > 1) c["nproc"] = world;  // each rank records its own config with nproc 0
  c["threads"] = threads;
  c["steps"] = c.value("dump_step", 0) + 1;
  c["warmup_steps"] = 0;
  c["profile"] = false;
  c["memory_profile"] = false;
  c["calibrate_comm"] = false;
  c["reference_kernels"] = isa == "REF";
  fs::create_directories(dir);
  const fs::path config_path = dir / (stem + ".json"), run_path = dir / (stem + ".sqlite");
  {
    std::ofstream out(config_path);
    out << c.dump(2) << "\n";
    if (!out) throw std::runtime_error(config_path.string() + ": cannot write the wb-train config");
  }
  std::error_code ec;
  fs::remove(run_path, ec);
  std::optional<ScopedEnv> env;
  if (isa != "REF") env.emplace("ONEDNN_MAX_CPU_ISA", isa);
  app_model::ChildProcess child(app_model::train_executable(), {"--config", config_path.string(), "--run", run_path.string()});
  const int rc = child.wait();
  if (rc != 0) {
    std::string tail;
    const auto lines = child.lines();
    for (std::size_t i = lines.size() > 6 ? lines.size() - 6 : 0; i < lines.size(); ++i) tail += "\n  " + lines[i];
    throw std::runtime_error("the replay (wb-train --config " + config_path.string() + ") exited with " +
                             std::to_string(rc) + "; its last lines:" + tail);
  }
  return run_path;
}

// The tensors the replay moved most, relative to their norm: where the step is least well conditioned.
void print_noisiest(const nlohmann::json& tensors, std::size_t count) {
  std::vector<std::pair<double, std::string>> rel;
  for (const auto& [key, e] : tensors.items()) {
    const double ref = e["ref_l2"].get<double>();
    if (ref > 0.0) rel.emplace_back(e["l2"].get<double>() / ref, key);
  }
  std::sort(rel.rbegin(), rel.rend());
  std::cout << "  largest (rel-L2 of the farthest replay from the dump):\n";
  for (std::size_t i = 0; i < rel.size() && i < count; ++i) {
    char line[160];
    std::snprintf(line, sizeof line, "    %-48s %.3g\n", rel[i].second.c_str(), rel[i].first);
    std::cout << line;
  }
}

}  // namespace

int cmd_estimate_noise(int argc, char** argv) {
  Args args(argc, argv, kUsage, {{"--isa"}, {"--threads"}, {"--step"}, {"--rank"}, {"--keep", false}});
  const fs::path run_path = args.positionals(1, 1)[0];
  nlohmann::json config;
  int world = 1;
  {
    store::Reader reader(run_path);
    const auto meta = reader.meta();
    if (const auto w = meta.find("world_size"); w != meta.end()) world = std::max(1, std::atoi(w->second.c_str()));
    const auto it = meta.find("config_json");
    if (it == meta.end() || it->second.empty())
      args.fail(run_path.string() + ": no recorded configuration (meta config_json); estimate-noise replays a wb-train run");
    config = nlohmann::json::parse(it->second, nullptr, false);
    if (!config.is_object()) args.fail(run_path.string() + ": meta config_json is not a JSON object");
  }
  const auto [step, rank] = pick_dump(args, run_path);
  if (config.value("dump_step", -1) != step)
    args.fail(run_path.string() + ": the configuration dumps step " + std::to_string(config.value("dump_step", -1)) +
              ", not step " + std::to_string(step) + " (a dump made otherwise cannot be replayed)");
  const int run_threads = config.value("threads", 0);
  const int threads = static_cast<int>(args.int_value("--threads", 1, 1024).value_or(run_threads == 1 ? 2 : 1));
  std::vector<std::string> isas;
  for (const std::string& isa : args.values("--isa")) {
    static const std::set<std::string> known = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI",
                                                "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "REF"};
    if (!known.count(upper(isa)))
      args.fail("--isa " + isa +
                ": expected one of oneDNN's ISAs (SSE41, AVX, AVX2, AVX2_VNNI, AVX512_CORE, ...) or ref");
    isas.push_back(upper(isa));
  }
  if (isas.empty()) isas = other_isas();
  std::string isa_list;
  for (const std::string& isa : isas) isa_list += (isa_list.empty() ? "" : ", ") + kernels_name(isa);
  const std::string method = "our step replayed with oneDNN's " + isa_list + " kernels and " + std::to_string(threads) +
                             (threads == 1 ? " thread" : " threads") + ", the largest distance; the run had " +
                             (run_threads > 0 ? std::to_string(run_threads) : std::string("the default")) + " threads";

  const fs::path dir = run_path.string() + ".noise";
  std::vector<fs::path> replay_paths;
  for (std::size_t i = 0; i < isas.size(); ++i) {
    std::cout << "Replaying step " << step << " of " << run_path.string() << " with " << kernels_name(isas[i])
              << " kernels and " << threads << (threads == 1 ? " thread" : " threads") << " ..." << std::flush;
    replay_paths.push_back(replay(config, world, dir, "replay-" + std::to_string(i + 1), isas[i], threads));
    std::cout << " done\n";
  }

  compare::LoadOptions lo;
  lo.source = "run";
  lo.step = step;
  lo.rank = rank;
  const compare::TensorSet dump = compare::load_tensor_set(run_path, lo);
  std::vector<compare::TensorSet> replays;
  std::vector<const compare::TensorSet*> replay_ptrs;
  for (const fs::path& p : replay_paths) replays.push_back(compare::load_tensor_set(p, lo));
  for (const auto& r : replays) replay_ptrs.push_back(&r);
  compare::NoiseEstimate est;
  try {
    est = compare::estimate_noise(dump, replay_ptrs, method);
  } catch (const compare::CompareError& e) {
    std::cerr << "wb estimate-noise: " << e.what()
              << "; a dump after step 0 depends on the summation order of the steps before it: dump step 0\n";
    return 1;
  }
  if (est.tensors == 0) args.fail(run_path.string() + ": the dump holds no float tensor the replay also holds");
  {
    store::Db db = store::open_run(run_path, store::OpenMode::read_write);
    db.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)")
        .bind(1, compare::noise_estimate_key(step, rank))
        .bind(2, est.json.dump())
        .run();
  }
  if (!args.has("--keep")) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::cout << "Estimated our own float32 noise on " << est.tensors << " tensors of step " << step << ", rank " << rank
            << " (" << est.moved << " moved with the summation order; " << est.tensors - est.moved
            << " did not, and keep the fixed bounds)\n";
  print_noisiest(est.json["tensors"], 5);
  std::cout << "Stored in " << run_path.string() << " (meta " << compare::noise_estimate_key(step, rank)
            << "): wb compare uses it when the reference records no noise of its own.\n";
  return 0;
}

}  // namespace wb::cli
