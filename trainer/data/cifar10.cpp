// CIFAR-10 binary batches: reader, writer, and the synthetic source that goes through them.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <numbers>
#include <string>

#include "trainer/data/dataset.hpp"
#include "trainer/data/sampler.hpp"

namespace wb::data {
namespace {

constexpr int kPlane = kCifarSide * kCifarSide;
constexpr int kTrainFiles = 5;

std::filesystem::path batches_dir(const std::filesystem::path& dir) {
  const auto nested = dir / "cifar-10-batches-bin";
  if (std::filesystem::is_directory(nested)) return nested;
  return dir;
}

}  // namespace

void read_cifar10_file(const std::filesystem::path& file, Dataset& out) {
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(file, ec);
  if (ec) {
    throw DataError(file.string() + ": cannot open CIFAR-10 batch file (" + ec.message() + ")");
  }
  if (bytes == 0 || bytes % kCifarRecordBytes != 0) {
    throw DataError(file.string() + ": size " + std::to_string(bytes) +
                    " bytes is not a positive multiple of the 3073-byte CIFAR-10 record");
  }
  if (!out.labels.empty() && (out.height != kCifarSide || out.width != kCifarSide || out.channels != 3)) {
    throw DataError(file.string() + ": cannot append 32x32x3 CIFAR-10 images to a dataset of other shape");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError(file.string() + ": cannot open CIFAR-10 batch file");

  const auto records = static_cast<int64_t>(bytes / kCifarRecordBytes);
  const int64_t first = out.size();
  out.height = kCifarSide;
  out.width = kCifarSide;
  out.channels = 3;
  out.num_classes = 10;
  out.labels.resize(static_cast<size_t>(first + records));
  out.images.resize(static_cast<size_t>((first + records) * 3 * kPlane));

  std::vector<uint8_t> rec(kCifarRecordBytes);
  for (int64_t r = 0; r < records; ++r) {
    if (!in.read(reinterpret_cast<char*>(rec.data()), kCifarRecordBytes)) {
      throw DataError(file.string() + ": read failed at record " + std::to_string(r) + " of " +
                      std::to_string(records));
    }
    if (rec[0] > 9) {
      throw DataError(file.string() + ": record " + std::to_string(r) + " has label " +
                      std::to_string(rec[0]) + ", expected 0..9");
    }
    out.labels[static_cast<size_t>(first + r)] = rec[0];
    // File planes are R, G, B (CHW); the dataset keeps HWC like a decoded image.
    uint8_t* dst = out.images.data() + (first + r) * 3 * kPlane;
    const uint8_t* planes = rec.data() + 1;
    for (int p = 0; p < kPlane; ++p) {
      dst[3 * p + 0] = planes[p];
      dst[3 * p + 1] = planes[kPlane + p];
      dst[3 * p + 2] = planes[2 * kPlane + p];
    }
  }
}

Dataset read_cifar10(const std::filesystem::path& dir, Split split) {
  const auto base = batches_dir(dir);
  Dataset d;
  d.kind = DatasetKind::kCifar10;
  if (split == Split::kTrain) {
    for (int i = 1; i <= kTrainFiles; ++i) {
      read_cifar10_file(base / ("data_batch_" + std::to_string(i) + ".bin"), d);
    }
  } else {
    read_cifar10_file(base / "test_batch.bin", d);
  }
  return d;
}

void write_cifar10_file(const std::filesystem::path& file, const Dataset& data) {
  if (data.height != kCifarSide || data.width != kCifarSide || data.channels != 3) {
    throw DataError(file.string() + ": CIFAR-10 records hold 32x32x3 images, got " +
                    std::to_string(data.height) + "x" + std::to_string(data.width) + "x" +
                    std::to_string(data.channels));
  }
  // Several ranks may write the same synthetic files at once: each writes a private temporary and
  // renames it into place, which is atomic, so a reader never sees a half-written file.
  static std::atomic<int> counter{0};
  auto tmp = file;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw DataError(tmp.string() + ": cannot create file for writing");
    std::vector<uint8_t> rec(kCifarRecordBytes);
    for (int64_t i = 0; i < data.size(); ++i) {
      const int32_t label = data.labels[static_cast<size_t>(i)];
      if (label < 0 || label > 9) {
        throw DataError(file.string() + ": label " + std::to_string(label) + " of image " +
                        std::to_string(i) + " does not fit CIFAR-10, expected 0..9");
      }
      rec[0] = static_cast<uint8_t>(label);
      const uint8_t* src = data.image(i);
      for (int p = 0; p < kPlane; ++p) {
        for (int c = 0; c < 3; ++c) rec[1 + c * kPlane + p] = src[3 * p + c];
      }
      out.write(reinterpret_cast<const char*>(rec.data()), kCifarRecordBytes);
    }
    if (!out.flush()) throw DataError(tmp.string() + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) throw DataError(file.string() + ": cannot move written file into place (" + ec.message() + ")");
}

namespace {

// One synthetic image of class `label`: stripes whose orientation and frequency encode the class,
// tinted by a class colour, with a random phase and noise so images of a class are not identical.
void synthesize(uint64_t key, int label, uint8_t* hwc) {
  Rng rng(key);
  const double angle = std::numbers::pi * label / 10.0;
  const double freq = 2.0 + label % 3;  // cycles per image
  const double fx = freq * std::cos(angle) / kCifarSide;
  const double fy = freq * std::sin(angle) / kCifarSide;
  const double phase = 2.0 * std::numbers::pi * rng.uniform01();
  const double tint[3] = {0.35 + 0.65 * ((label * 7) % 10) / 9.0, 0.35 + 0.65 * ((label * 3) % 10) / 9.0,
                          0.35 + 0.65 * ((9 - label) % 10) / 9.0};
  for (int y = 0; y < kCifarSide; ++y) {
    for (int x = 0; x < kCifarSide; ++x) {
      const double wave = std::sin(2.0 * std::numbers::pi * (fx * x + fy * y) + phase);
      for (int c = 0; c < 3; ++c) {
        const double noise = 40.0 * (rng.uniform01() - 0.5);
        // The tint sets both the class's mean colour and its stripe contrast.
        const double v = 40.0 + 140.0 * tint[c] + 50.0 * tint[c] * wave + noise;
        hwc[(y * kCifarSide + x) * 3 + c] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  }
}

Dataset synthetic_part(uint64_t seed, int64_t split_tag, int64_t first, int64_t count) {
  Dataset d;
  d.kind = DatasetKind::kSynthetic;
  d.height = kCifarSide;
  d.width = kCifarSide;
  d.channels = 3;
  d.labels.resize(static_cast<size_t>(count));
  d.images.resize(static_cast<size_t>(count * d.image_bytes()));
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t key = sample_key(seed, split_tag, first + i);
    const int label = static_cast<int>(Rng(mix64(key)).uniform(10));
    d.labels[static_cast<size_t>(i)] = label;
    synthesize(key, label, d.images.data() + i * d.image_bytes());
  }
  return d;
}

}  // namespace

namespace {

void check_synthetic(const SyntheticOptions& options) {
  if (options.train_images < kTrainFiles || options.test_images < 1) {
    throw DataError("synthetic data: " + std::to_string(options.train_images) + " train / " +
                    std::to_string(options.test_images) +
                    " test images requested, expected at least 5 train (one per batch file) and 1 test");
  }
}

int64_t train_file_count(const SyntheticOptions& options, int file) {
  return options.train_images / kTrainFiles + (file < options.train_images % kTrainFiles ? 1 : 0);
}

}  // namespace

Dataset synthetic_images(const SyntheticOptions& options, Split split) {
  check_synthetic(options);
  if (split == Split::kTest) return synthetic_part(options.seed, 1, 0, options.test_images);
  return synthetic_part(options.seed, 0, 0, options.train_images);
}

void write_synthetic_cifar10(const std::filesystem::path& dir, const SyntheticOptions& options) {
  check_synthetic(options);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw DataError(dir.string() + ": cannot create synthetic data folder (" + ec.message() + ")");
  // Each image depends only on (seed, split, index), so the five files concatenate to synthetic_images.
  int64_t first = 0;
  for (int f = 0; f < kTrainFiles; ++f) {
    const int64_t count = train_file_count(options, f);
    write_cifar10_file(dir / ("data_batch_" + std::to_string(f + 1) + ".bin"),
                       synthetic_part(options.seed, 0, first, count));
    first += count;
  }
  write_cifar10_file(dir / "test_batch.bin", synthetic_part(options.seed, 1, 0, options.test_images));
}

}  // namespace wb::data
