#include "trainer/data/pil_resize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "trainer/data/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define WB_PIL_RESIZE_SSE41 1
#include <immintrin.h>
#else
#define WB_PIL_RESIZE_SSE41 0
#endif

namespace wb::data {
namespace {

double triangle(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t clip8(int32_t v) {
  // Arithmetic shift, then PIL's lookup table: below 0 -> 0, above 255 -> 255.
  return static_cast<uint8_t>(std::clamp(v >> kPilPrecisionBits, 0, 255));
}

// One output row of the horizontal pass: window columns [x0, x0 + width), PIL's arithmetic.
void horizontal_row(const uint8_t* in, const PilAxis& h, int x0, int width, uint8_t* out) {
  for (int xx = 0; xx < width; ++xx) {
    const auto ox = static_cast<std::size_t>(x0 + xx);
    const int32_t* k = &h.weights[ox * static_cast<std::size_t>(h.ksize)];
    const uint8_t* p = in + static_cast<std::size_t>(h.first[ox]) * 3;
    int32_t s0 = 1 << (kPilPrecisionBits - 1), s1 = s0, s2 = s0;
    const int n = h.count[ox];
    for (int x = 0; x < n; ++x) {
      s0 += p[3 * x] * k[x];
      s1 += p[3 * x + 1] * k[x];
      s2 += p[3 * x + 2] * k[x];
    }
    out[3 * xx] = clip8(s0);
    out[3 * xx + 1] = clip8(s1);
    out[3 * xx + 2] = clip8(s2);
  }
}

#if WB_PIL_RESIZE_SSE41
// The same sums with one pixel's three channels in the lanes of one vector (the fourth lane, the next
// pixel's red, is computed and thrown away). Integer arithmetic: identical results. The input's last
// pixel is read bytewise, so nothing past the row is touched.
__attribute__((target("sse4.1"))) void horizontal_row_sse41(const uint8_t* in, int in_w, const PilAxis& h, int x0,
                                                             int width, uint8_t* out) {
  for (int xx = 0; xx < width; ++xx) {
    const auto ox = static_cast<std::size_t>(x0 + xx);
    const int32_t* k = &h.weights[ox * static_cast<std::size_t>(h.ksize)];
    const int first = h.first[ox];
    const int n = h.count[ox];
    const uint8_t* p = in + static_cast<std::size_t>(first) * 3;
    const int vec = first + n == in_w ? n - 1 : n;
    __m128i acc = _mm_set1_epi32(1 << (kPilPrecisionBits - 1));
    for (int x = 0; x < vec; ++x) {
      int32_t bytes;
      std::memcpy(&bytes, p + 3 * x, 4);
      const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(bytes));
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[x])));
    }
    alignas(16) int32_t a[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(a), acc);
    for (int x = vec; x < n; ++x) {
      a[0] += p[3 * x] * k[x];
      a[1] += p[3 * x + 1] * k[x];
      a[2] += p[3 * x + 2] * k[x];
    }
    out[3 * xx] = clip8(a[0]);
    out[3 * xx + 1] = clip8(a[1]);
    out[3 * xx + 2] = clip8(a[2]);
  }
}

bool have_sse41() {
  static const bool yes = __builtin_cpu_supports("sse4.1");
  return yes;
}
#else
bool have_sse41() { return false; }
#endif

// One output row of the vertical pass into `acc` (started at half a unit): n input rows `stride` apart.
// Compiled for AVX2 too (picked at run time), where the compiler vectorises the 32-bit products.
#if WB_PIL_RESIZE_SSE41
__attribute__((target_clones("avx2", "default")))
#endif
void vertical_row(const uint8_t* rows, std::size_t stride, const int32_t* k, int n, std::size_t len, int32_t* acc) {
  for (std::size_t i = 0; i < len; ++i) acc[i] = 1 << (kPilPrecisionBits - 1);
  for (int y = 0; y < n; ++y) {
    const uint8_t* row = rows + static_cast<std::size_t>(y) * stride;
    const int32_t w = k[y];
    for (std::size_t i = 0; i < len; ++i) acc[i] += row[i] * w;
  }
}

const PilAxis& cached_axis(PilAxis& axis, int& have_in, int& have_out, int in, int out) {
  if (have_in != in || have_out != out) {
    axis = pil_bilinear_axis(in, out);
    have_in = in;
    have_out = out;
  }
  return axis;
}

}  // namespace

PilAxis pil_bilinear_axis(int in_size, int out_size) {
  if (in_size < 1 || out_size < 1) {
    throw DataError("resize: " + std::to_string(in_size) + " -> " + std::to_string(out_size) + " pixels, expected >= 1");
  }
  PilAxis a;
  const double scale = static_cast<double>(in_size) / out_size;  // (in1 - in0) / outSize with box (0, in)
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  a.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  a.first.resize(static_cast<std::size_t>(out_size));
  a.count.resize(static_cast<std::size_t>(out_size));
  a.weights.assign(static_cast<std::size_t>(out_size) * static_cast<std::size_t>(a.ksize), 0);
  std::vector<double> k(static_cast<std::size_t>(a.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = 0.0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = triangle((x + xmin - center + 0.5) * ss);
      k[static_cast<std::size_t>(x)] = w;
      ww += w;
    }
    int32_t* out = &a.weights[static_cast<std::size_t>(xx) * static_cast<std::size_t>(a.ksize)];
    for (int x = 0; x < xmax; ++x) {
      double v = k[static_cast<std::size_t>(x)];
      if (ww != 0.0) v /= ww;
      out[x] = v < 0 ? static_cast<int32_t>(-0.5 + v * (1 << kPilPrecisionBits))
                     : static_cast<int32_t>(0.5 + v * (1 << kPilPrecisionBits));
    }
    a.first[static_cast<std::size_t>(xx)] = xmin;
    a.count[static_cast<std::size_t>(xx)] = xmax;
  }
  return a;
}

