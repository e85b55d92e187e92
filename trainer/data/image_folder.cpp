#include "trainer/data/image_folder.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <system_error>

#include "trainer/data/clock.hpp"
#include "trainer/data/sampler.hpp"

namespace wb::data {
namespace fs = std::filesystem;

std::span<const std::string_view> image_extensions() {
  static constexpr std::array<std::string_view, 9> kExt = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                                           ".pgm", ".tif",  ".tiff", ".webp"};
  return kExt;
}

bool has_image_extension(std::string_view name) {
  std::string lower(name);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (std::string_view ext : image_extensions()) {
    if (lower.size() >= ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0) return true;
  }
  return false;
}

namespace {

std::string extension_list() {
  std::string s;
  for (std::string_view ext : image_extensions()) s += (s.empty() ? "" : ", ") + std::string(ext);
  return s;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);  // follows symlinks, as os.scandir's is_dir() and os.walk(followlinks)
}

// os.walk(dir, followlinks=True) sorted by folder path, files sorted by name: the files below `dir`
// in torchvision's order, as paths relative to `root` joined with '/'.
void walk_class(const fs::path& root, const std::string& rel_dir, std::vector<std::string>& out) {
  std::map<std::string, std::vector<std::string>> by_folder;  // walk root string -> file names
  std::vector<std::string> pending = {rel_dir};
  std::size_t guard = 0;
  while (!pending.empty()) {
    const std::string rel = pending.back();
    pending.pop_back();
    if (++guard > 1'000'000) throw DataError((root / rel_dir).string() + ": too many nested folders (a symlink loop?)");
    std::vector<std::string>& files = by_folder[(root / rel).string()];
    std::error_code ec;
    fs::directory_iterator it(root / rel, ec);
    if (ec) throw DataError((root / rel).string() + ": cannot list the folder (" + ec.message() + ")");
    for (const fs::directory_entry& e : it) {
      const std::string name = e.path().filename().string();
      if (is_dir(e.path())) pending.push_back(rel + "/" + name);
      else if (has_image_extension(name)) files.push_back(name);
    }
  }
  for (auto& [folder, files] : by_folder) {
    std::sort(files.begin(), files.end());
    const std::string rel = fs::path(folder).lexically_relative(root).generic_string();
    for (const std::string& f : files) out.push_back(rel + "/" + f);
  }
}

}  // namespace

void scan_image_folder(const fs::path& root, Dataset& out) {
  if (!is_dir(root)) throw DataError(root.string() + ": not a folder (expected one subfolder of images per class)");
  std::vector<std::string> classes;
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec) throw DataError(root.string() + ": cannot list the folder (" + ec.message() + ")");
  for (const fs::directory_entry& e : it) {
    if (is_dir(e.path())) classes.push_back(e.path().filename().string());
  }
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    throw DataError(root.string() + ": no class subfolders (expected ROOT/CLASS/IMAGE, as torchvision's ImageFolder)");
  }
  out = Dataset{};
  out.kind = DatasetKind::kImageFolder;
  out.root = root;
  out.channels = 3;
  out.num_classes = static_cast<int>(classes.size());
  for (std::size_t c = 0; c < classes.size(); ++c) {
    const std::size_t before = out.files.size();
    walk_class(root, classes[c], out.files);
    if (out.files.size() == before) {
      throw DataError((root / classes[c]).string() + ": class folder without image files (expected names ending in " +
                      extension_list() + ")");
    }
    out.labels.resize(out.files.size(), static_cast<int32_t>(c));
  }
  out.class_names = std::move(classes);
}

ImageRecipe parse_image_recipe(std::string_view name) {
  if (name == "torchvision-eval") return ImageRecipe::kTorchvisionEval;
  if (name == "torchvision-train") return ImageRecipe::kTorchvisionTrain;
  if (name == "seed-train") return ImageRecipe::kSeedTrain;
  throw DataError("--transforms '" + std::string(name) +
                  "': expected torchvision-eval, torchvision-train or seed-train");
}

std::string_view recipe_name(ImageRecipe recipe) {
  switch (recipe) {
    case ImageRecipe::kTorchvisionEval: return "torchvision-eval";
    case ImageRecipe::kTorchvisionTrain: return "torchvision-train";
    case ImageRecipe::kSeedTrain: return "seed-train";
  }
  return "?";
}

