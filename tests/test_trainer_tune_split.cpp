// wb tune-split on a real 2-rank run: the trials are wb-train runs with the run's own configuration, every
// one recorded in the run file, candidates alternated; the split it keeps never measured slower than the
// current one in any round; bad input gets one line and exit 2.
#include <catch2/catch.hpp>

#include <map>
#include <regex>
#include <string>
#include <vector>

#include "store/reader.hpp"
#include "test_trainer_util.hpp"

namespace {

namespace fs = std::filesystem;
using wb::test::Result;
using wb::test::run_command;
using wb::test::shell_quote;
using wb::test::TempDir;

Result wb_cli(const std::string& args) { return run_command(shell_quote(WB_CLI) + " " + args); }

}  // namespace

TEST_CASE("tune-split measures the current split and candidates in alternated trials and keeps none slower",
          "[trainer][mpi]") {
  TempDir dir;
  const fs::path run = dir / "base.sqlite";
  const Result train = wb::test::run_train({"--data", "synthetic", "--synthetic-samples", "64", "--batch-size", "2",
                                            "--image-size", "32", "--nproc", "2", "--steps", "4", "--run", run.string()});
  CAPTURE(train.out, train.err);
  REQUIRE(train.exit_code == 0);

  const Result tune = wb_cli("tune-split " + shell_quote(run.string()) +
                             " --candidates 1 --rounds 2 --steps 2 --warmup 1 --try 40,100,160");
  CAPTURE(tune.out, tune.err);
  REQUIRE(tune.exit_code == 0);
  CHECK(tune.out.find("3 candidates x 2 rounds, 1 + 2 steps each on 2 ranks (calibrated model)") != std::string::npos);
  CHECK(tune.out.find("  round 1/2  current (") != std::string::npos);
  CHECK(tune.out.find("try 1: 40,100,160") != std::string::npos);

  const auto trials = wb::store::Reader(run).split_trials();
  REQUIRE(trials.size() == 6);
  std::map<std::string, std::vector<std::int64_t>> measured;  // candidate -> median per round
  for (const auto& t : trials) {
    CAPTURE(t.candidate, t.split);
    CHECK(t.exit_code == 0);
    CHECK(t.steps == 2);
    CHECK(t.median_step_ns > 0);
    CHECK(t.predicted_step_ns > 0);
    CHECK(t.alpha_beta_ns > 0);
    CHECK(t.run.empty());  // not kept without --keep
    measured[t.candidate].push_back(t.median_step_ns);
  }
  // Without --keep, nothing of the trials is left but the config of the kept split (if one was kept).
  for (const auto& e : fs::directory_iterator(run.string() + ".tune")) CHECK(e.path().filename() == "apply.json");
  // Alternated: round 1 runs the candidates in order, round 2 in reverse.
  CHECK(trials[0].candidate == "current");
  CHECK(trials[0].round == 0);
  CHECK(trials[5].candidate == "current");
  CHECK(trials[5].round == 1);
  CHECK(trials[2].split == "40,100,160");
  REQUIRE(measured.size() == 3);
  REQUIRE(measured["current"].size() == 2);

  // The verdict: a kept candidate beat the current split in both rounds; otherwise the current stays.
  const auto use = tune.out.find("\nUse ");
  if (use == std::string::npos) {
    CHECK(tune.out.find("Keep the current split") != std::string::npos);
  } else {
    // "Use optimal (DP) (12 buckets): ...": the name ends before the bucket count.
    std::smatch m;
    const std::string line = tune.out.substr(use + 1, tune.out.find('\n', use + 1) - use - 1);
    REQUIRE(std::regex_search(line, m, std::regex("^Use (.*) \\([0-9]+ buckets\\): ")));
    const std::string name = m[1].str();
    CAPTURE(name);
    REQUIRE(measured.count(name) == 1);
    for (int r = 0; r < 2; ++r) CHECK(measured[name][static_cast<std::size_t>(r)] < measured["current"][static_cast<std::size_t>(r)]);
    CHECK(tune.out.find("wb-train --config " + (run.string() + ".tune/apply.json")) != std::string::npos);
  }

  SECTION("bad input: one line, exit 2") {
    Result r = wb_cli("tune-split " + shell_quote((dir / "missing.sqlite").string()));
    CHECK(r.exit_code == 2);
    CHECK(wb::test::count_lines(r.err) == 1);
    CHECK(r.err.find("missing.sqlite") != std::string::npos);
    r = wb_cli("tune-split " + shell_quote(run.string()) + " --try 5,3");
    CHECK(r.exit_code == 2);
    CHECK(wb::test::count_lines(r.err) == 1);
    CHECK(r.err.find("--try") != std::string::npos);
    r = wb_cli("tune-split " + shell_quote(run.string()) + " --rounds 0");
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--rounds") != std::string::npos);
    CHECK(wb::store::Reader(run).split_trials().size() == 6);  // nothing recorded by a refused call
  }
}
