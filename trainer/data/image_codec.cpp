#include "trainer/data/image_codec.hpp"

#include <spng.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

namespace wb::data {

ImageFormat sniff_image_format(const uint8_t* d, std::size_t n) {
  auto starts = [&](const char* magic, std::size_t len) { return n >= len && std::memcmp(d, magic, len) == 0; };
  if (starts("\xFF\xD8\xFF", 3)) return ImageFormat::kJpeg;
  if (starts("\x89PNG\r\n\x1A\n", 8)) return ImageFormat::kPng;
  if (starts("BM", 2) || starts("II*\0", 4) || starts("MM\0*", 4) ||
      (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) ||
      (n >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6')) {
    return ImageFormat::kOther;
  }
  return ImageFormat::kUnknown;
}

void read_file_bytes(const std::filesystem::path& file, std::vector<uint8_t>& out) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (!f) throw DataError(file.string() + ": cannot open (" + std::strerror(errno) + ")");
  out.clear();
  uint8_t chunk[1 << 16];
  for (;;) {
    const std::size_t got = std::fread(chunk, 1, sizeof chunk, f.get());
    out.insert(out.end(), chunk, chunk + got);
    if (got < sizeof chunk) break;
  }
  if (std::ferror(f.get())) throw DataError(file.string() + ": read error (" + std::strerror(errno) + ")");
}

ImageDecoder::ImageDecoder() : tj_(tjInitDecompress()) {
  if (tj_ == nullptr) throw DataError(std::string("libjpeg-turbo: cannot create a decompressor: ") + tjGetErrorStr2(nullptr));
}

ImageDecoder::~ImageDecoder() {
  if (tj_ != nullptr) tjDestroy(tj_);
}

void ImageDecoder::decode(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out,
                          const RegionOfInterest& roi) {
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kJpeg: return decode_jpeg(data, size, name, out, roi);
    case ImageFormat::kPng: return decode_png(data, size, name, out);
    case ImageFormat::kOther:
      throw DataError(name + ": a BMP/PPM/TIFF/WebP image; wb-train decodes JPEG and PNG only (convert it, or "
                      "--skip-bad-images)");
    case ImageFormat::kUnknown: break;
  }
  throw DataError(name + ": not an image (" + std::to_string(size) + " bytes, neither JPEG nor PNG)");
}

namespace {

// Refuses an image over PIL's decompression-bomb limit before its pixels are allocated.
void check_pixels(const std::string& name, const char* format, std::uint64_t w, std::uint64_t h) {
  if (w * h > kMaxImagePixels) {
    throw DataError(name + ": " + format + " of " + std::to_string(w) + "x" + std::to_string(h) + " pixels, over the " +
                    std::to_string(kMaxImagePixels) + "-pixel limit (PIL's decompression-bomb limit)");
  }
}

// PIL's MULDIV255: round(a * b / 255) in integers.
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// libjpeg's errors, and its warnings (as TJFLAG_STOPONWARNING does), end the decode through longjmp back
// to decode_jpeg_region, with the message kept.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

extern "C" void jpeg_stop(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

extern "C" void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_stop(cinfo);  // a warning: corrupt data, premature end of file
}

// Pixels decoded beyond the region on each side, so that the region's pixels equal the full decode's.
constexpr int kRegionMargin = 16;

}  // namespace

