#pragma once
// Datasets in memory (uint8 HWC images + int32 labels) and the readers that fill them:
// CIFAR-10 binary batches, Fashion-MNIST IDX (gzip or plain), and a synthetic source that writes
// real CIFAR-10 binary files so the synthetic path goes through the CIFAR reader too.

#include <array>
#include <span>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/error.hpp"

namespace wb::data {

enum class DatasetKind { kSynthetic, kCifar10, kFashionMnist, kImageFolder };
enum class Split { kTrain, kTest };

// "synthetic" | "cifar10" | "fashion-mnist" | "imagefolder" (the --data flag); anything else throws DataError.
DatasetKind parse_dataset_kind(std::string_view name);

// Per-channel mean and std of the 0..1 rescaled pixels.
struct Normalization {
  std::array<float, 3> mean{};
  std::array<float, 3> std{};
};
Normalization default_normalization(DatasetKind kind);

struct Dataset {
  DatasetKind kind = DatasetKind::kCifar10;
  int height = 0;
  int width = 0;
  int channels = 3;
  int num_classes = 10;
  std::vector<uint8_t> images;  // (N, H, W, C)
  std::vector<int32_t> labels;  // (N)
  // kImageFolder: images stay on disk and are decoded by the pipeline's workers; `images` is empty,
  // height/width are 0, files[i] is sample i's path relative to `root` ('/'-separated).
  std::filesystem::path root;
  std::vector<std::string> files;
  std::vector<std::string> class_names;

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t image_bytes() const { return static_cast<int64_t>(height) * width * channels; }
  const uint8_t* image(int64_t i) const { return images.data() + i * image_bytes(); }
};

// ---- CIFAR-10 binary: records of 1 label byte + 3072 bytes (R, G, B planes of 32x32).
inline constexpr int kCifarSide = 32;
inline constexpr int kCifarRecordBytes = 1 + 3 * kCifarSide * kCifarSide;

// Appends the records of one batch file to `out` (which must be empty or hold 32x32x3 images).
void read_cifar10_file(const std::filesystem::path& file, Dataset& out);
// `dir` is the folder holding data_batch_1..5.bin and test_batch.bin, or its parent containing
// cifar-10-batches-bin/.
Dataset read_cifar10(const std::filesystem::path& dir, Split split);
// Writes `images` CHW records with the given labels (HWC input) to `file`.
void write_cifar10_file(const std::filesystem::path& file, const Dataset& data);

// ---- Fashion-MNIST IDX: magic 2051 (images: n, rows, cols) and 2049 (labels: n), big-endian.
// Gzip and plain files are both accepted (zlib reads plain files through).
struct IdxImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;  // (count, rows, cols)
};
IdxImages read_idx_images(const std::filesystem::path& file);
std::vector<int32_t> read_idx_labels(const std::filesystem::path& file);
// `dir` holds {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. Grey is replicated to 3 channels.
Dataset read_fashion_mnist(const std::filesystem::path& dir, Split split);

// ---- Synthetic CIFAR-10: class-dependent stripe patterns (orientation, frequency and colour set by
// the class) with per-image phase and noise, deterministic from the seed.
struct SyntheticOptions {
  uint64_t seed = 1;
  int64_t train_images = 5000;  // spread over data_batch_1..5.bin
  int64_t test_images = 1000;   // test_batch.bin
};
// The images write_synthetic_cifar10 stores for one split, in memory (train: all five files' worth).
Dataset synthetic_images(const SyntheticOptions& options, Split split);
// Creates `dir` if needed and writes data_batch_1..5.bin and test_batch.bin into it.
void write_synthetic_cifar10(const std::filesystem::path& dir, const SyntheticOptions& options);

// The --data / --data-path entry point. For kSynthetic, `path` is the folder the files are written
// to (and then read back from); for kImageFolder it is the class folders' root (the split is the
// caller's choice of folder: --data-path or --val-path).
Dataset load_dataset(DatasetKind kind, const std::filesystem::path& path, Split split,
                     const SyntheticOptions& synthetic = {});

}  // namespace wb::data
