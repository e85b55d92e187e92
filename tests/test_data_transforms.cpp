// Transforms against torch / numpy references computed by Python on the same float inputs:
// bilinear resize vs F.interpolate(align_corners=False, antialias=False), normalize, zero-padded crop +
// flip with fixed parameters, HWC2CHW, and the composed train / eval chains.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"
#include "trainer/data/sampler.hpp"
#include "trainer/data/transforms.hpp"

using namespace wb::data;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;
using wb::test::read_raw;
using wb::test::TempDir;

namespace {

struct ResizeCase {
  int in_h, in_w, out_h, out_w;
};
const std::array<ResizeCase, 6> kResizeCases = {{
    {28, 28, 32, 32},  // Fashion-MNIST to the default image size
    {32, 32, 224, 224},
    {32, 32, 17, 17},  // downscale (no antialiasing)
    {7, 5, 13, 11},    // odd, non-square
    {9, 12, 4, 30},    // down in one axis, up in the other
    {32, 32, 32, 32},  // identity
}};
struct CropCase {
  int top, left;
  bool flip;
};
const std::array<CropCase, 5> kCropCases = {{{0, 0, false}, {8, 8, true}, {3, 5, true}, {4, 4, false}, {8, 0, true}}};

// A deterministic, non-integer image with values in [0, 255].
std::vector<float> make_image(int h, int w, uint64_t key) {
  Rng rng(key);
  std::vector<float> img(static_cast<size_t>(h) * w * 3);
  for (float& v : img) v = static_cast<float>(rng.uniform01() * 255.0);
  return img;
}

std::vector<uint8_t> make_image_u8(int h, int w, uint64_t key) {
  Rng rng(key);
  std::vector<uint8_t> img(static_cast<size_t>(h) * w * 3);
  for (uint8_t& v : img) v = static_cast<uint8_t>(rng.uniform(256));
  return img;
}

const Normalization kNorm = default_normalization(DatasetKind::kCifar10);

// Python computes every reference once per test run; the inputs are regenerated here identically.
class Reference {
 public:
  static const Reference& get() {
    static const Reference ref;
    return ref;
  }
  std::filesystem::path file(const std::string& name) const { return dir_ / name; }

 private:
  Reference() : dir_("transforms") {
    std::string cases;
    for (size_t i = 0; i < kResizeCases.size(); ++i) {
      const auto& c = kResizeCases[i];
      const auto img = make_image(c.in_h, c.in_w, 100 + i);
      wb::test::write_bytes(dir_ / ("resize_in_" + std::to_string(i) + ".bin"), img.data(),
                                     img.size() * sizeof(float));
      cases += std::to_string(c.in_h) + "," + std::to_string(c.in_w) + "," + std::to_string(c.out_h) + "," +
               std::to_string(c.out_w) + ";";
    }
    std::string crops;
    for (const auto& c : kCropCases) {
      crops += std::to_string(c.top) + "," + std::to_string(c.left) + "," + (c.flip ? "1" : "0") + ";";
    }
    const auto base = make_image(32, 32, 7);
    wb::test::write_bytes(dir_ / "img32.bin", base.data(), base.size() * sizeof(float));
    const auto u8 = make_image_u8(28, 28, 9);
    wb::test::write_bytes(dir_ / "img28_u8.bin", u8.data(), u8.size());

    const std::string script = R"PY(
import sys, os, numpy as np, torch
import torch.nn.functional as F
d, cases, crops = sys.argv[1], sys.argv[2], sys.argv[3]
mean = np.array([0.4914, 0.4822, 0.4465], np.float64)
std = np.array([0.2023, 0.1994, 0.2010], np.float64)
def chw(hwc):  # numpy HWC -> torch (1, C, H, W)
    return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))[None]
def resize(hwc, oh, ow):
    y = F.interpolate(chw(hwc), size=(oh, ow), mode="bilinear", align_corners=False, antialias=False)
    return y[0].permute(1, 2, 0).numpy()
def crop_flip(hwc, top, left, flip, pad=4):
    h, w = hwc.shape[:2]
    x = F.pad(chw(hwc), (pad, pad, pad, pad))[..., top:top + h, left:left + w]
    if flip:
        x = torch.flip(x, dims=[3])
    return x[0].permute(1, 2, 0).numpy()
def normalize(hwc):
    return ((hwc.astype(np.float64) / 255.0 - mean) / std).astype(np.float32)
def save(name, a):
    np.ascontiguousarray(a, dtype=np.float32).tofile(os.path.join(d, name))
for i, c in enumerate(filter(None, cases.split(";"))):
    ih, iw, oh, ow = map(int, c.split(","))
    x = np.fromfile(os.path.join(d, "resize_in_%d.bin" % i), np.float32).reshape(ih, iw, 3)
    save("resize_out_%d.bin" % i, resize(x, oh, ow))
img = np.fromfile(os.path.join(d, "img32.bin"), np.float32).reshape(32, 32, 3)
for i, c in enumerate(filter(None, crops.split(";"))):
    top, left, flip = map(int, c.split(","))
    save("crop_%d.bin" % i, crop_flip(img, top, left, flip))
save("normalize.bin", normalize(img))
save("chw.bin", img.transpose(2, 0, 1))
# Composed chains on a 28x28 uint8 image: train (crop 2,7 + flip) and eval, both to 32x32.
u8 = np.fromfile(os.path.join(d, "img28_u8.bin"), np.uint8).reshape(28, 28, 3).astype(np.float32)
save("train_chain.bin", normalize(resize(crop_flip(u8, 2, 7, True), 32, 32)).transpose(2, 0, 1))
save("eval_chain.bin", normalize(resize(u8, 32, 32)).transpose(2, 0, 1))
)PY";
    const wb::test::ProcessResult py = wb::test::run_python_script(
        dir_, "reference.py", script,
        dir_.path().string() + " " + wb::test::shell_quote(cases) + " " + wb::test::shell_quote(crops));
    if (py.exit_code != 0) {
      throw std::runtime_error("transform reference script failed with status " + std::to_string(py.exit_code) +
                               ":\n" + py.output);
    }
  }
  TempDir dir_;
};

