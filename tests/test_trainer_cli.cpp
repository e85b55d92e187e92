// wb-train on bad input: every case must end with exit code 2 and exactly one line on stderr that
// names the flag or file and says what was expected (DESIGN.md, "Errors and data safety").
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

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
  CHECK(r.out.find("--shard") == std::string::npos);
}
