#include "common/image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace llmctl::image {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Resample.c's PRECISION_BITS
constexpr double kBicubicSupport = 2.0;

double Bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// One axis' taps: for each output index, the first input index, the count, and `taps` fixed-point
// weights (Resample.c's precompute_coeffs and normalize_coeffs_8bpc).
struct Taps {
  int taps = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;  // (out, taps)
};

Taps ComputeTaps(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = kBicubicSupport * filter_scale;
  Taps t;
  t.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weights.assign(static_cast<size_t>(out_size) * t.taps, 0);
  std::vector<double> w(t.taps);
  for (int out = 0; out < out_size; ++out) {
    const double center = (out + 0.5) * scale;
    const double ss = 1.0 / filter_scale;
    // (int) truncates toward zero, as C's cast does in Resample.c.
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), in_size) - xmin;
    double sum = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = Bicubic((x + xmin - center + 0.5) * ss);
      sum += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double normalised = sum != 0.0 ? w[x] / sum : w[x];
      const double fixed = normalised * (1 << kPrecisionBits);
      t.weights[static_cast<size_t>(out) * t.taps + x] =
          static_cast<int32_t>(normalised < 0 ? std::trunc(-0.5 + fixed) : std::trunc(0.5 + fixed));
    }
    t.first[out] = xmin;
    t.count[out] = xmax;
  }
  return t;
}

uint8_t Clip8(int32_t fixed) {
  return static_cast<uint8_t>(std::clamp(fixed >> kPrecisionBits, 0, 255));
}

// Resamples along x (stride 3 between neighbours) or y (stride 3 * width).
RgbImage Horizontal(const RgbImage& in, int width) {
  const Taps t = ComputeTaps(in.width, width);
  RgbImage out{width, in.height, std::vector<uint8_t>(static_cast<size_t>(width) * in.height * 3)};
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* row = in.pixels.data() + static_cast<size_t>(y) * in.width * 3;
    for (int x = 0; x < width; ++x) {
      const int32_t* k = t.weights.data() + static_cast<size_t>(x) * t.taps;
      for (int c = 0; c < 3; ++c) {
        int32_t sum = 1 << (kPrecisionBits - 1);
        for (int i = 0; i < t.count[x]; ++i) sum += row[(t.first[x] + i) * 3 + c] * k[i];
        out.pixels[(static_cast<size_t>(y) * width + x) * 3 + c] = Clip8(sum);
      }
    }
  }
  return out;
}

RgbImage Vertical(const RgbImage& in, int height) {
  const Taps t = ComputeTaps(in.height, height);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  RgbImage out{in.width, height, std::vector<uint8_t>(stride * height)};
  for (int y = 0; y < height; ++y) {
    const int32_t* k = t.weights.data() + static_cast<size_t>(y) * t.taps;
    for (size_t xc = 0; xc < stride; ++xc) {
      int32_t sum = 1 << (kPrecisionBits - 1);
      for (int i = 0; i < t.count[y]; ++i) sum += in.pixels[(t.first[y] + i) * stride + xc] * k[i];
      out.pixels[y * stride + xc] = Clip8(sum);
    }
  }
  return out;
}

}  // namespace

RgbImage ResizeBicubic(const RgbImage& image, int width, int height) {
  // PIL skips a pass whose size does not change (ImagingResampleInner's need_horizontal/vertical).
  RgbImage out = image.width != width ? Horizontal(image, width) : image;
  if (out.height != height) out = Vertical(out, height);
  return out;
}

std::vector<float> NormalizedPixels(const RgbImage& image, const std::array<float, 3>& mean,
                                    const std::array<float, 3>& std) {
  const size_t plane = static_cast<size_t>(image.width) * image.height;
  std::vector<float> out(plane * 3);
  for (size_t i = 0; i < plane; ++i) {
    for (int c = 0; c < 3; ++c) {
      const float rescaled = static_cast<float>(image.pixels[i * 3 + c] * (1.0 / 255.0));
      out[c * plane + i] = (rescaled - mean[c]) / std[c];
    }
  }
  return out;
}

}  // namespace llmctl::image