void require_close(const std::vector<float>& got, const std::vector<float>& want, double abs_tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE_THAT(got[i], WithinAbs(want[i], abs_tol) || WithinRel(want[i], 1e-6f));
  }
}

}  // namespace

TEST_CASE("transform names table", "[trainer][data]") {
  const auto names = transform_names();
  REQUIRE(names.size() == kTransformCount);
  REQUIRE(names[kDecode] == "decode");
  REQUIRE(names[kRandomCrop] == "random_crop");
  REQUIRE(names[kRandomFlip] == "random_flip");
  REQUIRE(names[kResize] == "resize");
  REQUIRE(names[kRescaleNormalize] == "rescale_normalize");
  REQUIRE(names[kHwc2Chw] == "hwc2chw");
}

TEST_CASE("bilinear resize matches torch interpolate (align_corners=False)", "[trainer][data]") {
  const Reference& ref = Reference::get();
  for (size_t i = 0; i < kResizeCases.size(); ++i) {
    const auto& c = kResizeCases[i];
    CAPTURE(c.in_h, c.in_w, c.out_h, c.out_w);
    const auto in = make_image(c.in_h, c.in_w, 100 + i);
    std::vector<float> out(static_cast<size_t>(c.out_h) * c.out_w * 3);
    resize_bilinear(in.data(), c.in_h, c.in_w, 3, out.data(), c.out_h, c.out_w);
    // Values are 0..255; float rounding differences between the two kernels stay far below 1e-3.
    require_close(out, read_raw<float>(ref.file("resize_out_" + std::to_string(i) + ".bin")), 1e-3);
  }
}

TEST_CASE("zero-padded crop and flip match torch pad + slice + flip", "[trainer][data]") {
  const Reference& ref = Reference::get();
  const auto img = make_image(32, 32, 7);
  for (size_t i = 0; i < kCropCases.size(); ++i) {
    const auto& c = kCropCases[i];
    CAPTURE(c.top, c.left, c.flip);
    std::vector<float> out(img.size());
    random_crop(img.data(), 32, 32, 3, 4, c.top, c.left, out.data());
    if (c.flip) horizontal_flip(out.data(), 32, 32, 3);
    REQUIRE(out == read_raw<float>(ref.file("crop_" + std::to_string(i) + ".bin")));  // pure data movement
  }
}

TEST_CASE("rescale + normalize and HWC2CHW match numpy", "[trainer][data]") {
  const Reference& ref = Reference::get();
  const auto img = make_image(32, 32, 7);
  auto normed = img;
  rescale_normalize(normed.data(), 32 * 32, 3, kNorm);
  require_close(normed, read_raw<float>(ref.file("normalize.bin")), 1e-5);

  std::vector<float> chw(img.size());
  hwc_to_chw(img.data(), 32, 32, 3, chw.data());
  REQUIRE(chw == read_raw<float>(ref.file("chw.bin")));

  REQUIRE_THROWS_AS(rescale_normalize(normed.data(), 4, 1, kNorm), DataError);
}

namespace {

struct Recorder : Observer {
  std::vector<int> ids;
  std::vector<std::array<int64_t, 2>> spans;
  void on_transform(int worker, int transform_id, int64_t begin_ns, int64_t end_ns) override {
    REQUIRE(worker == 3);
    ids.push_back(transform_id);
    spans.push_back({begin_ns, end_ns});
  }
};

}  // namespace