// Only the local C structs live in this frame across setjmp, so the longjmp skips no destructor.
bool ImageDecoder::decode_jpeg_region(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out,
                                      const SourceRect& r) {
  jpeg_decompress_struct cinfo{};
  JpegErrors err{};
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_stop;
  err.mgr.emit_message = jpeg_message;
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    throw DataError(name + ": corrupt or truncated JPEG (libjpeg-turbo: " + err.message + ")");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const bool grey = cinfo.num_components == 1 && cinfo.jpeg_color_space == JCS_GRAYSCALE;
  const bool colour =
      cinfo.num_components == 3 && (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_RGB);
  if ((!grey && !colour) || static_cast<int>(cinfo.image_width) != out.width ||
      static_cast<int>(cinfo.image_height) != out.height) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  // What PIL's decoder (and tjDecompress2) use: accurate integer DCT, fancy upsampling. Greyscale comes
  // out as one channel and is spread over three, as PIL's convert('RGB') does.
  cinfo.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  const int w = out.width, h = out.height;
  JDIMENSION x = static_cast<JDIMENSION>(std::clamp(r.x0 - kRegionMargin, 0, w));
  JDIMENSION cw = static_cast<JDIMENSION>(std::clamp(r.x1 + kRegionMargin, 0, w)) - x;
  if (cw == 0) cw = 1;
  if (cw < static_cast<JDIMENSION>(w)) jpeg_crop_scanline(&cinfo, &x, &cw);  // widened to whole iMCUs
  const auto y0 = static_cast<JDIMENSION>(std::clamp(r.y0 - kRegionMargin, 0, h));
  const auto y1 = static_cast<JDIMENSION>(std::clamp(r.y1 + kRegionMargin, 0, h));
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);
  const std::size_t stride = static_cast<std::size_t>(w) * 3;
  if (grey) scratch_.resize(cw);
  while (cinfo.output_scanline < y1) {
    uint8_t* dst = out.pixels.data() + static_cast<std::size_t>(cinfo.output_scanline) * stride + std::size_t{x} * 3;
    JSAMPROW row = grey ? scratch_.data() : dst;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (grey) {
      for (JDIMENSION i = 0; i < cw; ++i) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = scratch_[i];
    }
  }
  // The rest is entropy-decoded and dropped: a damaged or truncated tail is still an error.
  if (cinfo.output_scanline < cinfo.output_height) jpeg_skip_scanlines(&cinfo, cinfo.output_height - cinfo.output_scanline);
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

void ImageDecoder::decode_jpeg(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out,
                               const RegionOfInterest& roi) {
  auto* h = static_cast<tjhandle>(tj_);
  int w = 0, ht = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &w, &ht, &subsamp, &colorspace) != 0) {
    throw DataError(name + ": corrupt JPEG header (libjpeg-turbo: " + tjGetErrorStr2(h) + ")");
  }
  if (w < 1 || ht < 1) throw DataError(name + ": JPEG of " + std::to_string(w) + "x" + std::to_string(ht) + " pixels");
  check_pixels(name, "JPEG", static_cast<std::uint64_t>(w), static_cast<std::uint64_t>(ht));
  out.width = w;
  out.height = ht;
  const std::size_t px = static_cast<std::size_t>(w) * static_cast<std::size_t>(ht);
  out.pixels.resize(px * 3);
  // TJFLAG_STOPONWARNING: a truncated or damaged stream is an error, as PIL's "image file is truncated".
  const int flags = TJFLAG_STOPONWARNING;
  auto check = [&](int rc) {
    if (rc != 0) throw DataError(name + ": corrupt or truncated JPEG (libjpeg-turbo: " + tjGetErrorStr2(h) + ")");
  };
  auto region = [&] {
    if (!roi) return false;
    const SourceRect r = roi(w, ht);
    const bool part = r.x0 > kRegionMargin || r.y0 > kRegionMargin || r.x1 < w - kRegionMargin ||
                      r.y1 < ht - kRegionMargin;
    return part && decode_jpeg_region(data, size, name, out, r);
  };
  if (colorspace == TJCS_GRAY) {
    if (region()) return;
    scratch_.resize(px);
    check(tjDecompress2(h, data, static_cast<unsigned long>(size), scratch_.data(), w, 0, ht, TJPF_GRAY, flags));
    for (std::size_t i = 0; i < px; ++i) out.pixels[3 * i] = out.pixels[3 * i + 1] = out.pixels[3 * i + 2] = scratch_[i];
  } else if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    scratch_.resize(px * 4);
    check(tjDecompress2(h, data, static_cast<unsigned long>(size), scratch_.data(), w, 0, ht, TJPF_CMYK, flags));
    for (std::size_t i = 0; i < px; ++i) {
      const uint8_t* s = &scratch_[4 * i];
      const int nk = s[3];  // inverted k: 255 - k
      for (int c = 0; c < 3; ++c) {
        const int v = nk - muldiv255(255 - s[c], nk);
        out.pixels[3 * i + static_cast<std::size_t>(c)] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
    }
  } else {
    if (region()) return;
    check(tjDecompress2(h, data, static_cast<unsigned long>(size), out.pixels.data(), w, 0, ht, TJPF_RGB, flags));
  }
}

