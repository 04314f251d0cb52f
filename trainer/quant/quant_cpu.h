// CPU building blocks of the blockwise quantisation fast paths, shared by trainer/quant (weights)
// and the 8-bit AdamW kernel: the nearest code of a sorted table and one block's absmax scaling,
// with the same fp32 arithmetic as the device-generic ATen implementation, so both give the same
// bits.
#ifndef LLMCTL_TRAINER_QUANT_QUANT_CPU_H_
#define LLMCTL_TRAINER_QUANT_QUANT_CPU_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

namespace llmctl::trainer::quant_cpu {

// Nearest code of a sorted table of kCodes codes: the index is the number of midpoints between
// neighbouring codes below the value, so a value exactly on a midpoint takes the lower code and NaN
// the last, as torch.bucketize(right=False) on the same midpoints places them. A binary search
// costs ~8 dependent loads per value; instead the top 16 bits of the value (sign, exponent, 7
// mantissa bits) index a table of the count at the bucket's lowest value, and the few midpoints
// that can lie inside a bucket (at most span_, ~2 for the dynamic maps) are compared directly.
template <int kCodes>
class NearestCode {
  static_assert(kCodes >= 2 && kCodes <= 256, "codes must fit a uint8_t index");

 public:
  explicit NearestCode(const float* codes) {
    // (a + b) / 2 in fp32, as the ATen path computes the midpoints; +inf pads the comparisons
    // that run past the last one.
    midpoints_.fill(INFINITY);
    for (int i = 0; i + 1 < kCodes; ++i) midpoints_[i] = (codes[i] + codes[i + 1]) / 2.0f;
    for (uint32_t key = 0; key < kKeys; ++key) {
      const uint32_t first = key << kShift;
      const uint32_t last = first | ((1u << kShift) - 1);
      // Positive buckets grow with the bits, negative ones shrink; inf/NaN bits bound as
      // infinities.
      const bool negative = (key & (kKeys >> 1)) != 0;
      const float low = Bound(negative ? last : first);
      const float high = Bound(negative ? first : last);
      start_[key] = static_cast<uint8_t>(Count(low));
      span_ = std::max(span_, Count(high) - Count(low));
    }
  }

  uint8_t operator()(float x) const {
    if (std::isnan(x)) return kCodes - 1;
    const int start = start_[std::bit_cast<uint32_t>(x) >> kShift];
    int index = start;
    for (int k = 0; k < span_; ++k) index += midpoints_[start + k] < x ? 1 : 0;
    return static_cast<uint8_t>(index);
  }

 private:
  static constexpr int kShift = 16;
  static constexpr uint32_t kKeys = uint32_t{1} << (32 - kShift);

  static float Bound(uint32_t bits) {
    const float x = std::bit_cast<float>(bits);
    return std::isnan(x) ? std::copysign(INFINITY, x) : x;
  }

  // Midpoints below x (x not NaN).
  int Count(float x) const {
    return static_cast<int>(
        std::lower_bound(midpoints_.begin(), midpoints_.begin() + kCodes - 1, x) -
        midpoints_.begin());
  }

  std::array<float, 2 * kCodes> midpoints_;
  std::array<uint8_t, kKeys> start_;
  int span_ = 0;
};

// Shared instances for bitsandbytes' two dynamic maps (DynamicMap(is_signed)), built on first use:
// building the table costs ~1 ms.
const NearestCode<256>& DynamicMapNearest(bool is_signed);

// max |x| over a block, NaN if any element is NaN (as amax propagates it).
template <typename T>
float BlockAbsmax(const T* x, int64_t len) {
  float absmax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < len; ++i) {
    const float a = std::abs(static_cast<float>(x[i]));
    absmax = std::max(absmax, a);
    nan |= std::isnan(a);
  }
  return nan ? NAN : absmax;
}

// One block scaled to [-1, 1] exactly as bitsandbytes' quantisation kernels round it: a full block
// is multiplied by the reciprocal of its absmax clamped to 1e-38 (so an all-zero block gives 0, not
// NaN) and stores the absmax itself; a short tail block is divided by the clamped absmax, which is
// also what it stores. Calls emit(i, code) for each element; returns the absmax to store.
template <typename T, typename Nearest, typename Emit>
float QuantizeBlock(const T* x, int64_t len, bool full, const Nearest& nearest, Emit emit) {
  const float absmax = BlockAbsmax(x, len);
  // std::max keeps a NaN absmax, as clamp_min does.
  const float clamped = std::max(absmax, static_cast<float>(1e-38));
  if (full) {
    const float reciprocal = 1.0f / clamped;
    for (int64_t i = 0; i < len; ++i)
      emit(i, nearest(std::clamp(static_cast<float>(x[i]) * reciprocal, -1.0f, 1.0f)));
    return absmax;
  }
  for (int64_t i = 0; i < len; ++i)
    emit(i, nearest(std::clamp(static_cast<float>(x[i]) / clamped, -1.0f, 1.0f)));
  return clamped;
}

}  // namespace llmctl::trainer::quant_cpu

#endif  // LLMCTL_TRAINER_QUANT_QUANT_CPU_H_
