#include "trainer/data/transforms.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>

#include "trainer/data/clock.hpp"
#include "trainer/data/sampler.hpp"

namespace wb::data {

std::span<const std::string_view> transform_names() {
  static constexpr std::array<std::string_view, kTransformCount> kNames = {
      "decode", "random_crop", "random_flip", "resize", "rescale_normalize", "hwc2chw",
      "read",   "crop",        "normalize"};
  return kNames;
}

void decode(const uint8_t* src, int64_t count, float* dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
}

void random_crop(const float* src, int h, int w, int c, int padding, int top, int left, float* dst) {
  // Output pixel (y, x) is padded pixel (y + top, x + left), i.e. source (y + top - p, x + left - p).
  const int dy = top - padding;
  const int dx = left - padding;
  const size_t row_floats = static_cast<size_t>(w) * c;
  for (int y = 0; y < h; ++y) {
    float* out = dst + y * row_floats;
    const int sy = y + dy;
    if (sy < 0 || sy >= h) {
      std::fill(out, out + row_floats, 0.0f);
      continue;
    }
    const int x_begin = std::clamp(-dx, 0, w);      // first output column inside the source
    const int x_end = std::clamp(w - dx, 0, w);     // one past the last
    std::fill(out, out + static_cast<size_t>(x_begin) * c, 0.0f);
    if (x_end > x_begin) {
      std::memcpy(out + static_cast<size_t>(x_begin) * c, src + (static_cast<size_t>(sy) * w + x_begin + dx) * c,
                  static_cast<size_t>(x_end - x_begin) * c * sizeof(float));
    }
    std::fill(out + static_cast<size_t>(std::max(x_end, x_begin)) * c, out + row_floats, 0.0f);
  }
}

void horizontal_flip(float* img, int h, int w, int c) {
  for (int y = 0; y < h; ++y) {
    float* row = img + static_cast<size_t>(y) * w * c;
    for (int x = 0; x < w / 2; ++x) {
      float* a = row + static_cast<size_t>(x) * c;
      float* b = row + static_cast<size_t>(w - 1 - x) * c;
      for (int k = 0; k < c; ++k) std::swap(a[k], b[k]);
    }
  }
}

namespace {

// Source index pair and weight of the far one, computed in float like torch's CPU kernel.
struct Tap {
  int i0;
  int i1;
  float l1;
};

Tap tap(int dst, int in, int out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float src = std::max(0.0f, scale * (static_cast<float>(dst) + 0.5f) - 0.5f);
  const int i0 = std::min(static_cast<int>(src), in - 1);
  const int i1 = std::min(i0 + 1, in - 1);
  return {i0, i1, src - static_cast<float>(i0)};
}

}  // namespace

void resize_bilinear(const float* src, int in_h, int in_w, int c, float* dst, int out_h, int out_w) {
  for (int y = 0; y < out_h; ++y) {
    const Tap ty = tap(y, in_h, out_h);
    const float ly0 = 1.0f - ty.l1;
    const float* r0 = src + static_cast<size_t>(ty.i0) * in_w * c;
    const float* r1 = src + static_cast<size_t>(ty.i1) * in_w * c;
    float* out = dst + static_cast<size_t>(y) * out_w * c;
    for (int x = 0; x < out_w; ++x) {
      const Tap tx = tap(x, in_w, out_w);
      const float lx0 = 1.0f - tx.l1;
      for (int k = 0; k < c; ++k) {
        const float top = lx0 * r0[tx.i0 * c + k] + tx.l1 * r0[tx.i1 * c + k];
        const float bottom = lx0 * r1[tx.i0 * c + k] + tx.l1 * r1[tx.i1 * c + k];
        out[x * c + k] = ly0 * top + ty.l1 * bottom;
      }
    }
  }
}

void rescale_normalize(float* img, int64_t pixels, int c, const Normalization& norm) {
  if (c != 3) throw DataError("rescale_normalize: " + std::to_string(c) + " channels, expected 3");
  // One multiply-add per element: (x / 255 - m) / s = x * (1 / (255 s)) - m / s.
  float scale[3];
  float shift[3];
  for (int k = 0; k < 3; ++k) {
    scale[k] = 1.0f / (255.0f * norm.std[k]);
    shift[k] = norm.mean[k] / norm.std[k];
  }
  for (int64_t p = 0; p < pixels; ++p) {
    for (int k = 0; k < 3; ++k) img[p * 3 + k] = img[p * 3 + k] * scale[k] - shift[k];
  }
}

void hwc_to_chw(const float* src, int h, int w, int c, float* dst) {
  const int64_t plane = int64_t{h} * w;
  for (int64_t p = 0; p < plane; ++p) {
    for (int k = 0; k < c; ++k) dst[k * plane + p] = src[p * c + k];
  }
}

AugmentParams draw_augment(const TransformConfig& config, uint64_t seed, int64_t epoch, int64_t sample) {
  AugmentParams p;
  if (!config.train) return p;
  Rng rng(sample_key(seed, epoch, sample));
  const auto span = static_cast<uint64_t>(2 * config.crop_padding + 1);
  p.top = static_cast<int>(rng.uniform(span));
  p.left = static_cast<int>(rng.uniform(span));
  p.flip = rng.uniform01() < config.flip_prob;
  return p;
}

SampleTransform::SampleTransform(const TransformConfig& config, int in_h, int in_w)
    : config_(config), in_h_(in_h), in_w_(in_w) {
  if (config.image_size < 1) {
    throw DataError("--image-size is " + std::to_string(config.image_size) + ", expected >= 1");
  }
  if (config.crop_padding < 0) {
    throw DataError("crop padding is " + std::to_string(config.crop_padding) + ", expected >= 0");
  }
  if (in_h < 1 || in_w < 1) {
    throw DataError("transform input is " + std::to_string(in_h) + "x" + std::to_string(in_w) +
                    ", expected a non-empty image");
  }
  const size_t floats = static_cast<size_t>(std::max(in_h * in_w, config.image_size * config.image_size)) * 3;
  a_.resize(floats);
  b_.resize(floats);
}

void SampleTransform::apply(const uint8_t* hwc, const AugmentParams& aug, float* out_chw, Observer* observer,
                            int worker, int64_t decode_begin_ns) {
  constexpr int c = 3;
  int64_t t0 = 0;
  if (observer != nullptr) t0 = decode_begin_ns != 0 ? decode_begin_ns : now_ns();
  // Reports the step that just ended and starts the next one's clock; free without an observer.
  auto mark = [&](int id) {
    if (observer == nullptr) return;
    const int64_t t1 = now_ns();
    observer->on_transform(worker, id, t0, t1);
    t0 = t1;
  };
  float* cur = a_.data();
  float* other = b_.data();
  decode(hwc, int64_t{in_h_} * in_w_ * c, cur);
  mark(kDecode);
  if (config_.train) {
    random_crop(cur, in_h_, in_w_, c, config_.crop_padding, aug.top, aug.left, other);
    std::swap(cur, other);
    mark(kRandomCrop);
    if (aug.flip) horizontal_flip(cur, in_h_, in_w_, c);
    mark(kRandomFlip);
  }
  const int s = config_.image_size;
  // Bilinear at the same size is the identity (src = dst exactly), so it is skipped and not reported.
  if (s != in_h_ || s != in_w_) {
    resize_bilinear(cur, in_h_, in_w_, c, other, s, s);
    std::swap(cur, other);
    mark(kResize);
  }
  rescale_normalize(cur, int64_t{s} * s, c, config_.norm);
  mark(kRescaleNormalize);
  hwc_to_chw(cur, s, s, c, out_chw);
  mark(kHwc2Chw);
}

}  // namespace wb::data
