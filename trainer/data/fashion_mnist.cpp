// Fashion-MNIST IDX files through zlib's gz* API, which reads gzip and plain files alike.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "trainer/data/dataset.hpp"

namespace wb::data {
namespace {

constexpr uint32_t kImagesMagic = 2051;
constexpr uint32_t kLabelsMagic = 2049;
// Sanity bounds so a corrupt header is reported instead of triggering a huge allocation.
constexpr int64_t kMaxCount = 100'000'000;
constexpr int64_t kMaxSide = 4096;

class GzFile {
 public:
  explicit GzFile(const std::filesystem::path& path) : path_(path) {
    if (!std::filesystem::is_regular_file(path)) {
      throw DataError(path.string() + ": IDX file not found");
    }
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) throw DataError(path.string() + ": cannot open IDX file");
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads exactly `n` bytes or throws, naming `what` was being read.
  void read(void* dst, size_t n, const std::string& what) {
    auto* out = static_cast<uint8_t*>(dst);
    size_t done = 0;
    while (done < n) {
      // gzread takes an unsigned count; read in 1 GiB chunks.
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
      const int got = gzread(file_, out + done, chunk);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(file_, &err);
        throw DataError(path_.string() + ": corrupt or truncated while reading " + what + " (" +
                        (msg != nullptr ? msg : "zlib error") + ")");
      }
      if (got == 0) {
        throw DataError(path_.string() + ": truncated: " + what + " needs " + std::to_string(n) +
                        " bytes, file ends after " + std::to_string(done));
      }
      done += static_cast<size_t>(got);
    }
  }

  // Reads exactly `n` bytes into `out`, growing it as the data arrive: a header that claims more than
  // the file holds fails at the file's end, without first allocating all it claims.
  // The buffer doubles (from 64 KiB, in steps of at most 256 MiB), so it never holds more than about
  // twice what the file had.
  void read_all(std::vector<uint8_t>& out, size_t n, const std::string& what) {
    constexpr size_t kFirst = size_t{64} << 10, kMaxStep = size_t{256} << 20;
    out.clear();
    size_t done = 0;
    while (done < n) {
      out.resize(done + std::min(n - done, std::clamp(done, kFirst, kMaxStep)));
      const unsigned want = static_cast<unsigned>(out.size() - done);
      const int got = gzread(file_, out.data() + done, want);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(file_, &err);
        throw DataError(path_.string() + ": corrupt or truncated while reading " + what + " (" +
                        (msg != nullptr ? msg : "zlib error") + ")");
      }
      if (got == 0) {
        throw DataError(path_.string() + ": truncated: " + what + " needs " + std::to_string(n) +
                        " bytes, file ends after " + std::to_string(done));
      }
      done += static_cast<size_t>(got);
    }
    out.resize(n);
  }

  uint32_t read_be32(const std::string& what) {
    std::array<uint8_t, 4> b{};
    read(b.data(), b.size(), what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  void expect_magic(uint32_t expected, const char* kind) {
    const uint32_t magic = read_be32("the header");
    if (magic != expected) {
      throw DataError(path_.string() + ": IDX magic " + std::to_string(magic) + ", expected " +
                      std::to_string(expected) + " (" + kind + ")");
    }
  }

  int64_t read_dim(const std::string& what, int64_t max) {
    const int64_t v = read_be32(what);
    if (v < 1 || v > max) {
      throw DataError(path_.string() + ": IDX " + what + " is " + std::to_string(v) + ", expected 1.." +
                      std::to_string(max));
    }
    return v;
  }

 private:
  std::filesystem::path path_;
  gzFile file_ = nullptr;
};

// Prefers the .gz name (as Debian ships it) and falls back to the plain one.
std::filesystem::path idx_path(const std::filesystem::path& dir, const std::string& stem) {
  auto gz = dir / (stem + ".gz");
  if (std::filesystem::exists(gz)) return gz;
  auto plain = dir / stem;
  if (std::filesystem::exists(plain)) return plain;
  throw DataError(gz.string() + ": Fashion-MNIST file not found (nor " + plain.filename().string() + ")");
}

}  // namespace

IdxImages read_idx_images(const std::filesystem::path& file) {
  GzFile in(file);
  in.expect_magic(kImagesMagic, "idx3 unsigned-byte images");
  IdxImages out;
  out.count = in.read_dim("image count", kMaxCount);
  out.rows = static_cast<int>(in.read_dim("row count", kMaxSide));
  out.cols = static_cast<int>(in.read_dim("column count", kMaxSide));
  in.read_all(out.pixels, static_cast<size_t>(out.count * out.rows * out.cols),
              std::to_string(out.count) + " images of " + std::to_string(out.rows) + "x" + std::to_string(out.cols));
  return out;
}

std::vector<int32_t> read_idx_labels(const std::filesystem::path& file) {
  GzFile in(file);
  in.expect_magic(kLabelsMagic, "idx1 unsigned-byte labels");
  const int64_t count = in.read_dim("label count", kMaxCount);
  std::vector<uint8_t> raw;
  in.read_all(raw, static_cast<size_t>(count), std::to_string(count) + " labels");
  std::vector<int32_t> labels(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] > 9) {
      throw DataError(file.string() + ": label " + std::to_string(raw[i]) + " at index " + std::to_string(i) +
                      ", expected 0..9");
    }
    labels[i] = raw[i];
  }
  return labels;
}

Dataset read_fashion_mnist(const std::filesystem::path& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const auto images_file = idx_path(dir, prefix + "-images-idx3-ubyte");
  const auto labels_file = idx_path(dir, prefix + "-labels-idx1-ubyte");
  IdxImages images = read_idx_images(images_file);
  std::vector<int32_t> labels = read_idx_labels(labels_file);
  if (static_cast<int64_t>(labels.size()) != images.count) {
    throw DataError(labels_file.string() + ": " + std::to_string(labels.size()) + " labels, expected " +
                    std::to_string(images.count) + " to match " + images_file.filename().string());
  }
  Dataset d;
  d.kind = DatasetKind::kFashionMnist;
  d.height = images.rows;
  d.width = images.cols;
  d.channels = 3;
  d.num_classes = 10;
  d.labels = std::move(labels);
  const size_t pixels = images.pixels.size();
  d.images.resize(pixels * 3);
  for (size_t p = 0; p < pixels; ++p) {
    const uint8_t v = images.pixels[p];
    d.images[3 * p] = v;
    d.images[3 * p + 1] = v;
    d.images[3 * p + 2] = v;
  }
  return d;
}

}  // namespace wb::data
