#include "common/checked_math.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace llmctl {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(CheckedMathTest, ExactResultsOrNothing) {
  EXPECT_EQ(CheckedMul<int64_t>(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_EQ(CheckedMul<int64_t>(int64_t{1} << 32, int64_t{1} << 31), std::nullopt);
  EXPECT_EQ(CheckedAdd<int64_t>(kMax - 1, 1), kMax);
  EXPECT_EQ(CheckedAdd<int64_t>(kMax, 1), std::nullopt);
  EXPECT_EQ(CheckedMul<uint64_t>(uint64_t{1} << 63, 2), std::nullopt);
}

// The product that wrapped to 0 in issue 37 (2^32 x 2^32 x 1), and one whose partial product
// overflows although a later factor is 0.
TEST(CheckedMathTest, ProductsCheckEveryStep) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_EQ(CheckedProduct<int64_t>({big, big, 1}), std::nullopt);
  EXPECT_EQ(CheckedProduct<int64_t>({big, big, 0}), std::nullopt);
  EXPECT_EQ(CheckedProduct<int64_t>({1 << 20, 1 << 12, 1 << 16}), int64_t{1} << 48);
  EXPECT_EQ(CheckedProduct<int64_t>({}), 1);
}

TEST(CheckedMathTest, SaturatingKeepsAbsurdSizesAbsurd) {
  EXPECT_EQ(SaturatingMul<int64_t>(kMax, 2), kMax);
  EXPECT_EQ(SaturatingAdd<uint64_t>(std::numeric_limits<uint64_t>::max(), 1),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(SaturatingMul<int64_t>(3, 4), 12);
}

}  // namespace
}  // namespace llmctl
