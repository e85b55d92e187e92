#include "trainer/data/dataset.hpp"

#include <string>

#include "trainer/data/image_folder.hpp"

namespace wb::data {

DatasetKind parse_dataset_kind(std::string_view name) {
  if (name == "synthetic") return DatasetKind::kSynthetic;
  if (name == "cifar10") return DatasetKind::kCifar10;
  if (name == "fashion-mnist") return DatasetKind::kFashionMnist;
  if (name == "imagefolder") return DatasetKind::kImageFolder;
  throw DataError("--data '" + std::string(name) +
                  "' is not a dataset; expected synthetic, cifar10, fashion-mnist or imagefolder");
}

Normalization default_normalization(DatasetKind kind) {
  if (kind == DatasetKind::kImageFolder) return imagenet_normalization();
  if (kind == DatasetKind::kFashionMnist) {
    // Grey replicated to three channels, so the single-channel statistics are replicated too.
    return {{0.2860f, 0.2860f, 0.2860f}, {0.3530f, 0.3530f, 0.3530f}};
  }
  // CIFAR-10 statistics (the synthetic source writes CIFAR-10 files and is treated alike).
  return {{0.4914f, 0.4822f, 0.4465f}, {0.2023f, 0.1994f, 0.2010f}};
}

Dataset load_dataset(DatasetKind kind, const std::filesystem::path& path, Split split,
                     const SyntheticOptions& synthetic) {
  switch (kind) {
    case DatasetKind::kSynthetic: {
      write_synthetic_cifar10(path, synthetic);
      Dataset d = read_cifar10(path, split);
      d.kind = DatasetKind::kSynthetic;
      return d;
    }
    case DatasetKind::kCifar10: return read_cifar10(path, split);
    case DatasetKind::kFashionMnist: return read_fashion_mnist(path, split);
    case DatasetKind::kImageFolder: {
      Dataset d;
      scan_image_folder(path, d);
      return d;
    }
  }
  throw DataError("load_dataset: unknown dataset kind");
}

}  // namespace wb::data
