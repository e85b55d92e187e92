#pragma once
// PIL's antialiased bilinear resampling of 8-bit RGB (Image.resize(size, Image.BILINEAR), which is
// what torchvision's Resize runs on PIL images), reproduced to the bit:
//   - separable, horizontal pass first (into uint8, rows limited to those the vertical pass reads),
//     then vertical; a pass whose size does not change is skipped;
//   - per output pixel: center = (x + 0.5) * scale, scale = in / out; the triangle filter's support is
//     scaled by max(scale, 1) (antialiasing when downscaling); taps from int(center - support + 0.5)
//     to int(center + support + 0.5) clipped to the image; weights tri((i - center + 0.5) / fscale),
//     normalised in double;
//   - weights as fixed point with PRECISION_BITS = 22 (rounded half away from zero), sums started at
//     half a unit, the result clipped to 0..255 after an arithmetic shift.
// An output window can be asked for: only those pixels are computed (a resize followed by a crop
// costs the crop), with values identical to the full resize's.

#include <cstdint>
#include <vector>

namespace wb::data {

inline constexpr int kPilPrecisionBits = 32 - 8 - 2;

// One axis' taps: output i reads `count[i]` inputs from `first[i]` with weights
// `weights[i * ksize ...]` (fixed point).
struct PilAxis {
  int ksize = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;
};
PilAxis pil_bilinear_axis(int in_size, int out_size);

// A rectangle of the output: columns [x, x + width), rows [y, y + height).
struct PixelWindow {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

// Scratch reused between calls (one per worker thread).
struct PilResizeScratch {
  PilAxis horizontal;
  PilAxis vertical;
  std::vector<uint8_t> temp;
  std::vector<int32_t> acc;
  int h_in = -1, h_out = -1, v_in = -1, v_out = -1;  // sizes the cached axes were made for
  // The horizontal pass uses SSE4.1 where the CPU has it (same integer sums); true keeps it scalar, so
  // tests can set both paths side by side.
  bool scalar_only = false;
};

// The input pixels pil_resize_bilinear reads to compute the output window `win` (the taps of its first
// and last rows and columns), as a window of the input.
PixelWindow pil_resize_source_window(int in_w, int in_h, int out_w, int out_h, const PixelWindow& win,
                                     PilResizeScratch& scratch);

// Resizes the (in_h, in_w, 3) image at `src` (rows `src_stride` bytes apart, so a crop of a larger
// image can be passed without a copy) to (out_h, out_w) and writes the window `win` of the result to
// `dst` as (win.height, win.width, 3), packed.
void pil_resize_bilinear(const uint8_t* src, int src_stride, int in_w, int in_h, int out_w, int out_h,
                         const PixelWindow& win, uint8_t* dst, PilResizeScratch& scratch);

}  // namespace wb::data
