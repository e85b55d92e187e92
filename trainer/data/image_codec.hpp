#pragma once
// Image files into 8-bit RGB, as PIL's Image.open(f).convert("RGB") gives them (what torchvision's
// ImageFolder loader does): JPEG through libjpeg-turbo (the library and the default DCT method PIL's
// decoder uses, so pixels are the same), PNG through libspng. The format is found from the content,
// as PIL does, not from the file name.
//   JPEG greyscale -> R = G = B; CMYK/YCCK -> inverted (Adobe convention, which PIL assumes) and then
//   PIL's cmyk2rgb: nk = 255 - k, R = nk - round(c * nk / 255) (PIL's MULDIV255).
//   PNG: palette looked up, alpha dropped (no compositing), 16-bit colour and grey+alpha keep the high
//   byte, 16-bit grey is clipped to 0..255 (PIL opens it as mode "I" and clips in convert), 1/2/4-bit
//   grey scaled to 0..255. Gamma and tRNS are ignored, as in PIL.
// EXIF orientation is not applied (neither torchvision's loader nor convert() applies it).
// An image of more than kMaxImagePixels is refused before anything is allocated, as PIL refuses one
// (DecompressionBombError); so is a PNG whose compressed data is too short to hold the pixels its
// header claims (deflate shrinks at most 1032:1): a file of a few bytes never costs gigabytes.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "trainer/data/error.hpp"

namespace wb::data {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // (height, width, 3)
};

// PIL's limit: Image.open raises DecompressionBombError above 2 * MAX_IMAGE_PIXELS (89,478,485).
inline constexpr std::uint64_t kMaxImagePixels = 2 * 89'478'485ull;

enum class ImageFormat { kUnknown, kJpeg, kPng, kOther };

// What the first bytes say: JPEG (FF D8 FF), PNG (the 8-byte signature), another format torchvision's
// loader would accept (BMP, PPM/PGM, TIFF, WebP: kOther) or none of these.
ImageFormat sniff_image_format(const uint8_t* data, std::size_t size);

// Reads a whole file into `out` (reused). Throws DataError naming the file when it cannot be read.
void read_file_bytes(const std::filesystem::path& file, std::vector<uint8_t>& out);

// The part of an image a transform reads: columns [x0, x1), rows [y0, y1).
struct SourceRect {
  int x0 = 0;
  int y0 = 0;
  int x1 = 0;
  int y1 = 0;
};
// Called once per image with its size, before the pixels are decoded: which part will be read.
using RegionOfInterest = std::function<SourceRect(int width, int height)>;

// Reusable decoder state (one per worker thread). decode() throws DataError "FILE: ..." for a corrupt,
// truncated or unsupported image; `name` is what the message names.
//
// With a region of interest, a colour JPEG is decoded only around that region: libjpeg-turbo's
// jpeg_crop_scanline and jpeg_skip_scanlines skip the inverse DCT, upsampling and colour conversion of
// the rest, with a margin of one 16-pixel MCU so that the pixels inside the region are those of the
// full decode (the upsampler treats a crop's edge as an image edge, which changes the pixels next to
// it: without a margin the tests see differences, with 2 pixels already none). The skipped rows are still entropy-decoded, so a truncated or damaged file is an error as
// with a full decode. Pixels outside the region (and its margin) are left as they were. Grey and CMYK
// JPEGs and PNGs are decoded whole.
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  void decode(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out,
              const RegionOfInterest& roi = {});

 private:
  void decode_jpeg(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out,
                   const RegionOfInterest& roi);
  bool decode_jpeg_region(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out,
                          const SourceRect& r);
  void decode_png(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out);
  void* tj_ = nullptr;            // tjhandle
  std::vector<uint8_t> scratch_;  // CMYK / grey / 16-bit staging
};

}  // namespace wb::data