Normalization imagenet_normalization() {
  // Python floats rounded to float32, as torch.as_tensor(mean, dtype=torch.float32) does.
  return {{static_cast<float>(0.485), static_cast<float>(0.456), static_cast<float>(0.406)},
          {static_cast<float>(0.229), static_cast<float>(0.224), static_cast<float>(0.225)}};
}

int resize_side_for(int image_size) { return (image_size * 256 + 112) / 224; }

namespace {

// Python's round(): half to even.
int round_half_even(double v) { return static_cast<int>(std::nearbyint(v)); }

// torchvision's CenterCrop offsets: int(round((size - crop) / 2.0)).
void center(ImageAug& a, int crop) {
  a.height = a.width = crop;
  a.top = round_half_even((a.resize_h - crop) / 2.0);
  a.left = round_half_even((a.resize_w - crop) / 2.0);
}

}  // namespace

ImageAug draw_image_aug(const ImageTransformConfig& config, int width, int height, uint64_t seed, int64_t epoch,
                        int64_t sample) {
  ImageAug a;
  Rng rng(sample_key(seed, epoch, sample));
  const int s = config.image_size;
  switch (config.recipe) {
    case ImageRecipe::kTorchvisionEval: {
      // torchvision's _compute_resized_output_size for an int size.
      const int r = config.resize_size;
      const bool w_short = width <= height;
      const int short_side = w_short ? width : height;
      const int long_side = w_short ? height : width;
      const int new_long = static_cast<int>(static_cast<double>(r) * long_side / short_side);
      a.resize_w = w_short ? r : new_long;
      a.resize_h = w_short ? new_long : r;
      center(a, s);
      return a;
    }
    case ImageRecipe::kSeedTrain: {
      a.flip = rng.uniform01() < config.flip_prob;
      a.resize_w = a.resize_h = config.resize_size;
      center(a, s);
      return a;
    }
    case ImageRecipe::kTorchvisionTrain: {
      // RandomResizedCrop.get_params with scale (0.08, 1) and ratio (3/4, 4/3), on our generator.
      const double area = static_cast<double>(width) * height;
      const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
      bool found = false;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        const double target = area * (0.08 + (1.0 - 0.08) * rng.uniform01());
        const double ratio = std::exp(log_lo + (log_hi - log_lo) * rng.uniform01());
        const int w = round_half_even(std::sqrt(target * ratio));
        const int h = round_half_even(std::sqrt(target / ratio));
        if (0 < w && w <= width && 0 < h && h <= height) {
          a.top = static_cast<int>(rng.uniform(static_cast<uint64_t>(height - h + 1)));
          a.left = static_cast<int>(rng.uniform(static_cast<uint64_t>(width - w + 1)));
          a.height = h;
          a.width = w;
          found = true;
        }
      }
      if (!found) {  // torchvision's fallback: the central crop at the nearest allowed ratio
        const double in_ratio = static_cast<double>(width) / height;
        int w = width, h = height;
        if (in_ratio < 3.0 / 4.0) h = round_half_even(w / (3.0 / 4.0));
        else if (in_ratio > 4.0 / 3.0) w = round_half_even(h * (4.0 / 3.0));
        a.height = h;
        a.width = w;
        a.top = (height - h) / 2;
        a.left = (width - w) / 2;
      }
      a.resize_w = a.resize_h = s;
      a.flip = rng.uniform01() < config.flip_prob;
      return a;
    }
  }
  return a;
}

void to_tensor_normalize(const uint8_t* hwc, int h, int w, const Normalization& norm, float* out_chw) {
  // A uint8 has 256 values: the float32 arithmetic is done once per value and channel, then looked up.
  float table[3][256];
  for (int c = 0; c < 3; ++c) {
    const float m = norm.mean[static_cast<std::size_t>(c)];
    const float sd = norm.std[static_cast<std::size_t>(c)];
    for (int v = 0; v < 256; ++v) table[c][v] = (static_cast<float>(v) / 255.0f - m) / sd;
  }
  const std::size_t plane = static_cast<std::size_t>(h) * static_cast<std::size_t>(w);
  float* r = out_chw;
  float* g = out_chw + plane;
  float* b = out_chw + 2 * plane;
  for (std::size_t p = 0; p < plane; ++p) {
    r[p] = table[0][hwc[3 * p]];
    g[p] = table[1][hwc[3 * p + 1]];
    b[p] = table[2][hwc[3 * p + 2]];
  }
}

