#include "trainer/quant/aten_rounding.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

namespace llmctl::trainer::aten_rounding {
namespace {

// ATen's row_sum (aten/src/ATen/native/cpu/SumKernel.cpp) of `size` items of kLanes consecutive
// floats, summed lane by lane: kIlp side-by-side accumulators whose partial sums cascade through
// kLevels levels every level_step rows, so only sums of similar size meet. Only fp32 additions, in
// a fixed order: nothing for the compiler to reassociate or contract.
template <int kLanes>
std::array<float, kLanes> AtenRowSum(const float* x, int64_t size) {
  using Lanes = std::array<float, kLanes>;
  constexpr int64_t kIlp = 4;
  constexpr int64_t kLevels = 4;
  const auto add = [](Lanes& acc, const float* item) {
    for (int l = 0; l < kLanes; ++l) acc[l] += item[l];
  };
  const auto item = [x](int64_t index) { return x + index * kLanes; };
  const int64_t rows = size / kIlp;
  // ATen's CeilLog2: 1 up to 2, else ceil(log2(rows)).
  const int64_t ceil_log2 = rows <= 2 ? 1 : std::bit_width(static_cast<uint64_t>(rows) - 1);
  const int64_t level_power = std::max<int64_t>(4, ceil_log2 / kLevels);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  std::array<std::array<Lanes, kIlp>, kLevels> acc{};
  int64_t i = 0;
  while (i + level_step <= rows) {
    for (int64_t j = 0; j < level_step; ++j, ++i) {
      for (int64_t k = 0; k < kIlp; ++k) add(acc[0][k], item(i * kIlp + k));
    }
    for (int64_t j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < kIlp; ++k) {
        add(acc[j][k], acc[j - 1][k].data());
        acc[j - 1][k] = Lanes{};
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < rows; ++i) {
    for (int64_t k = 0; k < kIlp; ++k) add(acc[0][k], item(i * kIlp + k));
  }
  for (int64_t j = 1; j < kLevels; ++j) {
    for (int64_t k = 0; k < kIlp; ++k) add(acc[0][k], acc[j][k].data());
  }
  Lanes sum = acc[0][0];
  for (int64_t index = rows * kIlp; index < size; ++index) add(sum, item(index));
  for (int64_t k = 1; k < kIlp; ++k) add(sum, acc[0][k].data());
  return sum;
}

}  // namespace

std::vector<float> LinspaceAsAvx2(float start, float end, int64_t steps) {
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  std::vector<float> out(steps);
  for (int64_t i = 0; i < steps; ++i) {
    out[i] = i < halfway ? std::fma(step, static_cast<float>(i), start)
                         : std::fma(-step, static_cast<float>(steps - 1 - i), end);
  }
  return out;
}

float MeanInAten8LaneOrder(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float sum = 0.0f;
  if (n < kLanes) {
    sum = AtenRowSum<1>(x, n)[0];
  } else {
    const int64_t vectors = n / kLanes;
    const std::array<float, kLanes> lanes = AtenRowSum<kLanes>(x, vectors);
    for (int64_t i = vectors * kLanes; i < n; ++i) sum += x[i];
    for (const float lane : lanes) sum += lane;
  }
  return sum / static_cast<float>(n);
}

}  // namespace llmctl::trainer::aten_rounding
