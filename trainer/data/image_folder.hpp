#pragma once
// ImageNet-style image folders (one subfolder per class) and the per-sample work on them:
//   read (the file's bytes) -> decode (JPEG/PNG to RGB) -> [flip] -> resize (PIL bilinear) + crop
//   -> normalize (ToTensor + Normalize, into CHW float)
// Indexing follows torchvision's ImageFolder (and MindSpore's ImageFolderDataset): classes are the
// subfolders sorted by name, labels their positions; files are walked recursively in each class,
// folders in sorted path order and files sorted by name, keeping those whose lower-cased name ends in
// one of torchvision's IMG_EXTENSIONS.
//
// Recipes (--transforms), all on uint8 pixels until the final normalisation, as torchvision on PIL:
//   torchvision-eval   Resize(R) (shorter side to R, the other int(R * long / short)), CenterCrop(S)
//   torchvision-train  RandomResizedCrop(S, scale (0.08, 1), ratio (3/4, 4/3)), RandomHorizontalFlip
//   seed-train         RandomHorizontalFlip, Resize((R, R)), CenterCrop(S)   (the migration guide's)
// with S = --image-size and R = round(S * 256 / 224) (256 for 224). Normalisation is torchvision's
// float32 arithmetic, ((x / 255) - mean) / std with ImageNet's mean and std, so a preprocessed batch
// can be bit-identical to torchvision's. Random choices come from (seed, epoch, dataset index) alone.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/dataset.hpp"
#include "trainer/data/image_codec.hpp"
#include "trainer/data/observer.hpp"
#include "trainer/data/pil_resize.hpp"

namespace wb::data {

// torchvision.datasets.folder.IMG_EXTENSIONS.
std::span<const std::string_view> image_extensions();
bool has_image_extension(std::string_view file_name);

// Fills `out` (kind kImageFolder): files (relative to root, '/'-separated), labels, class names.
// Throws DataError naming the folder: not a folder, no class subfolders, a class folder without images.
void scan_image_folder(const std::filesystem::path& root, Dataset& out);

enum class ImageRecipe { kTorchvisionEval, kTorchvisionTrain, kSeedTrain };
// "torchvision-eval" | "torchvision-train" | "seed-train" (the --transforms flag).
ImageRecipe parse_image_recipe(std::string_view name);
std::string_view recipe_name(ImageRecipe recipe);

// ImageNet's statistics, as torchvision's references use them.
Normalization imagenet_normalization();

struct ImageTransformConfig {
  ImageRecipe recipe = ImageRecipe::kTorchvisionEval;
  int image_size = 224;   // S: the crop side
  int resize_size = 256;  // R: Resize's side
  double flip_prob = 0.5;
  Normalization norm = imagenet_normalization();
};
// R for an output side S: round(S * 256 / 224).
int resize_side_for(int image_size);

// One sample's geometry: the region of the (flipped, for seed-train) decoded image that is cropped
// (RandomResizedCrop) or, for the Resize recipes, the resized size and the crop window in it.
struct ImageAug {
  bool flip = false;      // horizontal flip (before resizing for seed-train, after for torchvision-train)
  int resize_w = 0;       // Resize's output size (eval, seed-train)
  int resize_h = 0;
  int top = 0;            // crop window: in the resized image (eval, seed-train) or in the decoded
  int left = 0;           // image (torchvision-train, then resized to S x S)
  int height = 0;
  int width = 0;
};
// The geometry for an image of (width, height), drawn from (seed, epoch, sample) where random.
ImageAug draw_image_aug(const ImageTransformConfig& config, int width, int height, uint64_t seed, int64_t epoch,
                        int64_t sample);

// Per-worker state: decoder, resampler scratch and buffers, reused for every sample.
class ImageSampleLoader {
 public:
  explicit ImageSampleLoader(const ImageTransformConfig& config);

  // Reads and decodes `file` (named `name` in errors) and writes the (3, S, S) normalised sample to
  // `out_chw`; returns the geometry used. Reports read/decode/flip/resize/crop/normalize ranges to
  // `observer` when given. Throws DataError naming the file for an unreadable or bad image.
  ImageAug load(const std::filesystem::path& file, const std::string& name, uint64_t seed, int64_t epoch,
                int64_t sample, float* out_chw, Observer* observer = nullptr, int worker = 0);

  // The uint8 HWC pixels of the last load() before normalisation (S x S x 3): what the parity tests
  // compare with torchvision's PIL output.
  const std::vector<uint8_t>& last_pixels() const { return cropped_; }

 private:
  ImageTransformConfig config_;
  ImageDecoder decoder_;
  PilResizeScratch scratch_;
  std::vector<uint8_t> bytes_;
  RgbImage image_;
  std::vector<uint8_t> cropped_;
};

// Normalises S x S x 3 uint8 pixels into (3, S, S) float32 exactly as torchvision's ToTensor followed
// by Normalize: ((x / 255) - mean[c]) / std[c], each operation rounded to float32.
void to_tensor_normalize(const uint8_t* hwc, int h, int w, const Normalization& norm, float* out_chw);

}  // namespace wb::data
