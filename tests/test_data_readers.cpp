// Dataset readers: CIFAR-10 binary (files from our synthetic source and from numpy), Fashion-MNIST IDX
// (Debian's real files, checked against Python's gzip + numpy), and the error paths.
#include <zlib.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"
#include "trainer/data/dataset.hpp"

using namespace wb::data;
using Catch::Matchers::Contains;
using wb::test::TempDir;

namespace {

const std::filesystem::path kFashionDir = "/usr/share/datasets/fashion-mnist";

void write_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

std::vector<uint8_t> idx_images(uint32_t magic, uint32_t count, uint32_t rows, uint32_t cols, size_t pixels) {
  std::vector<uint8_t> b;
  write_be32(b, magic);
  write_be32(b, count);
  write_be32(b, rows);
  write_be32(b, cols);
  for (size_t i = 0; i < pixels; ++i) b.push_back(static_cast<uint8_t>(i * 7));
  return b;
}

std::vector<uint8_t> idx_labels(uint32_t magic, uint32_t count, size_t labels) {
  std::vector<uint8_t> b;
  write_be32(b, magic);
  write_be32(b, count);
  for (size_t i = 0; i < labels; ++i) b.push_back(static_cast<uint8_t>(i % 10));
  return b;
}

void write_gz(const std::filesystem::path& file, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(file.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace

TEST_CASE("synthetic CIFAR-10 files read back exactly", "[trainer][data]") {
  TempDir dir("synth");
  const SyntheticOptions options{7, 503, 37};
  write_synthetic_cifar10(dir.path(), options);

  // prepare: the five train files split 503 as 101,101,101,100,100 records of 3073 bytes
  const std::array<uintmax_t, 5> records = {101, 101, 101, 100, 100};
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    REQUIRE(std::filesystem::file_size(dir / ("data_batch_" + std::to_string(i + 1) + ".bin")) ==
            records[static_cast<size_t>(i)] * 3073);
  }
  REQUIRE(std::filesystem::file_size(dir / "test_batch.bin") == 37 * 3073);

  for (Split split : {Split::kTrain, Split::kTest}) {
    const Dataset expected = synthetic_images(options, split);
    const Dataset read = read_cifar10(dir.path(), split);
    REQUIRE(read.size() == (split == Split::kTrain ? 503 : 37));
    REQUIRE(read.height == 32);
    REQUIRE(read.width == 32);
    REQUIRE(read.channels == 3);
    REQUIRE(read.labels == expected.labels);
    REQUIRE(read.images == expected.images);
  }

  // Deterministic from the seed; another seed gives other images.
  REQUIRE(synthetic_images(options, Split::kTest).images == synthetic_images({7, 5, 37}, Split::kTest).images);
  REQUIRE(synthetic_images(options, Split::kTest).images != synthetic_images({8, 5, 37}, Split::kTest).images);

  // load_dataset("synthetic") writes and reads the same files.
  TempDir dir2("synth-load");
  const Dataset loaded = load_dataset(DatasetKind::kSynthetic, dir2.path(), Split::kTest, options);
  REQUIRE(loaded.kind == DatasetKind::kSynthetic);
  REQUIRE(loaded.images == synthetic_images(options, Split::kTest).images);
}

TEST_CASE("synthetic classes are learnable by a nearest-class-mean classifier", "[trainer][data]") {
  const SyntheticOptions options{3, 2000, 500};
  const Dataset train = synthetic_images(options, Split::kTrain);
  const Dataset test = synthetic_images(options, Split::kTest);
  const auto n_px = static_cast<size_t>(train.image_bytes());
  std::vector<double> mean(10 * n_px, 0.0);
  std::array<int, 10> count{};
  for (int64_t i = 0; i < train.size(); ++i) {
    const int y = train.labels[static_cast<size_t>(i)];
    ++count[static_cast<size_t>(y)];
    for (size_t p = 0; p < n_px; ++p) mean[static_cast<size_t>(y) * n_px + p] += train.image(i)[p];
  }
  for (int y = 0; y < 10; ++y) {
    CAPTURE(y);
    REQUIRE(count[static_cast<size_t>(y)] > 100);  // every class present, roughly balanced
    for (size_t p = 0; p < n_px; ++p) mean[static_cast<size_t>(y) * n_px + p] /= count[static_cast<size_t>(y)];
  }
  int correct = 0;
  for (int64_t i = 0; i < test.size(); ++i) {
    int best = -1;
    double best_d = 0.0;
    for (int y = 0; y < 10; ++y) {
      double d = 0.0;
      for (size_t p = 0; p < n_px; ++p) {
        const double e = test.image(i)[p] - mean[static_cast<size_t>(y) * n_px + p];
        d += e * e;
      }
      if (best < 0 || d < best_d) {
        best = y;
        best_d = d;
      }
    }
    correct += best == test.labels[static_cast<size_t>(i)] ? 1 : 0;
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(test.size());
  CAPTURE(accuracy);
  REQUIRE(accuracy > 0.8);  // chance is 0.1
}

TEST_CASE("CIFAR-10 reader matches a file written by numpy", "[trainer][data]") {
  TempDir dir("numpy-cifar");
  // numpy writes the CIFAR layout (label, R plane, G plane, B plane) and, separately, what the
  // reader should produce: HWC pixels and int32 labels. The reader is given the parent folder.
  const std::string script = R"PY(
import sys, os, numpy as np
root = sys.argv[1]
os.makedirs(os.path.join(root, "cifar-10-batches-bin"))
rng = np.random.default_rng(1234)
n = 13
labels = rng.integers(0, 10, size=n, dtype=np.uint8)
chw = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
records = np.concatenate([labels[:, None], chw.reshape(n, -1)], axis=1)
records.astype(np.uint8).tofile(os.path.join(root, "cifar-10-batches-bin", "test_batch.bin"))
np.ascontiguousarray(chw.transpose(0, 2, 3, 1)).tofile(os.path.join(root, "expected_hwc.bin"))
labels.astype(np.int32).tofile(os.path.join(root, "expected_labels.bin"))
)PY";
  const wb::test::ProcessResult py = wb::test::run_python_script(dir, "write_cifar.py", script, dir.path().string());
  INFO(py.output);
  REQUIRE(py.exit_code == 0);

  const Dataset d = read_cifar10(dir.path(), Split::kTest);
  REQUIRE(d.size() == 13);
  REQUIRE(d.labels == wb::test::read_raw<int32_t>(dir / "expected_labels.bin"));
  REQUIRE(d.images == wb::test::read_raw<uint8_t>(dir / "expected_hwc.bin"));

  // Our writer reproduces numpy's file byte for byte.
  write_cifar10_file(dir / "rewritten.bin", d);
  REQUIRE(wb::test::read_raw<uint8_t>(dir / "rewritten.bin") ==
          wb::test::read_raw<uint8_t>(dir / "cifar-10-batches-bin" / "test_batch.bin"));
}

TEST_CASE("CIFAR-10 reader rejects missing, short and mislabelled files", "[trainer][data]") {
  TempDir dir("cifar-bad");
  SECTION("missing file") {
    REQUIRE_THROWS_AS(read_cifar10(dir.path(), Split::kTrain), DataError);
    REQUIRE_THROWS_WITH(read_cifar10(dir.path(), Split::kTrain), Contains("data_batch_1.bin"));
  }
  SECTION("size not a multiple of 3073") {
    const std::vector<uint8_t> bytes(2 * 3073 + 5, 1);
    wb::test::write_bytes(dir / "test_batch.bin", bytes.data(), bytes.size());
    REQUIRE_THROWS_AS(read_cifar10(dir.path(), Split::kTest), DataError);
    REQUIRE_THROWS_WITH(read_cifar10(dir.path(), Split::kTest),
                        Contains("test_batch.bin") && Contains("6151") && Contains("3073"));
  }
  SECTION("label outside 0..9") {
    std::vector<uint8_t> bytes(2 * 3073, 0);
    bytes[3073] = 10;
    wb::test::write_bytes(dir / "test_batch.bin", bytes.data(), bytes.size());
    REQUIRE_THROWS_AS(read_cifar10(dir.path(), Split::kTest), DataError);
    REQUIRE_THROWS_WITH(read_cifar10(dir.path(), Split::kTest), Contains("record 1") && Contains("0..9"));
  }
  SECTION("unknown --data name") {
    REQUIRE(parse_dataset_kind("fashion-mnist") == DatasetKind::kFashionMnist);
    REQUIRE_THROWS_AS(parse_dataset_kind("imagenet"), DataError);
    REQUIRE_THROWS_WITH(parse_dataset_kind("imagenet"), Contains("--data") && Contains("cifar10"));
  }
}

TEST_CASE("Fashion-MNIST reader on Debian's files agrees with gzip + numpy", "[trainer][data]") {
  TempDir dir("fmnist");
  // Python reads the same gzip files independently: counts, first labels, label histogram and a few
  // pixel checksums; it also writes the t10k files decompressed to test the plain-file path.
  const std::string script = R"PY(
import sys, os, gzip, numpy as np
src, out = sys.argv[1], sys.argv[2]
def load(name):
    with gzip.open(os.path.join(src, name), "rb") as f:
        return f.read()
for split, n in (("train", 60000), ("t10k", 10000)):
    img = np.frombuffer(load(split + "-images-idx3-ubyte.gz"), np.uint8, offset=16).reshape(-1, 28, 28)
    lab = np.frombuffer(load(split + "-labels-idx1-ubyte.gz"), np.uint8, offset=8)
    assert img.shape[0] == n and lab.shape[0] == n
    facts = [img.shape[0], lab.shape[0]] + lab[:20].tolist() + np.bincount(lab, minlength=10).tolist()
    facts += [int(img[i].astype(np.int64).sum()) for i in (0, 1, n // 2, n - 1)]
    np.array(facts, np.int64).tofile(os.path.join(out, split + "_facts.bin"))
for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
    open(os.path.join(out, name), "wb").write(load(name + ".gz"))
)PY";
  const wb::test::ProcessResult py =
      wb::test::run_python_script(dir, "fmnist.py", script, kFashionDir.string() + " " + dir.path().string());
  INFO(py.output);
  REQUIRE(py.exit_code == 0);

  const Dataset train = read_fashion_mnist(kFashionDir, Split::kTrain);
  const Dataset test = read_fashion_mnist(kFashionDir, Split::kTest);
  for (const auto& [d, split] : {std::pair{&train, "train"}, std::pair{&test, "t10k"}}) {
    CAPTURE(split);
    const auto facts = wb::test::read_raw<int64_t>(dir / (std::string(split) + "_facts.bin"));
    REQUIRE(facts.size() == 2 + 20 + 10 + 4);
    REQUIRE(d->size() == facts[0]);
    REQUIRE(d->height == 28);
    REQUIRE(d->width == 28);
    REQUIRE(d->channels == 3);
    for (size_t i = 0; i < 20; ++i) REQUIRE(d->labels[i] == facts[2 + i]);
    std::array<int64_t, 10> hist{};
    for (int32_t y : d->labels) ++hist[static_cast<size_t>(y)];
    for (size_t k = 0; k < 10; ++k) REQUIRE(hist[k] == facts[22 + k]);
    const int64_t n = d->size();
    const std::array<int64_t, 4> which = {0, 1, n / 2, n - 1};
    for (size_t k = 0; k < 4; ++k) {
      const uint8_t* img = d->image(which[k]);
      int64_t sum = 0;
      for (int p = 0; p < 28 * 28; ++p) {
        // Grey is replicated into the three channels.
        REQUIRE(img[3 * p] == img[3 * p + 1]);
        REQUIRE(img[3 * p] == img[3 * p + 2]);
        sum += img[3 * p];
      }
      REQUIRE(sum == facts[32 + k]);
    }
  }
  REQUIRE(train.size() == 60000);
  REQUIRE(test.size() == 10000);

  // The decompressed copies read the same.
  const Dataset plain = read_fashion_mnist(dir.path(), Split::kTest);
  REQUIRE(plain.labels == test.labels);
  REQUIRE(plain.images == test.images);
  REQUIRE(plain.kind == DatasetKind::kFashionMnist);
}

TEST_CASE("IDX reader rejects wrong magic, truncation and count mismatch", "[trainer][data]") {
  TempDir dir("idx-bad");
  SECTION("wrong magic") {
    write_gz(dir / "imgs.gz", idx_images(2049, 2, 3, 3, 18));
    REQUIRE_THROWS_AS(read_idx_images(dir / "imgs.gz"), DataError);
    REQUIRE_THROWS_WITH(read_idx_images(dir / "imgs.gz"), Contains("imgs.gz") && Contains("expected 2051"));
    const auto labels = idx_images(2051, 2, 3, 3, 18);
    wb::test::write_bytes(dir / "labels", labels.data(), labels.size());
    REQUIRE_THROWS_AS(read_idx_labels(dir / "labels"), DataError);
    REQUIRE_THROWS_WITH(read_idx_labels(dir / "labels"), Contains("expected 2049"));
  }
  SECTION("truncated pixels, plain and gzip") {
    const auto short_plain = idx_images(2051, 100, 28, 28, 50);
    wb::test::write_bytes(dir / "short", short_plain.data(), short_plain.size());
    REQUIRE_THROWS_AS(read_idx_images(dir / "short"), DataError);
    REQUIRE_THROWS_WITH(read_idx_images(dir / "short"), Contains("truncated") && Contains("78400"));
    write_gz(dir / "short.gz", short_plain);
    REQUIRE_THROWS_AS(read_idx_images(dir / "short.gz"), DataError);
  }
  SECTION("truncated gzip stream of the real file") {
    const auto whole = wb::test::read_raw<uint8_t>(kFashionDir / "t10k-labels-idx1-ubyte.gz");
    REQUIRE(whole.size() > 2000);
    wb::test::write_bytes(dir / "cut.gz", whole.data(), whole.size() / 2);
    REQUIRE_THROWS_AS(read_idx_labels(dir / "cut.gz"), DataError);
    REQUIRE_THROWS_WITH(read_idx_labels(dir / "cut.gz"), Contains("cut.gz"));
  }
  SECTION("truncated header") {
    const std::vector<uint8_t> two = {0, 0};
    wb::test::write_bytes(dir / "tiny", two.data(), two.size());
    REQUIRE_THROWS_AS(read_idx_labels(dir / "tiny"), DataError);
  }
  SECTION("image and label counts differ") {
    write_gz(dir / "t10k-images-idx3-ubyte.gz", idx_images(2051, 5, 28, 28, 5 * 28 * 28));
    write_gz(dir / "t10k-labels-idx1-ubyte.gz", idx_labels(2049, 4, 4));
    REQUIRE_THROWS_AS(read_fashion_mnist(dir.path(), Split::kTest), DataError);
    REQUIRE_THROWS_WITH(read_fashion_mnist(dir.path(), Split::kTest),
                        Contains("t10k-labels-idx1-ubyte.gz") && Contains("4 labels, expected 5"));
  }
  SECTION("missing file") {
    REQUIRE_THROWS_AS(read_fashion_mnist(dir.path(), Split::kTrain), DataError);
    REQUIRE_THROWS_WITH(read_fashion_mnist(dir.path(), Split::kTrain), Contains("train-images-idx3-ubyte"));
    REQUIRE_THROWS_AS(read_idx_labels(dir / "nope"), DataError);
  }
}
