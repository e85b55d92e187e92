// The faults a long run meets, through wb-train as a user runs it: the disk fills while recording (a
// file size limit, RLIMIT_FSIZE via prlimit), the run file is in use by another process at start,
// non-finite values (a poisoned batch, a diverged loss) with --on-nonfinite stop|skip, and a rank that
// hangs (SIGSTOP) or dies (SIGKILL) in a 2- or 4-rank job, on the CPU over MPI and [cuda] over NCCL:
// every process is gone within 60 s, a message names the rank, and every rank's file opens.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <sqlite3.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "test_trainer_util.hpp"
#include "trainer/backend/backend.hpp"
#include "support/peers.hpp"

extern char** environ;

using wb::test::Result;
using wb::test::run_command;
using wb::test::shell_quote;
using wb::test::TempDir;
using wb::test::with;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> small_run() {
  return {"--data", "synthetic", "--synthetic-samples", "64", "--batch-size", "2", "--image-size", "32",
          "--threads", "1", "--seed", "5", "--log-every", "1"};
}

std::string command_line(const std::vector<std::string>& args) {
  std::string cmd = shell_quote(WB_TRAIN);
  for (const auto& a : args) {
    cmd += ' ';
    cmd += shell_quote(a);
  }
  return cmd;
}

std::size_t occurrences(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = text.find(needle); p != std::string::npos; p = text.find(needle, p + needle.size())) ++n;
  return n;
}

std::string integrity(const fs::path& file) {
  wb::store::Db db = wb::store::open_run(file, wb::store::OpenMode::read_only);
  wb::store::Statement& st = db.prepare("PRAGMA integrity_check");
  REQUIRE(st.step());
  std::string verdict = st.column_text(0);
  st.reset();
  return verdict;
}

// A job of `nproc` ranks (tiny: 32x32 images, batch 2, one compute thread per rank, a 6 s watchdog)
// in which rank `victim` gets `sig` once rank 0 has reported step 1 (every rank is then training:
// steps are collective). Waits at most 60 s for every process to be gone, then kills what is left.
struct RankFault {
  fs::path run_dir;    // the rank files
  std::string output;  // stdout and stderr of the whole job
  double seconds = 0;  // from the signal to the last process gone
  bool all_gone = false;
  int exit_code = 0;
};

