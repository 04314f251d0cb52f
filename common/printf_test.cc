#include "common/printf.h"

#include <gtest/gtest.h>

#include <string>

namespace llmctl {
namespace {

// A figure is printed whole, however long: a 64-byte buffer cut %f of 1e300 (301 digits) to a
// number many times smaller.
TEST(PrintfTest, AHugeFigureIsPrintedWhole) {
  const std::string huge = Printf("%.0f", 1e300);
  EXPECT_EQ(huge.size(), 301u);
  EXPECT_EQ(huge.substr(0, 4), "1000");
  EXPECT_EQ(Printf("%.2f s", 1.5), "1.50 s");
  EXPECT_EQ(SizedPrintf("%.*f", 1, 2.26), "2.3");
}

}  // namespace
}  // namespace llmctl