namespace {

void check_window(const PixelWindow& win, int out_w, int out_h) {
  if (win.width < 1 || win.height < 1 || win.x < 0 || win.y < 0 || win.x + win.width > out_w ||
      win.y + win.height > out_h) {
    throw DataError("resize: window " + std::to_string(win.width) + "x" + std::to_string(win.height) + " at (" +
                    std::to_string(win.x) + ", " + std::to_string(win.y) + ") is outside the " +
                    std::to_string(out_w) + "x" + std::to_string(out_h) + " output");
  }
}

// The input range [first, end) one axis' outputs [o, o + n) read.
std::pair<int, int> taps_of(const PilAxis& a, int o, int n) {
  const auto last = static_cast<std::size_t>(o + n - 1);
  return {a.first[static_cast<std::size_t>(o)], a.first[last] + a.count[last]};
}

}  // namespace

PixelWindow pil_resize_source_window(int in_w, int in_h, int out_w, int out_h, const PixelWindow& win,
                                     PilResizeScratch& s) {
  check_window(win, out_w, out_h);
  PixelWindow src = win;
  if (out_w != in_w) {
    const auto [first, end] = taps_of(cached_axis(s.horizontal, s.h_in, s.h_out, in_w, out_w), win.x, win.width);
    src.x = first;
    src.width = end - first;
  }
  if (out_h != in_h) {
    const auto [first, end] = taps_of(cached_axis(s.vertical, s.v_in, s.v_out, in_h, out_h), win.y, win.height);
    src.y = first;
    src.height = end - first;
  }
  return src;
}

void pil_resize_bilinear(const uint8_t* src, int src_stride, int in_w, int in_h, int out_w, int out_h,
                         const PixelWindow& win, uint8_t* dst, PilResizeScratch& s) {
  check_window(win, out_w, out_h);
  constexpr int c = 3;
  const bool need_h = out_w != in_w;
  const bool need_v = out_h != in_h;
  const std::size_t win_row = static_cast<std::size_t>(win.width) * c;

  // Rows of the (horizontally resampled) image the window's rows read.
  int row_first = win.y;
  int row_end = win.y + win.height;
  const PilAxis* v = nullptr;
  if (need_v) {
    v = &cached_axis(s.vertical, s.v_in, s.v_out, in_h, out_h);
    std::tie(row_first, row_end) = taps_of(*v, win.y, win.height);
  }

  // Horizontal pass over rows [row_first, row_end), window columns only, into temp (or straight to dst
  // when there is no vertical pass).
  const uint8_t* mid = src + static_cast<std::size_t>(row_first) * static_cast<std::size_t>(src_stride) +
                       static_cast<std::size_t>(win.x) * c;
  std::size_t mid_stride = static_cast<std::size_t>(src_stride);
  if (need_h) {
    const PilAxis& h = cached_axis(s.horizontal, s.h_in, s.h_out, in_w, out_w);
    const int rows = row_end - row_first;
    uint8_t* out_base = dst;
    if (need_v) {
      s.temp.resize(static_cast<std::size_t>(rows) * win_row);
      out_base = s.temp.data();
    }
    [[maybe_unused]] const bool simd = !s.scalar_only && have_sse41();
    for (int r = 0; r < rows; ++r) {
      const uint8_t* in = src + static_cast<std::size_t>(row_first + r) * static_cast<std::size_t>(src_stride);
      uint8_t* out = out_base + static_cast<std::size_t>(r) * win_row;
#if WB_PIL_RESIZE_SSE41
      if (simd) {
        horizontal_row_sse41(in, in_w, h, win.x, win.width, out);
        continue;
      }
#endif
      horizontal_row(in, h, win.x, win.width, out);
    }
    if (!need_v) return;
    mid = s.temp.data();
    mid_stride = win_row;
  }
  if (!need_v) {
    // Neither pass: a copy of the window.
    for (int r = 0; r < win.height; ++r) std::memcpy(dst + static_cast<std::size_t>(r) * win_row, mid + r * mid_stride, win_row);
    return;
  }
  // Vertical pass: `mid` row 0 is source row row_first.
  s.acc.resize(win_row);
  for (int yy = 0; yy < win.height; ++yy) {
    const auto oy = static_cast<std::size_t>(win.y + yy);
    const int32_t* k = &v->weights[oy * static_cast<std::size_t>(v->ksize)];
    const int first = v->first[oy] - row_first;
    const int n = v->count[oy];
    int32_t* acc = s.acc.data();
    vertical_row(mid + static_cast<std::size_t>(first) * mid_stride, mid_stride, k, n, win_row, acc);
    uint8_t* out = dst + static_cast<std::size_t>(yy) * win_row;
    for (std::size_t i = 0; i < win_row; ++i) out[i] = clip8(acc[i]);
  }
}

}  // namespace wb::data