namespace {

void flip_rows(uint8_t* px, int w, int h) {
  for (int y = 0; y < h; ++y) {
    uint8_t* row = px + static_cast<std::size_t>(y) * static_cast<std::size_t>(w) * 3;
    for (int x = 0; x < w / 2; ++x) {
      uint8_t* a = row + 3 * x;
      uint8_t* b = row + 3 * (w - 1 - x);
      std::swap(a[0], b[0]);
      std::swap(a[1], b[1]);
      std::swap(a[2], b[2]);
    }
  }
}

}  // namespace

ImageSampleLoader::ImageSampleLoader(const ImageTransformConfig& config) : config_(config) {
  if (config.image_size < 1 || config.resize_size < config.image_size) {
    throw DataError("image transforms: crop " + std::to_string(config.image_size) + " from resize " +
                    std::to_string(config.resize_size) + ", expected 1 <= crop <= resize");
  }
}

ImageAug ImageSampleLoader::load(const fs::path& file, const std::string& name, uint64_t seed, int64_t epoch,
                                 int64_t sample, float* out_chw, Observer* observer, int worker) {
  int64_t t0 = observer != nullptr ? now_ns() : 0;
  auto mark = [&](int id) {
    if (observer == nullptr) return;
    const int64_t t1 = now_ns();
    observer->on_transform(worker, id, t0, t1);
    t0 = t1;
  };
  read_file_bytes(file, bytes_);
  mark(kRead);
  // The decoder learns from the geometry which part of the image the crop and resize read, and decodes
  // a JPEG only there (with the pixels of a full decode).
  const auto region = [&](int width, int height) {
    const ImageAug g = draw_image_aug(config_, width, height, seed, epoch, sample);
    if (config_.recipe == ImageRecipe::kTorchvisionTrain) return SourceRect{g.left, g.top, g.left + g.width, g.top + g.height};
    const PixelWindow w = pil_resize_source_window(width, height, g.resize_w, g.resize_h, {g.left, g.top, g.width, g.height},
                                                   scratch_);
    if (g.flip && config_.recipe == ImageRecipe::kSeedTrain)  // the window of the flipped image, mirrored
      return SourceRect{width - (w.x + w.width), w.y, width - w.x, w.y + w.height};
    return SourceRect{w.x, w.y, w.x + w.width, w.y + w.height};
  };
  decoder_.decode(bytes_.data(), bytes_.size(), name, image_, region);
  mark(kDecode);
  const ImageAug a = draw_image_aug(config_, image_.width, image_.height, seed, epoch, sample);
  const int s = config_.image_size;
  cropped_.resize(static_cast<std::size_t>(s) * static_cast<std::size_t>(s) * 3);
  const int stride = image_.width * 3;
  if (config_.recipe == ImageRecipe::kTorchvisionTrain) {
    mark(kCrop);  // the crop is a view into the decoded image; resize reads only inside it
    const uint8_t* origin = image_.pixels.data() + static_cast<std::size_t>(a.top) * static_cast<std::size_t>(stride) +
                            static_cast<std::size_t>(a.left) * 3;
    pil_resize_bilinear(origin, stride, a.width, a.height, s, s, {0, 0, s, s}, cropped_.data(), scratch_);
    mark(kResize);
    if (a.flip) flip_rows(cropped_.data(), s, s);
    mark(kRandomFlip);
  } else {
    if (config_.recipe == ImageRecipe::kSeedTrain) {
      if (a.flip) flip_rows(image_.pixels.data(), image_.width, image_.height);
      mark(kRandomFlip);
    }
    mark(kCrop);  // the centre window: resize computes only the pixels inside it
    pil_resize_bilinear(image_.pixels.data(), stride, image_.width, image_.height, a.resize_w, a.resize_h,
                        {a.left, a.top, a.width, a.height}, cropped_.data(), scratch_);
    mark(kResize);
  }
  to_tensor_normalize(cropped_.data(), s, s, config_.norm, out_chw);
  mark(kNormalize);
  return a;
}

}  // namespace wb::data
