#include "common/median.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

// The middle of an odd count, the upper middle of an even one, in any order.
TEST(MedianTest, TakesTheUpperMiddleOfTheSortedValues) {
  EXPECT_EQ(Median({3.0}), 3.0);
  EXPECT_EQ(Median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(Median({4.0, 1.0, 3.0, 2.0}), 3.0);
  EXPECT_EQ(Median({2.0, 2.0, 9.0, 1.0, 2.0}), 2.0);
}

}  // namespace
}  // namespace llmctl