void ImageDecoder::decode_png(const uint8_t* data, std::size_t size, const std::string& name, RgbImage& out) {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(0), &spng_ctx_free);
  if (!ctx) throw DataError(name + ": libspng: cannot create a decoder");
  auto check = [&](int rc, const char* what) {
    if (rc != 0) throw DataError(name + ": corrupt or truncated PNG (" + what + ": " + spng_strerror(rc) + ")");
  };
  // Checksums are checked: PIL checks them too (a damaged chunk is an error there).
  check(spng_set_png_buffer(ctx.get(), data, size), "buffer");
  spng_ihdr ihdr{};
  check(spng_get_ihdr(ctx.get(), &ihdr), "header");
  if (ihdr.width < 1 || ihdr.height < 1 || ihdr.width > (1u << 16) || ihdr.height > (1u << 16)) {
    throw DataError(name + ": PNG of " + std::to_string(ihdr.width) + "x" + std::to_string(ihdr.height) +
                    " pixels, expected 1..65536 on each side");
  }
  check_pixels(name, "PNG", ihdr.width, ihdr.height);
  // The filtered rows (a filter byte and the packed samples per row) come out of deflate, which expands
  // at most 1032 times: a file shorter than that bound cannot hold the image, however its IDATs end.
  const std::uint64_t channels_of[7] = {1, 0, 3, 1, 2, 0, 4};
  const std::uint64_t bits = (ihdr.color_type < 7 ? channels_of[ihdr.color_type] : 1) * ihdr.bit_depth;
  const std::uint64_t raw = static_cast<std::uint64_t>(ihdr.height) * (1 + (ihdr.width * bits + 7) / 8);
  if (raw > 1032 * static_cast<std::uint64_t>(size) + 1024) {
    throw DataError(name + ": truncated PNG (" + std::to_string(size) + " bytes cannot hold " +
                    std::to_string(ihdr.width) + "x" + std::to_string(ihdr.height) + " pixels)");
  }
  out.width = static_cast<int>(ihdr.width);
  out.height = static_cast<int>(ihdr.height);
  const std::size_t px = static_cast<std::size_t>(ihdr.width) * ihdr.height;
  out.pixels.resize(px * 3);
  if (ihdr.bit_depth != 16) {
    // Palette lookup, grey expansion (1/2/4-bit scaled to 0..255), alpha dropped.
    std::size_t len = 0;
    check(spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &len), "size");
    if (len != px * 3) throw DataError(name + ": PNG decoded size mismatch");
    check(spng_decode_image(ctx.get(), out.pixels.data(), len, SPNG_FMT_RGB8, 0), "decode");
    return;
  }
  // 16 bits: raw big-endian samples, converted as PIL does.
  std::size_t len = 0;
  check(spng_decoded_image_size(ctx.get(), SPNG_FMT_RAW, &len), "size");
  scratch_.resize(len);
  check(spng_decode_image(ctx.get(), scratch_.data(), len, SPNG_FMT_RAW, 0), "decode");
  int channels = 0;
  switch (ihdr.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE: channels = 1; break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: channels = 2; break;
    case SPNG_COLOR_TYPE_TRUECOLOR: channels = 3; break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: channels = 4; break;
    default: throw DataError(name + ": PNG colour type " + std::to_string(ihdr.color_type) + " at 16 bits");
  }
  if (len != px * static_cast<std::size_t>(channels) * 2) throw DataError(name + ": PNG decoded size mismatch");
  for (std::size_t i = 0; i < px; ++i) {
    const uint8_t* s = &scratch_[i * static_cast<std::size_t>(channels) * 2];
    uint8_t* d = &out.pixels[3 * i];
    if (channels == 1) {
      const int v = (s[0] << 8) | s[1];
      d[0] = d[1] = d[2] = static_cast<uint8_t>(std::min(v, 255));
    } else if (channels == 2) {
      d[0] = d[1] = d[2] = s[0];
    } else {
      d[0] = s[0];
      d[1] = s[2];
      d[2] = s[4];
    }
  }
}

}  // namespace wb::data