TEST_CASE("train and eval chains match the composed reference and report each step", "[trainer][data]") {
  const Reference& ref = Reference::get();
  const auto u8 = make_image_u8(28, 28, 9);
  TransformConfig config;
  config.image_size = 32;
  config.norm = kNorm;
  std::vector<float> out(3 * 32 * 32);

  SECTION("train: crop (2, 7), flip, resize 28 -> 32, normalize, CHW") {
    config.train = true;
    SampleTransform t(config, 28, 28);
    Recorder rec;
    t.apply(u8.data(), AugmentParams{2, 7, true}, out.data(), &rec, 3);
    require_close(out, read_raw<float>(ref.file("train_chain.bin")), 1e-4);
    REQUIRE(rec.ids == std::vector<int>{kDecode, kRandomCrop, kRandomFlip, kResize, kRescaleNormalize, kHwc2Chw});
    for (size_t i = 0; i < rec.spans.size(); ++i) {
      REQUIRE(rec.spans[i][0] <= rec.spans[i][1]);
      if (i > 0) REQUIRE(rec.spans[i][0] == rec.spans[i - 1][1]);  // back to back, nothing unaccounted
    }
  }
  SECTION("eval: no crop or flip whatever the params say") {
    config.train = false;
    SampleTransform t(config, 28, 28);
    Recorder rec;
    t.apply(u8.data(), AugmentParams{2, 7, true}, out.data(), &rec, 3);
    require_close(out, read_raw<float>(ref.file("eval_chain.bin")), 1e-4);
    REQUIRE(rec.ids == std::vector<int>{kDecode, kResize, kRescaleNormalize, kHwc2Chw});
  }
  SECTION("same size: resize is skipped, the rest still runs") {
    config.train = true;
    const auto u8_32 = make_image_u8(32, 32, 11);
    SampleTransform t(config, 32, 32);
    Recorder rec;
    t.apply(u8_32.data(), AugmentParams{4, 4, false}, out.data(), &rec, 3);
    REQUIRE(rec.ids == std::vector<int>{kDecode, kRandomCrop, kRandomFlip, kRescaleNormalize, kHwc2Chw});
    // Crop at the centre without flip is the identity, so this is plain normalize + CHW.
    for (int ch = 0; ch < 3; ++ch) {
      for (int p = 0; p < 32 * 32; ++p) {
        const double want = (u8_32[static_cast<size_t>(p * 3 + ch)] / 255.0 - kNorm.mean[static_cast<size_t>(ch)]) /
                            kNorm.std[static_cast<size_t>(ch)];
        REQUIRE_THAT(out[static_cast<size_t>(ch * 1024 + p)], WithinAbs(want, 1e-5));
      }
    }
  }
  SECTION("bad settings") {
    config.image_size = 0;
    REQUIRE_THROWS_AS(SampleTransform(config, 28, 28), DataError);
  }
}

TEST_CASE("augmentation parameters depend only on (seed, epoch, sample)", "[trainer][data]") {
  TransformConfig config;
  config.train = true;
  std::array<int, 9> tops{};
  std::array<int, 9> lefts{};
  int flips = 0;
  const int n = 4000;
  for (int s = 0; s < n; ++s) {
    const AugmentParams a = draw_augment(config, 42, 3, s);
    const AugmentParams b = draw_augment(config, 42, 3, s);
    REQUIRE((a.top == b.top && a.left == b.left && a.flip == b.flip));
    REQUIRE((a.top >= 0 && a.top <= 8 && a.left >= 0 && a.left <= 8));
    ++tops[static_cast<size_t>(a.top)];
    ++lefts[static_cast<size_t>(a.left)];
    flips += a.flip ? 1 : 0;
  }
  for (int k = 0; k < 9; ++k) {
    CAPTURE(k);
    // Each offset should appear ~444 times; 300 is more than 7 standard deviations below.
    REQUIRE(tops[static_cast<size_t>(k)] > 300);
    REQUIRE(lefts[static_cast<size_t>(k)] > 300);
  }
  REQUIRE_THAT(static_cast<double>(flips) / n, WithinAbs(0.5, 0.05));

  // Another epoch or seed draws differently.
  int same_epoch = 0;
  int same_seed = 0;
  for (int s = 0; s < 200; ++s) {
    const AugmentParams a = draw_augment(config, 42, 3, s);
    const AugmentParams e = draw_augment(config, 42, 4, s);
    const AugmentParams d = draw_augment(config, 43, 3, s);
    same_epoch += (a.top == e.top && a.left == e.left && a.flip == e.flip) ? 1 : 0;
    same_seed += (a.top == d.top && a.left == d.left && a.flip == d.flip) ? 1 : 0;
  }
  REQUIRE(same_epoch < 20);  // 1/162 chance each
  REQUIRE(same_seed < 20);

  config.train = false;
  const AugmentParams eval = draw_augment(config, 42, 3, 0);
  REQUIRE((eval.top == 0 && eval.left == 0 && !eval.flip));

  // --crop-padding 0 --no-random-flip: training draws the identity for every sample.
  config.train = true;
  config.crop_padding = 0;
  config.flip_prob = 0.0;
  for (int s = 0; s < 500; ++s) {
    const AugmentParams a = draw_augment(config, 42, 3, s);
    REQUIRE((a.top == 0 && a.left == 0 && !a.flip));
  }
}
