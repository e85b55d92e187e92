#pragma once
// Per-sample transforms of the MindSpore ResNet CIFAR-10 pipeline (create_dataset):
//   train: decode, RandomCrop(size = input side, padding 4, zeros), RandomHorizontalFlip(0.5),
//          Resize(image_size, bilinear), Rescale(1/255) + Normalize(mean, std), HWC2CHW
//   eval:  decode, Resize, Rescale + Normalize, HWC2CHW
// Pixels stay float from decode on, so the resize is not re-quantised to uint8 (MindSpore's Resize on
// uint8 rounds; ours matches torch's interpolate on float input instead).
// All images are HWC float unless noted; every step is a free function so it can be tested alone.

#include <cstdint>
#include <vector>

#include "trainer/data/dataset.hpp"
#include "trainer/data/observer.hpp"

namespace wb::data {

// uint8 (h*w*c) -> float in 0..255.
void decode(const uint8_t* src, int64_t count, float* dst);
// Pads by `padding` zeros on every side and crops an (h, w) window at (top, left) of the padded image;
// top, left in [0, 2*padding]. dst must not alias src.
void random_crop(const float* src, int h, int w, int c, int padding, int top, int left, float* dst);
// Mirrors columns in place.
void horizontal_flip(float* img, int h, int w, int c);
// Bilinear, align_corners=False, no antialiasing (torch.nn.functional.interpolate semantics):
// src = (dst + 0.5) * in / out - 0.5, clamped to [0, in - 1].
void resize_bilinear(const float* src, int in_h, int in_w, int c, float* dst, int out_h, int out_w);
// x -> (x / 255 - mean[ch]) / std[ch], in place; c must be 3.
void rescale_normalize(float* img, int64_t pixels, int c, const Normalization& norm);
// (h, w, c) -> (c, h, w).
void hwc_to_chw(const float* src, int h, int w, int c, float* dst);

struct TransformConfig {
  int image_size = 32;     // output side (Resize target)
  int crop_padding = 4;    // RandomCrop padding
  double flip_prob = 0.5;  // RandomHorizontalFlip
  bool train = true;       // random crop + flip only when training
  Normalization norm = default_normalization(DatasetKind::kCifar10);
};

// The random choices for one sample, drawn from (seed, epoch, dataset index) alone.
struct AugmentParams {
  int top = 0;   // crop offset in the padded image, 0..2*padding
  int left = 0;
  bool flip = false;
};
AugmentParams draw_augment(const TransformConfig& config, uint64_t seed, int64_t epoch, int64_t sample);

// Runs the steps for one sample of a (in_h, in_w, 3) dataset into a (3, image_size, image_size) output,
// reusing its scratch buffers (one instance per worker thread, so no allocation per sample).
class SampleTransform {
 public:
  SampleTransform(const TransformConfig& config, int in_h, int in_w);
  // `observer` may be null; with one, each step is reported as a range on `worker`. A caller that
  // did work of its own before decoding (the pipeline's delay_us sleep) passes when that began as
  // `decode_begin_ns` so it is counted as decode time; 0 means now.
  void apply(const uint8_t* hwc, const AugmentParams& aug, float* out_chw, Observer* observer = nullptr,
             int worker = 0, int64_t decode_begin_ns = 0);


 private:
  TransformConfig config_;
  int in_h_;
  int in_w_;
  std::vector<float> a_;
  std::vector<float> b_;
};

}  // namespace wb::data
