// The faults a long run meets, through wb-train as a user runs it: the disk fills while recording (a
// file size limit, RLIMIT_FSIZE via prlimit), the run file is in use by another process at start, and
// non-finite values (a poisoned batch, a diverged loss) with --on-nonfinite stop|skip.
#include <catch2/catch.hpp>

#include <sqlite3.h>

#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "store/db.hpp"
#include "store/reader.hpp"
#include "store/writer.hpp"
#include "test_trainer_util.hpp"

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

}  // namespace

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
  CHECK(steps.count(kSteps - 1) == 1);  // recording resumed after the failed batch
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
    CHECK(r.err.find("rank 0: loss is nan at step 1; rerun with --check-finite (or --dump-step 1)") !=
          std::string::npos);
    wb::store::Reader reader(run);
    const auto log = nlohmann::json::parse(reader.meta().at("nonfinite"));
    REQUIRE(log.size() == 1);
    CHECK(log[0]["loss"] == "nan");
    CHECK(log[0]["first_tensor"].is_null());
    const auto steps = reader.steps();
    REQUIRE(steps.size() == 2);  // the NaN step's row is recorded too, its loss read back as NaN
    CHECK(std::isfinite(steps[0].loss));
    CHECK(std::isnan(steps[1].loss));
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
