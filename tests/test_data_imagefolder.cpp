// Image folders against torchvision + PIL (Debian's python3-pil and python3-torchvision) on files cut
// from a real photograph: indexing as ImageFolder, decoded pixels as PIL's convert("RGB"), and each
// recipe's uint8 pixels before normalisation and float32 tensors after it, per file. The figures
// (bit-exact %, max difference) are printed per recipe. Also: PIL's resampler on synthetic odd sizes,
// bad files as one line naming the file, and --skip-bad-images counting them in the pipeline.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "support/files.hpp"
#include "support/python.hpp"
#include "support/temp_dir.hpp"
#include "trainer/data/image_folder.hpp"
#include "trainer/data/pipeline.hpp"
#include "trainer/data/sampler.hpp"
#include "support/peers.hpp"

using namespace wb::data;
using wb::test::read_raw;
using wb::test::shell_quote;
using wb::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kMaker = std::string(WB_SOURCE_DIR) + "/scripts/make_imagefolder.py";

void make_folder(const fs::path& out, const std::string& args) {
  const auto r = wb::test::run_python(shell_quote(kMaker) + " " + shell_quote(out.string()) + " " + args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

// The torchvision side: for every file, PIL's convert("RGB") pixels and, per recipe, the uint8 result
// before ToTensor and the normalised float32 tensor, with the geometry our loader drew (passed in
// params.txt: recipe file flip top left height width per line) for the random recipes.
const char* kReference = R"PY(
import os, sys, numpy as np, torch
from PIL import Image
import torchvision.transforms as T
import torchvision.transforms.functional as F
from torchvision.datasets.folder import default_loader
root, out = sys.argv[1], sys.argv[2]
norm = T.Compose([T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
eval_tf = T.Compose([T.Resize(256), T.CenterCrop(224)])
for n, line in enumerate(open(os.path.join(out, "params.txt"))):
    recipe, rel, flip, top, left, h, w = line.split()
    flip, top, left, h, w = int(flip), int(top), int(left), int(h), int(w)
    img = default_loader(os.path.join(root, rel))
    if recipe == "decode":
        np.asarray(img, dtype=np.uint8).tofile(os.path.join(out, f"{n}.u8"))
        continue
    if recipe == "torchvision-eval":
        res = eval_tf(img)
    elif recipe == "seed-train":
        if flip: img = F.hflip(img)
        res = T.CenterCrop(224)(T.Resize((256, 256))(img))
    else:
        res = F.resized_crop(img, top, left, h, w, [224, 224], T.InterpolationMode.BILINEAR)
        if flip: res = F.hflip(res)
    np.asarray(res, dtype=np.uint8).tofile(os.path.join(out, f"{n}.u8"))
    norm(res).numpy().astype(np.float32).tofile(os.path.join(out, f"{n}.f32"))
)PY";

struct Tally {
  long long pixels = 0, exact = 0;
  int max_diff = 0;
  long long floats = 0, floats_exact = 0;
};

}  // namespace

TEST_CASE("image folder index follows torchvision's ImageFolder", "[trainer][data][imagefolder]") {
  TempDir dir;
  make_folder(dir.path() / "set", "--classes 3 --per-class 5");
  // Nested folders and names that sort differently by case and by path are walked as os.walk does.
  fs::create_directories(dir.path() / "set/class_01/sub dir/deeper");
  fs::copy_file(dir.path() / "set/class_01/img_0000.jpg", dir.path() / "set/class_01/sub dir/deeper/Z.JPG");
  fs::copy_file(dir.path() / "set/class_01/img_0000.jpg", dir.path() / "set/class_01/sub dir/a.jpg");
  wb::test::write_text(dir.path() / "set/class_01/notes.txt", "not an image");
  Dataset d;
  scan_image_folder(dir.path() / "set", d);
  const auto r = wb::test::run_python_script(dir, "index.py", R"PY(
import sys
from torchvision.datasets import ImageFolder
ds = ImageFolder(sys.argv[1])
print("|".join(ds.classes))
for path, label in ds.samples:
    print(label, path[len(sys.argv[1]) + 1:])
)PY", shell_quote((dir.path() / "set").string()));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::string ours;
  for (size_t c = 0; c < d.class_names.size(); ++c) ours += (c ? "|" : "") + d.class_names[c];
  ours += "\n";
  for (size_t i = 0; i < d.files.size(); ++i) ours += std::to_string(d.labels[i]) + " " + d.files[i] + "\n";
  REQUIRE(d.files.size() == 17);
  REQUIRE(ours == r.out);
  REQUIRE(d.num_classes == 3);
}

TEST_CASE("decode and every recipe match torchvision + PIL on real photographs", "[trainer][data][imagefolder]") {
  TempDir dir;
  const fs::path root = dir.path() / "odd";
  make_folder(dir.path(), "--parity");
  Dataset d;
  scan_image_folder(dir.path(), d);
  REQUIRE(d.size() >= 40);

  const ImageRecipe recipes[] = {ImageRecipe::kTorchvisionEval, ImageRecipe::kSeedTrain,
                                 ImageRecipe::kTorchvisionTrain};
  const int s = 224;
  std::string params;
  struct Ours {
    std::vector<uint8_t> pixels;
    std::vector<float> tensor;
    int recipe;  // -1: decode
  };
  std::vector<Ours> ours;
  for (int64_t i = 0; i < d.size(); ++i) {
    const std::string& rel = d.files[static_cast<size_t>(i)];
    std::vector<uint8_t> bytes;
    read_file_bytes(dir.path() / rel, bytes);
    RgbImage whole;
    ImageDecoder().decode(bytes.data(), bytes.size(), rel, whole);
    std::vector<float> out(3 * s * s);
    ours.push_back({whole.pixels, {}, -1});
    params += "decode " + rel + " 0 0 0 0 0\n";
    for (int r = 0; r < 3; ++r) {
      ImageTransformConfig cfg;
      cfg.recipe = recipes[r];
      ImageSampleLoader loader(cfg);
      const ImageAug a = loader.load(dir.path() / rel, rel, 7, 0, i, out.data());
      ours.push_back({loader.last_pixels(), out, r});
      params += std::string(recipe_name(recipes[r])) + " " + rel + " " + std::to_string(a.flip) + " " +
                std::to_string(a.top) + " " + std::to_string(a.left) + " " + std::to_string(a.height) + " " +
                std::to_string(a.width) + "\n";
    }
  }
  wb::test::write_text(dir.path() / "params.txt", params);
  const auto r = wb::test::run_python_script(dir, "reference.py", kReference,
                                             shell_quote(dir.path().string()) + " " + shell_quote(dir.path().string()));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  Tally tally[4];  // decode, then the recipes
  for (size_t n = 0; n < ours.size(); ++n) {
    const auto want = read_raw<uint8_t>(dir.path() / (std::to_string(n) + ".u8"));
    const Ours& o = ours[n];
    CAPTURE(n, o.recipe);
    REQUIRE(want.size() == o.pixels.size());
    Tally& t = tally[o.recipe + 1];
    for (size_t k = 0; k < want.size(); ++k) {
      const int diff = std::abs(int{want[k]} - int{o.pixels[k]});
      t.exact += diff == 0;
      t.max_diff = std::max(t.max_diff, diff);
    }
    t.pixels += static_cast<long long>(want.size());
    if (o.recipe >= 0) {
      const auto want_f = read_raw<float>(dir.path() / (std::to_string(n) + ".f32"));
      REQUIRE(want_f.size() == o.tensor.size());
      for (size_t k = 0; k < want_f.size(); ++k) t.floats_exact += std::memcmp(&want_f[k], &o.tensor[k], 4) == 0;
      t.floats += static_cast<long long>(want_f.size());
    }
  }
  const char* names[] = {"decode", "torchvision-eval", "seed-train", "torchvision-train"};
  for (int k = 0; k < 4; ++k) {
    const Tally& t = tally[k];
    std::printf("parity %-18s %lld values, %.4f%% bit-exact, max difference %d levels; float32 tensor %.4f%% bit-exact\n",
                names[k], t.pixels, 100.0 * static_cast<double>(t.exact) / static_cast<double>(t.pixels), t.max_diff,
                t.floats ? 100.0 * static_cast<double>(t.floats_exact) / static_cast<double>(t.floats) : 100.0);
    CAPTURE(names[k]);
    // The bar: at most one level on >= 99.9% of the values; the goal (and what libjpeg-turbo 2.1 + PIL
    // 9.4 give) is bit-exact.
    REQUIRE(t.max_diff <= 1);
    REQUIRE(static_cast<double>(t.exact) >= 0.999 * static_cast<double>(t.pixels));
    REQUIRE(t.floats_exact == t.floats);
  }
}

TEST_CASE("a JPEG decoded around a region has the full decode's pixels there; damage outside it is still an error",
          "[trainer][data][imagefolder]") {
  TempDir dir;
  make_folder(dir.path(), "--parity");
  Dataset d;
  scan_image_folder(dir.path(), d);
  ImageDecoder decoder;
  std::vector<uint8_t> bytes;
  RgbImage whole, part;
  long long values = 0, jpegs = 0, cropped = 0, cropped_grey = 0;
  uint32_t rng = 12345;
  auto next = [&](int n) {
    rng = rng * 1664525u + 1013904223u;
    return static_cast<int>((rng >> 8) % static_cast<uint32_t>(n));
  };
  for (const std::string& rel : d.files) {
    read_file_bytes(dir.path() / rel, bytes);
    if (sniff_image_format(bytes.data(), bytes.size()) != ImageFormat::kJpeg) continue;
    ++jpegs;
    decoder.decode(bytes.data(), bytes.size(), rel, whole);
    const int w = whole.width, h = whole.height;
    bool grey = rel.find("_grey.") != std::string::npos;
    // Regions of every kind: inside, at each edge, one pixel, and the whole image.
    std::vector<SourceRect> regions{{0, 0, w, h}, {w / 2, h / 2, w / 2 + 1, h / 2 + 1}, {0, 0, w / 3 + 1, h / 4 + 1},
                                    {w - w / 3 - 1, h - h / 4 - 1, w, h}};
    for (int k = 0; k < 6; ++k) {
      const int x0 = next(w), y0 = next(h);
      regions.push_back({x0, y0, x0 + 1 + next(w - x0), y0 + 1 + next(h - y0)});
    }
    for (const SourceRect& r : regions) {
      CAPTURE(rel, w, h, r.x0, r.y0, r.x1, r.y1);
      part.pixels.assign(whole.pixels.size(), 0);  // what the region decode leaves alone stays 0
      bool asked = false;
      decoder.decode(bytes.data(), bytes.size(), rel, part, [&](int ww, int hh) {
        REQUIRE(ww == w);
        REQUIRE(hh == h);
        asked = true;
        return r;
      });
      REQUIRE(part.width == w);
      REQUIRE(part.height == h);
      long long mismatched = 0, untouched = 0;
      for (int y = r.y0; y < r.y1; ++y)
        for (int x = r.x0; x < r.x1; ++x)
          for (int c = 0; c < 3; ++c) {
            const std::size_t i = (static_cast<std::size_t>(y) * w + x) * 3 + c;
            mismatched += part.pixels[i] != whole.pixels[i];
            ++values;
          }
      for (std::size_t i = 0; i < part.pixels.size(); ++i) untouched += part.pixels[i] == 0 && whole.pixels[i] != 0;
      REQUIRE(mismatched == 0);
      if (asked && untouched > 0) {
        ++cropped;
        cropped_grey += grey;
        grey = false;  // one region per greyscale file counted
      }
    }
  }
  std::printf("region decode: %lld JPEGs, %lld region values equal to the full decode, %lld regions decoded in part "
              "(greyscale files: %lld)\n",
              jpegs, values, cropped, cropped_grey);
  REQUIRE(jpegs >= 5);
  REQUIRE(cropped >= jpegs);  // the partial path ran (CMYK files are decoded whole)
  REQUIRE(cropped_grey >= 2);  // greyscale JPEGs took it too

  // A file cut short below the region: the region's rows decode, but the damage is still found.
  for (const std::string& rel : d.files) {
    read_file_bytes(dir.path() / rel, bytes);
    if (sniff_image_format(bytes.data(), bytes.size()) != ImageFormat::kJpeg) continue;
    decoder.decode(bytes.data(), bytes.size(), rel, whole);
    if (whole.height < 200) continue;
    bytes.resize(bytes.size() * 2 / 3);
    REQUIRE_THROWS_WITH(decoder.decode(bytes.data(), bytes.size(), rel, part,
                                       [](int ww, int) { return SourceRect{0, 0, ww / 2, 8}; }),
                        Catch::Contains(rel + ": corrupt or truncated JPEG"));
    return;
  }
  FAIL("no JPEG of 200 rows or more in the parity folder");
}

TEST_CASE("bad image files are one line naming the file; --skip-bad-images counts them", "[trainer][data][imagefolder]") {
  TempDir dir;
  make_folder(dir.path() / "set", "--classes 2 --per-class 6 --size 40:90 --broken");
  Dataset d;
  scan_image_folder(dir.path() / "set", d);
  REQUIRE(d.size() == 17);
  ImageSampleLoader loader({});
  std::vector<float> out(3 * 224 * 224);
  int bad = 0;
  for (int64_t i = 0; i < d.size(); ++i) {
    const std::string& rel = d.files[static_cast<size_t>(i)];
    const std::string name = (dir.path() / "set" / rel).string();
    if (rel.find("broken_") == std::string::npos) {
      REQUIRE_NOTHROW(loader.load(dir.path() / "set" / rel, name, 1, 0, i, out.data()));
      continue;
    }
    ++bad;
    try {
      loader.load(dir.path() / "set" / rel, name, 1, 0, i, out.data());
      FAIL("no error for " << rel);
    } catch (const DataError& e) {
      const std::string msg = e.what();
      CAPTURE(msg);
      REQUIRE(msg.rfind(name + ": ", 0) == 0);
      REQUIRE(msg.find('\n') == std::string::npos);
    }
  }
  REQUIRE(bad == 5);
  // An unreadable file (a folder where a file is expected reads as an error too).
  REQUIRE_THROWS_WITH(loader.load(dir.path() / "set/missing.jpg", "missing.jpg", 1, 0, 0, out.data()),
                      Catch::Contains("missing.jpg: cannot open"));

  // In the pipeline: without skipping the first bad image ends the run with its line; with it, every
  // batch is full and the bad ones are counted once each, however often they come up.
  PipelineConfig pc;
  pc.batch_size = 17;
  pc.workers = 2;
  pc.shuffle = false;
  pc.total_steps = 2;
  pc.transform.image_size = 64;
  pc.image.image_size = 64;
  pc.image.resize_size = resize_side_for(64);
  {
    Pipeline pipe(d, pc);
    REQUIRE_THROWS_WITH(pipe.pop(), Catch::Contains("broken_"));
  }
  pc.skip_bad_images = true;
  Pipeline pipe(d, pc);
  for (int step = 0; step < 2; ++step) {
    BatchRef b = pipe.pop();
    REQUIRE(b);
    for (size_t j = 0; j < 17; ++j) {
      CAPTURE(step, j);
      const std::string& rel = d.files[static_cast<size_t>(b->indices[j])];
      REQUIRE(rel.find("broken_") == std::string::npos);
      REQUIRE(b->labels[j] == d.labels[static_cast<size_t>(b->indices[j])]);
    }
  }
  REQUIRE(pipe.stats().bad_images == 5);
  REQUIRE(pipe.stats().first_bad_image.find("broken_") != std::string::npos);
}

TEST_CASE("image folder errors name the folder", "[trainer][data][imagefolder]") {
  TempDir dir;
  Dataset d;
  REQUIRE_THROWS_WITH(scan_image_folder(dir.path() / "nope", d), Catch::Contains("nope: not a folder"));
  REQUIRE_THROWS_WITH(scan_image_folder(dir.path(), d), Catch::Contains("no class subfolders"));
  make_folder(dir.path() / "set", "--classes 2 --per-class 2 --size 20:30");
  fs::create_directories(dir.path() / "set/empty_class");
  wb::test::write_text(dir.path() / "set/empty_class/readme.txt", "x");
  REQUIRE_THROWS_WITH(scan_image_folder(dir.path() / "set", d),
                      Catch::Contains("empty_class: class folder without image files"));
  REQUIRE_THROWS_AS(parse_image_recipe("torchvision"), DataError);
  REQUIRE(parse_image_recipe("seed-train") == ImageRecipe::kSeedTrain);
}

TEST_CASE("PIL's resampler on synthetic images of odd sizes and windows", "[trainer][data][imagefolder]") {
  // Noise images at sizes the photographs do not cover (up, down, one axis, 1 pixel), and windows of
  // the output equal to the same pixels of the full resize.
  TempDir dir;
  struct Case { int iw, ih, ow, oh; };
  const Case cases[] = {{1, 1, 5, 3}, {2, 9, 1, 1}, {13, 7, 256, 200}, {640, 3, 17, 3}, {333, 517, 256, 397},
                        {256, 256, 256, 256}, {1000, 999, 7, 1001}};
  std::string sizes;
  std::vector<std::vector<uint8_t>> ours;
  PilResizeScratch scratch;
  for (size_t n = 0; n < std::size(cases); ++n) {
    const Case& c = cases[n];
    Rng rng(n + 11);
    std::vector<uint8_t> img(static_cast<size_t>(c.iw) * c.ih * 3);
    for (uint8_t& v : img) v = static_cast<uint8_t>(rng.uniform(256));
    wb::test::write_raw(dir.path() / (std::to_string(n) + ".in"), img);
    std::vector<uint8_t> full(static_cast<size_t>(c.ow) * c.oh * 3);
    pil_resize_bilinear(img.data(), c.iw * 3, c.iw, c.ih, c.ow, c.oh, {0, 0, c.ow, c.oh}, full.data(), scratch);
    // A window of the same resize is the same pixels.
    const PixelWindow win{c.ow / 3, c.oh / 4, std::max(1, c.ow / 2), std::max(1, c.oh / 2)};
    std::vector<uint8_t> part(static_cast<size_t>(win.width) * win.height * 3);
    pil_resize_bilinear(img.data(), c.iw * 3, c.iw, c.ih, c.ow, c.oh, win, part.data(), scratch);
    for (int y = 0; y < win.height; ++y) {
      REQUIRE(std::memcmp(&part[static_cast<size_t>(y) * win.width * 3],
                          &full[(static_cast<size_t>(y + win.y) * c.ow + win.x) * 3], static_cast<size_t>(win.width) * 3) == 0);
    }
    // The scalar horizontal pass gives the same bytes as the SIMD one.
    PilResizeScratch scalar;
    scalar.scalar_only = true;
    std::vector<uint8_t> plain(full.size());
    pil_resize_bilinear(img.data(), c.iw * 3, c.iw, c.ih, c.ow, c.oh, {0, 0, c.ow, c.oh}, plain.data(), scalar);
    REQUIRE(plain == full);
    ours.push_back(full);
    sizes += std::to_string(c.iw) + " " + std::to_string(c.ih) + " " + std::to_string(c.ow) + " " +
             std::to_string(c.oh) + "\n";
  }
  wb::test::write_text(dir.path() / "sizes.txt", sizes);
  const auto r = wb::test::run_python_script(dir, "resize.py", R"PY(
import numpy as np
from PIL import Image
for n, line in enumerate(open("sizes.txt")):
    iw, ih, ow, oh = map(int, line.split())
    a = np.fromfile(f"{n}.in", dtype=np.uint8).reshape(ih, iw, 3)
    np.asarray(Image.fromarray(a, "RGB").resize((ow, oh), Image.BILINEAR)).tofile(f"{n}.out")
)PY");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (size_t n = 0; n < ours.size(); ++n) {
    CAPTURE(n);
    REQUIRE(read_raw<uint8_t>(dir.path() / (std::to_string(n) + ".out")) == ours[n]);
  }
}