RankFault run_rank_fault(const TempDir& dir, int nproc, int victim, int sig, const std::vector<std::string>& extra) {
  const fs::path run = dir / "fault.sqlite";
  const fs::path out = dir / "fault.stdout";
  const fs::path err = dir / "fault.stderr";
  std::vector<std::string> args = with(small_run(), {"--nproc", std::to_string(nproc), "--steps", "100000",
                                                     "--watchdog-s", "6", "--run", run.string()});
  args = with(args, extra);
  const pid_t launcher = wb::test::spawn_train(args, out, err);  // wb-train, which replaces itself with mpirun

  using Clock = std::chrono::steady_clock;
  const auto setup_deadline = Clock::now() + std::chrono::seconds(300);
  std::vector<pid_t> ranks;
  const std::string started = "step 1 [2/100000]";
  while (Clock::now() < setup_deadline) {
    ranks = wb::test::children_named(launcher, "wb-train");
    if (static_cast<int>(ranks.size()) == nproc && wb::test::read_text(out).find(started) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  CAPTURE(wb::test::read_text(out), wb::test::read_text(err));
  REQUIRE(static_cast<int>(ranks.size()) == nproc);
  REQUIRE(wb::test::read_text(out).find(started) != std::string::npos);
  pid_t target = 0;
  for (pid_t p : ranks) target = wb::test::rank_of(p) == victim ? p : target;
  REQUIRE(target != 0);

  REQUIRE(kill(target, sig) == 0);
  const auto signalled = Clock::now();
  int status = 0;
  bool launcher_done = false;
  auto any_alive = [&] {
    for (pid_t p : ranks)
      if (wb::test::alive(p)) return true;
    return false;
  };
  while (Clock::now() - signalled < std::chrono::seconds(60)) {
    if (!launcher_done && waitpid(launcher, &status, WNOHANG) == launcher) launcher_done = true;
    if (launcher_done && !any_alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  RankFault f;
  f.seconds = std::chrono::duration<double>(Clock::now() - signalled).count();
  f.all_gone = launcher_done && !any_alive();
  if (!launcher_done) {  // leave nothing behind before failing
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
  }
  for (pid_t p : ranks)
    if (wb::test::alive(p)) kill(p, SIGKILL);
  f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  f.output = wb::test::read_text(out) + wb::test::read_text(err);
  f.run_dir = dir / "fault";
  std::printf("%d ranks, %s of rank %d: every process gone after %.2f s, exit code %d\n", nproc,
              sig == SIGSTOP ? "SIGSTOP" : "SIGKILL", victim, f.seconds, f.exit_code);
  return f;
}

// Every rank's file opens and passes SQLite's integrity check, holds the job's world size, and the
// victim's is marked incomplete; rank 0 recorded its first two steps.
void check_rank_files(const RankFault& f, int nproc, int victim) {
  for (int r = 0; r < nproc; ++r) {
    const fs::path file = f.run_dir / ("rank-" + std::to_string(r) + ".sqlite");
    CAPTURE(file);
    REQUIRE(fs::exists(file));
    CHECK(integrity(file) == "ok");
    wb::store::Reader reader(file);
    CHECK(reader.world_size() == nproc);
    if (r == victim) CHECK_FALSE(reader.complete());
    if (r == 0) CHECK(reader.steps(0).size() >= 2);
  }
}

// The ranks named "stopped responding" in the watchdogs' messages.
std::set<int> named_stopped(const std::string& output) {
  static const std::regex kStopped(R"(rank (\d+) stopped responding \(last heartbeat [0-9.]+ s ago)");
  std::set<int> out;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), kStopped); it != std::sregex_iterator(); ++it)
    out.insert(std::stoi((*it)[1].str()));
  return out;
}

void check_hang(int nproc, int victim, const std::vector<std::string>& extra = {}) {
  TempDir dir;
  const RankFault f = run_rank_fault(dir, nproc, victim, SIGSTOP, extra);
  CAPTURE(f.seconds, f.exit_code, f.output);
  CHECK(f.all_gone);
  CHECK(f.seconds < 60.0);
  CHECK(f.exit_code != 0);
  // A survivor's watchdog timed out in an allreduce and named the stopped rank, and only it.
  CHECK(f.output.find("has not completed after 6 s") != std::string::npos);
  CHECK(named_stopped(f.output) == std::set<int>{victim});
  check_rank_files(f, nproc, victim);
}

void check_death(int nproc, int victim, const std::vector<std::string>& extra = {}) {
  TempDir dir;
  const RankFault f = run_rank_fault(dir, nproc, victim, SIGKILL, extra);
  CAPTURE(f.seconds, f.exit_code, f.output);
  CHECK(f.all_gone);
  CHECK(f.seconds < 60.0);
  CHECK(f.exit_code != 0);
  // mpirun names the dead rank ("process rank R with PID ... exited on signal 9") when it notices
  // first; a survivor's watchdog names it when it times out first ("rank R is gone (process ...").
  const std::string r = std::to_string(victim);
  CHECK((f.output.find("process rank " + r + " with PID") != std::string::npos ||
         f.output.find("rank " + r + " is gone (process ") != std::string::npos));
  check_rank_files(f, nproc, victim);
}

}  // namespace

TEST_CASE("wb-train: a rank stopped by SIGSTOP in a 2-rank job is named by the watchdog, all exit, all files open",
          "[trainer][mpi][fault]") {
  check_hang(2, 1);
}

TEST_CASE("wb-train: a rank stopped by SIGSTOP in a 4-rank job is named by the watchdog, all exit, all files open",
          "[trainer][mpi][fault]") {
  check_hang(4, 2);
}

