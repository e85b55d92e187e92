// wb-train --capture, checked on real runs (synthetic 32x32 data, batch 2, one thread) through the run
// file's rows:
//   (a) slow:K with one step slowed on purpose (--slow-step): the file keeps that step and the
//       --capture-window steps each side, every one of them with all its main-thread ranges (as many as a
//       full recording of the same run has), no range or counter of any other step, the whole step table,
//       and one capture_window row naming the step; wb report lists the window;
//   (b) steps:A-B keeps exactly A..B; a window past the run's end keeps nothing and marks nothing;
//   (c) signal: SIGUSR1 sent to a running wb-train keeps the next N steps;
//   (d) 2 ranks: SIGUSR1 to rank 1 only, and both ranks' files keep the same window (merged file);
//   (e) bad values are one line and exit code 2.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store/db.hpp"
#include "test_trainer_util.hpp"
#include "support/peers.hpp"

extern char** environ;

namespace {

using wb::test::Result;
using wb::test::run_train;
using wb::test::TempDir;
using wb::test::spawn_train;
using wb::test::with;
namespace fs = std::filesystem;

std::vector<std::string> small(const fs::path& run, int steps) {
  return {"--data", "synthetic", "--synthetic-samples", "64", "--batch-size", "2", "--image-size", "32", "--threads", "1",
          "--log-every", "1", "--steps", std::to_string(steps), "--run", run.string()};
}

std::set<std::int64_t> ints(wb::store::Db& db, const std::string& sql) {
  std::set<std::int64_t> out;
  auto& st = db.prepare(sql);
  while (st.step()) out.insert(st.column_int64(0));
  st.reset();
  return out;
}

std::set<std::int64_t> span(std::int64_t a, std::int64_t b) {
  std::set<std::int64_t> out;
  for (std::int64_t k = a; k <= b; ++k) out.insert(k);
  return out;
}

struct Window {
  std::int64_t rank, first, last, trigger_step;
  std::string trigger, detail;
};

std::vector<Window> windows(wb::store::Db& db) {
  std::vector<Window> out;
  auto& st = db.prepare("SELECT rank, first_step, last_step, trigger_step, trigger, detail FROM capture_window ORDER BY rank, first_step");
  while (st.step())
    out.push_back({st.column_int64(0), st.column_int64(1), st.column_int64(2), st.column_int64(3), st.column_text(4),
                   st.column_text(5)});
  st.reset();
  return out;
}

// Steps of a rank's range rows, of its main-thread ranges per step, and of its allreduce rows.
std::string range_steps(int rank) {
  return "SELECT DISTINCT r.step FROM range r JOIN track t ON t.id = r.track_id WHERE t.rank = " + std::to_string(rank);
}
std::map<std::int64_t, std::int64_t> main_ranges_per_step(wb::store::Db& db) {
  std::map<std::int64_t, std::int64_t> out;
  auto& st = db.prepare(
      "SELECT r.step, count(*) FROM range r JOIN track t ON t.id = r.track_id JOIN string s ON s.id = t.name_id "
      "WHERE s.text = 'main' GROUP BY r.step");
  while (st.step()) out[st.column_int64(0)] = st.column_int64(1);
  st.reset();
  return out;
}

// Counters are stamped with the step running when they were sampled: they must lie after the end of
// the step before the window and before the start of the step after it.
void require_counters_inside(wb::store::Db& db, std::int64_t first, std::int64_t last) {
  const std::int64_t lo = first > 0 ? db.query_int64("SELECT end_ns FROM step WHERE rank = 0 AND step = " + std::to_string(first - 1))
                                    : db.query_int64("SELECT start_ns FROM step WHERE rank = 0 AND step = 0") - 1'000'000'000;
  const std::int64_t after = db.query_int64("SELECT count(*) FROM step WHERE rank = 0 AND step = " + std::to_string(last + 1));
  const std::int64_t hi = after > 0 ? db.query_int64("SELECT start_ns FROM step WHERE rank = 0 AND step = " + std::to_string(last + 1))
                                    : db.query_int64("SELECT max(end_ns) FROM step") + 1'000'000'000;
  CHECK(db.query_int64("SELECT count(*) FROM counter") > 0);
  CHECK(db.query_int64("SELECT count(*) FROM counter WHERE t_ns <= " + std::to_string(lo) + " OR t_ns >= " +
                       std::to_string(hi)) == 0);
}

// Waits (up to 300 s) until `out` holds `text`; false when the process ended or time ran out first.
bool wait_for_output(pid_t pid, const fs::path& out, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < deadline) {
    if (wb::test::read_text_if_present(out).find(text) != std::string::npos) return true;
    if (!wb::test::alive(pid)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("wb-train --capture slow:K keeps the slowed step and its neighbours, and nothing else but the step table",
          "[trainer][capture]") {
  TempDir dir;
  const fs::path full = dir / "full.sqlite", slow = dir / "slow.sqlite";
  // Steps take about 0.2 s here; step 12 sleeps 3 s more, far beyond 5x the median even on a loaded machine.
  const Result f = run_train(with(small(full, 24), {"--slow-step", "12:3000000"}));
  REQUIRE(f.exit_code == 0);
  const Result r = run_train(with(small(slow, 24), {"--capture", "slow:5", "--capture-window", "2", "--slow-step", "12:3000000"}));
  CAPTURE(r.out, r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("--capture slow:5: kept the events of 5 of 24 steps in 1 window(s)") != std::string::npos);

  wb::store::Db db = wb::store::open_run(slow);
  wb::store::Db ref = wb::store::open_run(full);
  CHECK(db.query_int64("SELECT count(*) FROM step") == 24);  // the step table stays whole
  {
    auto& st = db.prepare("SELECT value FROM meta WHERE key = 'capture'");
    REQUIRE(st.step());
    CHECK(st.column_text(0) == "slow:5 (window 2)");
    st.reset();
  }
  const auto w = windows(db);
  REQUIRE(w.size() == 1);
  CHECK(w[0].rank == 0);
  CHECK(w[0].first == 10);
  CHECK(w[0].last == 14);
  CHECK(w[0].trigger == "slow");
  CHECK(w[0].trigger_step == 12);
  CHECK(w[0].detail.find("step 12: ") == 0);
  CHECK(w[0].detail.find("x the running median") != std::string::npos);

  // Ranges and counters of steps 10..14 only; each kept step has every main-thread range that a full
  // recording of the same run records for it.
  CHECK(ints(db, range_steps(0)) == span(10, 14));
  const auto kept = main_ranges_per_step(db), all = main_ranges_per_step(ref);
  for (std::int64_t s = 10; s <= 14; ++s) {
    CAPTURE(s);
    REQUIRE(all.count(s) == 1);
    CHECK(kept.count(s) == 1);
    if (kept.count(s)) CHECK(kept.at(s) == all.at(s));
  }
  require_counters_inside(db, 10, 14);
  CHECK(db.query_int64("SELECT count(*) FROM kernel") == 0);
  CHECK(db.query_int64("SELECT count(*) FROM allreduce") == 0);
  // The file is smaller than the full recording's by about the events of 19 steps.
  CHECK(db.query_int64("SELECT count(*) FROM range") * 3 < ref.query_int64("SELECT count(*) FROM range"));

  const Result rep = wb::test::run_command(wb::test::shell_quote(WB_CLI) + " report " + wb::test::shell_quote(slow.string()) + " --no-split");
  CAPTURE(rep.out, rep.err);
  REQUIRE(rep.exit_code == 0);
  CHECK(rep.out.find("Triggered capture (slow:5 (window 2)): events of 5 of 24 steps, in 1 window(s)") != std::string::npos);
  CHECK(rep.out.find("10-14") != std::string::npos);
  // The profiler's cost counts events per captured step, not per step of the whole run.
  char per_step[64];
  std::snprintf(per_step, sizeof per_step, "x %.0f events per step",
                static_cast<double>(db.query_int64("SELECT count(*) FROM range") + db.query_int64("SELECT count(*) FROM counter")) / 5.0);
  CHECK(rep.out.find(per_step) != std::string::npos);
}

TEST_CASE("wb-train --capture steps:A-B keeps steps A to B; a window beyond the run keeps nothing", "[trainer][capture]") {
  TempDir dir;
  const fs::path run = dir / "steps.sqlite", past = dir / "past.sqlite";
  const Result r = run_train(with(small(run, 12), {"--capture", "steps:5-8"}));
  CAPTURE(r.out, r.err);
  REQUIRE(r.exit_code == 0);
  wb::store::Db db = wb::store::open_run(run);
  CHECK(db.query_int64("SELECT count(*) FROM step") == 12);
  const auto w = windows(db);
  REQUIRE(w.size() == 1);
  CHECK(w[0].first == 5);
  CHECK(w[0].last == 8);
  CHECK(w[0].trigger == "steps");
  CHECK(w[0].trigger_step == 5);
  CHECK(ints(db, range_steps(0)) == span(5, 8));
  require_counters_inside(db, 5, 8);

  // Partly beyond the end: cut at the last step.
  const Result p = run_train(with(small(past, 6), {"--capture", "steps:4-30"}));
  REQUIRE(p.exit_code == 0);
  wb::store::Db pdb = wb::store::open_run(past);
  const auto pw = windows(pdb);
  REQUIRE(pw.size() == 1);
  CHECK(pw[0].first == 4);
  CHECK(pw[0].last == 5);
  CHECK(ints(pdb, range_steps(0)) == span(4, 5));
}

TEST_CASE("wb-train --capture signal: SIGUSR1 keeps the next N steps", "[trainer][capture]") {
  TempDir dir;
  const fs::path run = dir / "signal.sqlite", out = dir / "out.txt", err = dir / "err.txt";
  const pid_t pid = spawn_train(with(small(run, 40), {"--capture", "signal", "--capture-window", "3"}), out, err);
  const bool training = wait_for_output(pid, out, "step 4 [5/40]");
  if (training) kill(pid, SIGUSR1);
  const int code = wait_exit(pid);
  CAPTURE(wb::test::read_text_if_present(out), wb::test::read_text_if_present(err));
  REQUIRE(training);
  REQUIRE(code == 0);
  wb::store::Db db = wb::store::open_run(run);
  CHECK(db.query_int64("SELECT count(*) FROM step") == 40);
  const auto w = windows(db);
  REQUIRE(w.size() == 1);
  const std::int64_t t = w[0].trigger_step;
  CHECK(t >= 5);  // the signal went after step 4's line, so a later step's end saw it
  CHECK(w[0].trigger == "signal");
  CHECK(w[0].first == t + 1);
  CHECK(w[0].last == t + 3);
  CHECK(w[0].detail == "SIGUSR1 during step " + std::to_string(t));
  CHECK(ints(db, range_steps(0)) == span(t + 1, t + 3));
  require_counters_inside(db, t + 1, t + 3);
}

TEST_CASE("2 ranks: SIGUSR1 to rank 1 alone keeps the same window in both ranks' files", "[trainer][capture][mpi]") {
  TempDir dir;
  const fs::path run = dir / "two.sqlite", out = dir / "out.txt", err = dir / "err.txt";
  const pid_t launcher =
      spawn_train(with(small(run, 30), {"--nproc", "2", "--capture", "signal", "--capture-window", "3"}), out, err);
  std::vector<pid_t> ranks;
  const bool training = wait_for_output(launcher, out, "step 4 [5/30]");
  pid_t rank1 = 0;
  if (training) {
    ranks = wb::test::children_named(launcher, "wb-train");
    for (pid_t p : ranks)
      if (wb::test::rank_of(p) == 1) rank1 = p;
    if (rank1 != 0) kill(rank1, SIGUSR1);
  }
  const int code = wait_exit(launcher);
  CAPTURE(wb::test::read_text_if_present(out), wb::test::read_text_if_present(err));
  REQUIRE(training);
  REQUIRE(rank1 != 0);
  REQUIRE(code == 0);
  wb::store::Db db = wb::store::open_run(run);
  const auto w = windows(db);
  REQUIRE(w.size() == 2);
  CHECK(w[0].rank == 0);
  CHECK(w[1].rank == 1);
  const std::int64_t t = w[1].trigger_step;
  for (const auto& x : w) {
    CAPTURE(x.rank, x.detail);
    CHECK(x.trigger == "signal");
    CHECK(x.trigger_step == t);
    CHECK(x.first == t + 1);
    CHECK(x.last == t + 3);
    CHECK(ints(db, range_steps(static_cast<int>(x.rank))) == span(t + 1, t + 3));
    CHECK(ints(db, "SELECT DISTINCT step FROM allreduce WHERE rank = " + std::to_string(x.rank)) == span(t + 1, t + 3));
  }
  CHECK(w[1].detail == "SIGUSR1 during step " + std::to_string(t));
  CHECK(w[0].detail == "SIGUSR1 on another rank during step " + std::to_string(t));
  CHECK(db.query_int64("SELECT count(*) FROM step") == 60);
}

TEST_CASE("wb-train --capture: bad values are one line naming the flag, exit code 2", "[trainer][capture]") {
  TempDir dir;
  const std::vector<std::string> base = small(dir / "bad.sqlite", 2);
  wb::test::require_one_line_error(run_train(with(base, {"--capture", "slow:0"})), {"--capture 'slow:0'", "K must be a number > 1"});
  wb::test::require_one_line_error(run_train(with(base, {"--capture", "slow:x"})), {"--capture 'slow:x'"});
  wb::test::require_one_line_error(run_train(with(base, {"--capture", "steps:5-2"})),
                                   {"--capture 'steps:5-2'", "first step A of steps:A-B is after the last B"});
  wb::test::require_one_line_error(run_train(with(base, {"--capture", "steps:5"})), {"--capture 'steps:5'", "steps:A-B"});
  wb::test::require_one_line_error(run_train(with(base, {"--capture", "sometimes"})),
                                   {"--capture 'sometimes'", "expected slow:K", "signal", "steps:A-B"});
  wb::test::require_one_line_error(run_train(with(base, {"--capture", "slow:3", "--capture-window", "0"})),
                                   {"--capture-window 0", "at least 1"});
  wb::test::require_one_line_error(run_train(with(base, {"--capture-window", "3"})), {"--capture-window", "only with --capture"});
  wb::test::require_one_line_error(run_train(with(base, {"--capture", "signal", "--no-profile"})), {"--capture signal", "--no-profile"});
  wb::test::require_one_line_error(run_train(with(base, {"--slow-step", "3"})), {"--slow-step '3'", "S:US"});
  wb::test::require_one_line_error(run_train(with(base, {"--slow-step", "-1:100"})), {"--slow-step '-1:100'"});
  CHECK_FALSE(fs::exists(dir / "bad.sqlite"));
}
