// wb-train's command line. Bad input: every case must end with exit code 2 and exactly one line on
// stderr that names the flag or file and says what was expected (docs/ARCHITECTURE.md, "Errors and data
// safety"). Then flags whose effect is in the run file: --allreduce-split none, --dump-kinds.
#include <zlib.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/reader.hpp"
#include "test_trainer_util.hpp"

namespace {

using wb::test::count_lines;
using wb::test::Result;
using wb::test::require_one_line_error;
using wb::test::run_train;
using wb::test::with;
using wb::test::TempDir;
using wb::test::write_text;
namespace fs = std::filesystem;

// Small, fast settings shared by every case; the case adds the flag that is wrong.
std::vector<std::string> base_args(const TempDir& dir) {
  return {"--run", (dir / "run.sqlite").string(), "--steps", "1", "--batch-size", "4", "--no-profile",
          "--synthetic-samples", "64"};
}

void write_gz(const fs::path& file, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(file.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<std::uint8_t> be32(std::uint32_t v) {
  return {static_cast<std::uint8_t>(v >> 24), static_cast<std::uint8_t>(v >> 16), static_cast<std::uint8_t>(v >> 8),
          static_cast<std::uint8_t>(v)};
}

}  // namespace

TEST_CASE("wb-train: bad flags and config files give one line and exit code 2", "[trainer]") {
  TempDir dir;
  SECTION("unknown flag") {
    require_one_line_error(run_train(with(base_args(dir), {"--bogus-flag", "3"})),
                           {"unknown argument '--bogus-flag'"});
  }
  SECTION("a flag's value is not a number") {
    require_one_line_error(run_train(with(base_args(dir), {"--batch-size", "four"})),
                           {"--batch-size", "expected a number", "four"});
  }
  SECTION("bad JSON in --config") {
    const auto cfg = dir / "broken.json";
    write_text(cfg, "{\"batch_size\": 4,\n \"steps\": ");
    require_one_line_error(run_train(with(base_args(dir), {"--config", cfg.string()})),
                           {cfg.string(), "not valid JSON"});
  }
  SECTION("--save names a folder, or a file in a folder that does not exist, on one rank and on two") {
    for (const char* nproc : {"0", "2"}) {
      CAPTURE(nproc);
      require_one_line_error(run_train(with(base_args(dir), {"--nproc", nproc, "--save", dir.path().string()})),
                             {"--save", dir.path().string(), "is a folder"});
      const std::string missing = (dir / "no-such-folder" / "ckpt.safetensors").string();
      require_one_line_error(run_train(with(base_args(dir), {"--nproc", nproc, "--save", missing})),
                             {"--save", missing, "does not exist"});
    }
  }
  SECTION("unknown key in --config") {
    const auto cfg = dir / "unknown.json";
    write_text(cfg, "{\"batch_size\": 4, \"bogus_key\": 1}");
    require_one_line_error(run_train(with(base_args(dir), {"--config", cfg.string()})),
                           {cfg.string(), "unknown setting 'bogus_key'"});
  }
  SECTION("--image-size 16") {
    require_one_line_error(run_train(with(base_args(dir), {"--image-size", "16"})),
                           {"--image-size", "32..224", "16"});
  }
  SECTION("a cosine warm-up as long as the run") {
    require_one_line_error(
        run_train(with(base_args(dir), {"--lr-schedule", "cosine", "--warmup-steps", "5", "--steps", "3"})),
        {"--warmup-steps 5", "fewer warm-up steps than the run's 3 steps"});
  }
  SECTION("--crop-padding below 0") {
    require_one_line_error(run_train(with(base_args(dir), {"--crop-padding", "-1"})),
                           {"--crop-padding", "0..64", "-1"});
  }
  SECTION("--shard that is not R/N with R < N") {
    require_one_line_error(run_train(with(base_args(dir), {"--shard", "2/2"})), {"--shard '2/2'", "R < N"});
  }
  SECTION("--dump-step past the last step (steps count from 0)") {
    require_one_line_error(run_train(with(base_args(dir), {"--steps", "3", "--dump-step", "3"})),
                           {"--dump-step 3", "steps 0 to 2", "never be dumped"});
  }
  SECTION("--dump-ranks that are no ranks, or not the job's") {
    require_one_line_error(run_train(with(base_args(dir), {"--dump-step", "0", "--dump-ranks", "1,x"})),
                           {"--dump-ranks 1,x", "separated by commas"});
    require_one_line_error(run_train(with(base_args(dir), {"--nproc", "2", "--dump-step", "0", "--dump-ranks", "0,2"})),
                           {"--dump-ranks 0,2", "rank 2 is not in the job (ranks 0 to 1)"});
  }
  SECTION("--dump-kinds with a kind that is none") {
    require_one_line_error(run_train(with(base_args(dir), {"--dump-step", "0", "--dump-kinds", "act,gradient"})),
                           {"--dump-kinds", "'gradient' is no dump kind", "param_after"});
  }
  SECTION("--dump-step below -1") {
    require_one_line_error(run_train(with(base_args(dir), {"--dump-step", "-2"})), {"--dump-step", "-2"});
  }
}

TEST_CASE("wb-train: bad data sets give one line naming the file and exit code 2", "[trainer]") {
  TempDir dir;
  SECTION("missing CIFAR-10 folder") {
    require_one_line_error(
        run_train(with(base_args(dir), {"--data", "cifar10", "--data-path", "/nonexistent"})),
        {"/nonexistent/data_batch_1.bin", "cannot open"});
  }
  SECTION("Fashion-MNIST folder without files") {
    const auto empty = dir / "empty";
    fs::create_directories(empty);
    require_one_line_error(
        run_train(with(base_args(dir), {"--data", "fashion-mnist", "--data-path", empty.string()})),
        {(empty / "train-images-idx3-ubyte.gz").string(), "not found"});
  }
  SECTION("Fashion-MNIST images file with a wrong IDX magic") {
    const auto fm = dir / "fm";
    fs::create_directories(fm);
    // A labels file's magic (2049) where the images file's (2051) belongs, then a valid-looking header.
    std::vector<std::uint8_t> bytes = be32(2049);
    for (std::uint32_t v : {8u, 28u, 28u}) {
      auto b = be32(v);
      bytes.insert(bytes.end(), b.begin(), b.end());
    }
    bytes.resize(bytes.size() + 8 * 28 * 28, 7);
    write_gz(fm / "train-images-idx3-ubyte.gz", bytes);
    std::vector<std::uint8_t> labels = be32(2049);  // a good labels file beside it
    auto count = be32(8);
    labels.insert(labels.end(), count.begin(), count.end());
    labels.resize(labels.size() + 8, 1);
    write_gz(fm / "train-labels-idx1-ubyte.gz", labels);
    require_one_line_error(
        run_train(with(base_args(dir), {"--data", "fashion-mnist", "--data-path", fm.string()})),
        {(fm / "train-images-idx3-ubyte.gz").string(), "IDX magic 2049", "expected 2051"});
  }
  SECTION("CIFAR-10 batch file whose size is not a multiple of 3073") {
    const auto cifar = dir / "cifar";
    fs::create_directories(cifar);
    // Five valid one-record files, then the first one cut short by a few bytes.
    std::string record(3073, '\x01');
    record[0] = '\x03';
    for (int i = 1; i <= 5; ++i) write_text(cifar / ("data_batch_" + std::to_string(i) + ".bin"), record + record);
    write_text(cifar / "data_batch_1.bin", record + record.substr(0, 3000));
    require_one_line_error(
        run_train(with(base_args(dir), {"--data", "cifar10", "--data-path", cifar.string()})),
        {(cifar / "data_batch_1.bin").string(), "6073", "3073"});
  }
  SECTION("batch larger than the data set") {
    require_one_line_error(
        run_train(with(base_args(dir), {"--synthetic-samples", "16", "--batch-size", "32"})),
        {"--batch-size 32"});
  }
}

TEST_CASE("wb-train --help lists --check-sync and leaves the --shard aid out", "[trainer]") {
  TempDir dir;
  Result r = run_train({"--help"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("--check-sync") != std::string::npos);
  CHECK(r.out.find("--resume") != std::string::npos);
  // The aid is "--shard R/N"; --shard-fc is another flag, which the help lists.
  CHECK(r.out.find("--shard ") == std::string::npos);
  CHECK(r.out.find("--shard-fc") != std::string::npos);
}

TEST_CASE("wb-train: malformed --allreduce-split values give one line naming the flag and exit code 2", "[trainer]") {
  TempDir dir;
  struct Case {
    std::string value, why;
  };
  const std::vector<Case> cases = {
      {"85,", "item 2 is empty"},
      {"85,,160", "item 2 is empty"},
      {",85", "item 1 is empty"},
      {"", "no split points given"},
      {"abc", "'abc' is not a whole number"},
      {"85;160", "'85;160' is not a whole number"},
      {"0", "split point 0 would leave the first bucket empty"},
      {"-3", "split point -3 is negative"},
      {"161", "expected ascending split points in [1, 160] (161 is out of range for the 161 trainable parameters)"},
      {"85,400", "(400 is out of range for the 161 trainable parameters)"},
      {"160,85", "split point 85 follows 160 (out of order)"},
      {"85,85", "split point 85 appears twice"},
      {"40,85,85,160", "split point 85 appears twice"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.value);
    require_one_line_error(run_train(with(base_args(dir), {"--allreduce-split", c.value})),
                           {"--allreduce-split", c.why});
    // The flag=value form reads the same, and the split is refused before the run file exists.
    require_one_line_error(run_train(with(base_args(dir), {"--allreduce-split=" + c.value})),
                           {"--allreduce-split", c.why});
    CHECK_FALSE(fs::exists(dir / "run.sqlite"));
  }
  // Split points and --bucket-mb are two ways to form buckets: one, not both (the single bucket too).
  require_one_line_error(run_train(with(base_args(dir), {"--allreduce-split", "none", "--bucket-mb", "4"})),
                         {"--allreduce-split and --bucket-mb", "one, not both"});
}

TEST_CASE("wb-train: a malformed --watchdog-s gives one line naming the flag and exit code 2", "[trainer]") {
  TempDir dir;
  // The collective watchdog's timeout: seconds, 0 for none, never negative.
  require_one_line_error(run_train(with(base_args(dir), {"--watchdog-s", "-1"})),
                         {"--watchdog-s", "non-negative number of seconds"});
  require_one_line_error(run_train(with(base_args(dir), {"--watchdog-s", "soon"})), {"--watchdog-s", "expected a number"});
  CHECK_FALSE(fs::exists(dir / "run.sqlite"));
}

TEST_CASE("wb-train: malformed allreduce_split in a --config file gives one line naming the file and key", "[trainer]") {
  TempDir dir;
  struct Case {
    std::string json, needle;
  };
  const std::vector<Case> cases = {
      {R"("85,")", "item 2 is empty"},
      {R"("85,,160")", "item 2 is empty"},
      {R"("abc")", "'abc' is not a whole number"},
      {"[160, 85]", "split point 85 follows 160 (out of order)"},
      {"[85, 85]", "split point 85 appears twice"},
      {"[0, 85]", "split point 0 would leave the first bucket empty"},
      {"[85, 8.5]", "8.5 is not a whole number"},
      {R"(["85"])", "\"85\" is not a whole number"},
      {"{}", "expected split points such as [85, 160]"},
      {"85", "expected split points such as [85, 160]"},
  };
  const auto cfg = dir / "split.json";
  for (const Case& c : cases) {
    CAPTURE(c.json);
    write_text(cfg, "{\"allreduce_split\": " + c.json + "}");
    require_one_line_error(run_train(with(base_args(dir), {"--config", cfg.string()})),
                           {cfg.string() + ": allreduce_split", c.needle});
  }
  // In range is checked against the model like the flag, which names the setting.
  write_text(cfg, R"({"allreduce_split": [85, 161]})");
  require_one_line_error(run_train(with(base_args(dir), {"--config", cfg.string()})),
                         {"--allreduce-split 85,161", "expected ascending split points in [1, 160]"});
  CHECK_FALSE(fs::exists(dir / "run.sqlite"));
}

TEST_CASE("wb-train: --allreduce-split none trains with one bucket and records it", "[trainer]") {
  TempDir dir;
  // From the flag, and from a config file where the flag's text and the array form read the same.
  const auto cfg = dir / "split.json";
  write_text(cfg, R"({"allreduce_split": "85,160"})");
  struct Case {
    std::vector<std::string> args;
    std::string buckets;
    nlohmann::json recorded;
  };
  for (const Case& c : {Case{{"--allreduce-split", "none"}, "allreduce buckets (1)", "none"},
                        Case{{"--config", cfg.string()}, "allreduce buckets (3)", nlohmann::json({85, 160})},
                        Case{{}, "allreduce buckets (", nullptr}}) {
    CAPTURE(c.args);
    fs::remove(dir / "run.sqlite");
    const Result r = run_train(with(base_args(dir), c.args));
    CAPTURE(r.out, r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find(c.buckets) != std::string::npos);
    wb::store::Reader run(dir / "run.sqlite");
    CHECK(run.config()["allreduce_split"] == c.recorded);
  }
}

TEST_CASE("wb-train --dump-kinds keeps those kinds of the dump, each row as in the whole dump", "[trainer]") {
  TempDir dir;
  auto run = [&](const std::string& name, const std::vector<std::string>& extra) {
    auto args = base_args(dir);
    args[1] = (dir / name).string();
    args = with(args, {"--dump-step", "0", "--seed", "4", "--threads", "1"});
    const Result r = run_train(with(args, extra));
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    return dir / name;
  };
  wb::store::Reader whole(run("whole.sqlite", {}));
  wb::store::Reader some(run("some.sqlite", {"--dump-kinds", "act, loss,grad"}));
  std::map<std::string, int> kinds;
  for (const auto& t : some.tensors()) ++kinds[t.kind];
  CHECK(kinds.size() == 3);
  CHECK(kinds["act"] > 100);
  CHECK(kinds["loss"] == 1);
  CHECK(kinds["grad"] == 161);  // every parameter's
  std::size_t checked = 0;
  for (const auto& t : whole.tensors()) {
    if (t.kind != "act" && t.kind != "loss" && t.kind != "grad") continue;
    CAPTURE(t.kind, t.name);
    const auto a = whole.tensor("run", t.kind, t.name, t.step, t.rank);
    const auto b = some.tensor("run", t.kind, t.name, t.step, t.rank);
    CHECK(b.exec_order == a.exec_order);  // the order the comparison walks is the whole dump's
    CHECK(b.data == a.data);              // one thread, one seed: the same step, bit for bit
    ++checked;
  }
  CHECK(checked == some.tensors().size());
  CHECK(fs::file_size(dir / "some.sqlite") < fs::file_size(dir / "whole.sqlite") / 2);
}

TEST_CASE("wb-train --dump-ranks 1 dumps on rank 1 only", "[trainer]") {
  TempDir dir;
  const Result r = run_train(with(base_args(dir), {"--nproc", "2", "--threads", "1", "--dump-step", "0",
                                                    "--dump-ranks", "1"}));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  wb::store::Reader run(dir / "run.sqlite");
  std::map<int, int> by_rank;
  for (const auto& t : run.tensors()) ++by_rank[t.rank];
  CHECK(by_rank.size() == 1);
  CHECK(by_rank[1] > 1000);
  CHECK(run.config()["dump_ranks"] == "1");
}