TEST_CASE("wb-train: a rank killed by SIGKILL in a 2-rank job is named, all exit, all files open, its own incomplete",
          "[trainer][mpi][fault]") {
  check_death(2, 1);
}

TEST_CASE("wb-train: a rank killed by SIGKILL in a 4-rank job is named, all exit, all files open, its own incomplete",
          "[trainer][mpi][fault]") {
  check_death(4, 2);
}

// NCCL needs MPI (its unique id travels over it): a build without MPI has no NCCL, and this case is not built.
#ifdef WB_PARALLEL_MPI
TEST_CASE("wb-train over NCCL: a rank stopped by SIGSTOP, then one killed, are named, all exit, all files open",
          "[trainer][mpi][fault][cuda]") {
  const int devices = wb::backend::cuda_device_count();
  REQUIRE(devices > 0);  // the test main skips [cuda] cases without a device
  std::vector<std::string> extra = {"--device", "cuda"};
  if (devices == 1) extra = with(extra, {"--ranks-per-gpu", "2"});
  check_hang(2, 1, extra);
  check_death(2, 1, extra);
}
#endif  // WB_PARALLEL_MPI

TEST_CASE("wb-train: the disk fills while recording: training goes on, one report, losses counted, run incomplete",
          "[trainer]") {
  TempDir dir;
  const fs::path run = dir / "full.sqlite";
  // 3 MB per file: the first steps fit; step 3's dump (every tensor of ResNet-50, ~400 MB) cannot.
  constexpr int kSteps = 10;
  const auto args = with(small_run(), {"--steps", std::to_string(kSteps), "--dump-step", "3", "--run", run.string()});
  const Result r = run_command("prlimit --fsize=3000000 " + command_line(args));
  CAPTURE(r.exit_code, r.err, r.out);
  // Training went on to the end; the failure is reported once, and what was lost is counted.
  CHECK(r.exit_code == 0);
  const std::string all_steps = std::to_string(kSteps);
  CHECK(r.out.find(std::string("[").append(all_steps).append("/").append(all_steps).append("]")) != std::string::npos);
  CHECK(occurrences(r.err, "recording to " + run.string() + " failed") == 1);
  CHECK(r.err.find("events were dropped") != std::string::npos);
  CHECK(r.out.find("(incomplete)") != std::string::npos);
  REQUIRE(fs::exists(run));
  CHECK(fs::file_size(run) <= 3'000'000);

  // The file opens, is consistent, says it is incomplete and how much was dropped, and holds what was
  // recorded before and after the failed batch.
  CHECK(integrity(run) == "ok");
  wb::store::Reader reader(run);
  CHECK_FALSE(reader.complete());
  const std::int64_t dropped = std::stoll(reader.meta().at("dropped_events"));
  const auto tensors = static_cast<std::int64_t>(reader.tensors().size());
  CAPTURE(dropped, tensors);
  // Each of the dump's ~1140 tensors is in the file or counted as dropped (batches of small activations
  // may still fit; the parameters, gradients and momentum, ~100 MB each, cannot).
  CHECK(dropped + tensors >= 1000);
  CHECK(tensors < 1000);
  const auto ranks = reader.ranks();
  REQUIRE(ranks.size() == 1);
  CHECK(ranks[0].dropped_events == dropped);
  std::set<int> steps;
  for (const auto& s : reader.steps()) steps.insert(s.step);
  CAPTURE(steps.size());
  CHECK(steps.count(0) == 1);
  // Recording goes on after the failed batch: the WAL is folded back into the file, and the next
  // steps are recorded where that left room. How much of the dump was committed before the limit
  // (and so the room left) depends on the commits' timing; where none was left, the later steps'
  // events are counted as dropped too, never lost silently.
  constexpr std::int64_t kDumpTensors = 1139;
  if (steps.count(kSteps - 1) == 0) CHECK(dropped > kDumpTensors - tensors);
}

TEST_CASE("wb-train: a run file in use by another process is one clear error at start, before training",
          "[trainer]") {
  TempDir dir;
  const fs::path run = dir / "busy.sqlite";
  const auto args = with(small_run(), {"--steps", "2", "--run", run.string()});

  SECTION("another program holds a lock on it") {
    {
      wb::store::WriterOptions o;
      o.path = run;
      o.handle_signals = false;
      wb::store::Writer w(o);
      REQUIRE(w.finish());
    }
    const std::string before = wb::test::read_text(run);
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(run.c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) == SQLITE_OK);
    const Result r = wb::test::run_train(args);
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db);
    wb::test::require_one_line_error(r, {run.string() + ": in use", "lock"});
    CHECK(r.out.find("step ") == std::string::npos);  // nothing trained
    CHECK(wb::test::read_text(run) == before);       // nor was the file touched
  }
  SECTION("another wb-train is recording into it") {
    wb::store::WriterOptions o;
    o.path = run;
    o.handle_signals = false;
    wb::store::Writer w(o);  // a live writer, as a running wb-train holds one
    auto track = w.add_track(wb::store::TrackKind::thread, "main");
    w.add(wb::store::RangeRow{track, w.intern("step"), 1, 2, 0, 0, 0, 0});
    w.flush();
    const Result r = wb::test::run_train(args);
    wb::test::require_one_line_error(r, {run.string() + ": in use", "recording into it"});
    CHECK(r.out.find("step ") == std::string::npos);
    // The other recording goes on unharmed.
    w.add(wb::store::RangeRow{track, w.intern("step"), 3, 4, 0, 0, 1, 0});
    REQUIRE(w.finish());
    wb::store::Reader reader(run);
    CHECK(reader.complete());
    CHECK(reader.row_counts().at("range") == 2);
  }
}

TEST_CASE("wb-train: non-finite values stop the run at their step, naming the first tensor, and are recorded",
          "[trainer]") {
  TempDir dir;
  const fs::path run = dir / "nan.sqlite";
  SECTION("a poisoned batch: --check-finite names the tensor, though the loss stays finite") {
    // The CPU backend's ReLU turns the NaN into 0 (PyTorch's keeps it), so only the check sees it.
    const Result r = wb::test::run_train(
        with(small_run(), {"--steps", "6", "--poison-step", "2", "--check-finite", "--run", run.string()}));
    CAPTURE(r.exit_code, r.err, r.out);
    CHECK(r.exit_code == 1);
    CHECK(wb::test::count_lines(r.err) == 1);
    CHECK(r.err.find("rank 0: non-finite values at step 2; first non-finite tensor: act.conv1 (the loss, ") !=
          std::string::npos);
    CHECK(r.err.find("stayed finite); stopping") != std::string::npos);
    wb::store::Reader reader(run);
    CHECK_FALSE(reader.complete());
    const auto log = nlohmann::json::parse(reader.meta().at("nonfinite"));
    REQUIRE(log.size() == 1);
    CHECK(log[0]["step"] == 2);
    CHECK(log[0]["rank"] == 0);
    CHECK(log[0]["loss"].is_number());
    CHECK(log[0]["first_tensor"] == "act.conv1");
    CHECK(log[0]["action"] == "stop");
    CHECK(reader.meta().at("steps_done") == "3");
    CHECK(reader.steps().size() == 3);
  }
  SECTION("a diverged loss without the check: the step is named and the way to find the tensor given") {
    const Result r =
        wb::test::run_train(with(small_run(), {"--steps", "6", "--lr", "1e30", "--run", run.string()}));
    CAPTURE(r.exit_code, r.err);
    CHECK(r.exit_code == 1);
    CHECK(wb::test::count_lines(r.err) == 1);  // the recording did not fail on the NaN step row
    // Which step first overflows depends on the CPU's kernels (step 1 with AVX-512, step 2 with AVX2):
    // whichever it is, the message, the log and the step rows agree on it, and every step before it is
    // finite.
    wb::store::Reader reader(run);
    const auto log = nlohmann::json::parse(reader.meta().at("nonfinite"));
    REQUIRE(log.size() == 1);
    const int bad = log[0]["step"].get<int>();
    CHECK(bad >= 1);
    CHECK(bad <= 3);
    const std::string step = std::to_string(bad);
    CHECK(r.err.find("rank 0: loss is nan at step " + step + "; rerun with --check-finite (or --dump-step " + step +
                     ")") != std::string::npos);
    CHECK(log[0]["loss"] == "nan");
    CHECK(log[0]["first_tensor"].is_null());
    const auto steps = reader.steps();
    REQUIRE(steps.size() == static_cast<std::size_t>(bad) + 1);  // the NaN step's row too, its loss read back as NaN
    for (int i = 0; i < bad; ++i) CHECK(std::isfinite(steps[static_cast<std::size_t>(i)].loss));
    CHECK(std::isnan(steps[static_cast<std::size_t>(bad)].loss));
    CHECK(reader.meta().at("dropped_events") == "0");
  }
  SECTION("a bad --on-nonfinite is a usage error") {
    wb::test::require_one_line_error(wb::test::run_train(with(small_run(), {"--on-nonfinite", "ignore"})),
                                     {"--on-nonfinite", "stop or skip", "ignore"});
  }
}

TEST_CASE("wb-train --on-nonfinite skip: the poisoned step changes nothing and training goes on", "[trainer]") {
  TempDir dir;
  // Two steps, saved; and three steps whose last batch is poisoned and skipped. The skipped step must
  // leave parameters, momentum and batch-norm statistics exactly as the first two steps left them.
  const fs::path two = dir / "two.safetensors";
  const fs::path skipped = dir / "skipped.safetensors";
  const Result a = wb::test::run_train(with(small_run(), {"--steps", "2", "--save", two.string(), "--run",
                                                           (dir / "two.sqlite").string()}));
  REQUIRE(a.exit_code == 0);
  const Result b = wb::test::run_train(with(small_run(), {"--steps", "3", "--poison-step", "2", "--on-nonfinite", "skip",
                                                           "--check-finite", "--save", skipped.string(), "--run",
                                                           (dir / "skip.sqlite").string()}));
  CAPTURE(b.exit_code, b.err, b.out);
  REQUIRE(b.exit_code == 0);
  CHECK(b.err.find("non-finite values at step 2; first non-finite tensor: act.conv1") != std::string::npos);
  CHECK(b.err.find("the step's update is skipped") != std::string::npos);
  const auto ca = wb::test::read_checkpoint(two);
  const auto cb = wb::test::read_checkpoint(skipped);
  const auto diff = wb::test::diff_checkpoints(ca, cb, "");
  CHECK(diff.compared == static_cast<int>(ca.size()));
  CHECK(diff.compared > 300);  // parameters and buffers (and num_batches_tracked)
  CHECK(diff.differing == 0);
  wb::store::Reader reader(dir / "skip.sqlite");
  CHECK(reader.complete());
  const auto log = nlohmann::json::parse(reader.meta().at("nonfinite"));
  REQUIRE(log.size() == 1);
  CHECK(log[0]["action"] == "skip");

  // And the run goes on after a skipped step: 5 steps, the third skipped, all five recorded, finite after.
  const Result c = wb::test::run_train(with(small_run(), {"--steps", "5", "--poison-step", "2", "--on-nonfinite",
                                                           "skip", "--check-finite", "--run", (dir / "on.sqlite").string()}));
  CAPTURE(c.err);
  REQUIRE(c.exit_code == 0);
  const auto steps = wb::store::Reader(dir / "on.sqlite").steps();
  REQUIRE(steps.size() == 5);
  CHECK(std::isfinite(steps[3].loss));
  CHECK(std::isfinite(steps[4].loss));
}
