#include "common/cuda_version.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

TEST(CudaVersionTest, FromNvmlsInteger) {
  EXPECT_EQ(CudaVersion::FromInt(12040), (CudaVersion{12, 4}));
  EXPECT_EQ(CudaVersion::FromInt(13000), (CudaVersion{13, 0}));
  EXPECT_EQ(CudaVersion::FromInt(12080).ToString(), "12.8");
}

TEST(CudaVersionTest, ParsesMajorMinorAndIgnoresThePatch) {
  EXPECT_EQ(*ParseCudaVersion("13.2"), (CudaVersion{13, 2}));
  EXPECT_EQ(*ParseCudaVersion("12.8.1"), (CudaVersion{12, 8}));
}

TEST(CudaVersionTest, RejectsWhatIsNoVersion) {
  for (const char* text : {"", "13", "13.", ".2", "cu132", "13.x", "-1.2", "13.2 "}) {
    auto version = ParseCudaVersion(text);
    ASSERT_FALSE(version.ok()) << text;
    EXPECT_EQ(version.status().message(),
              std::string(text).insert(0, 1, '\'') +
                  "' is not a CUDA version (expected major.minor, e.g. 12.4)");
  }
}

TEST(CudaVersionTest, OrdersByMajorThenMinor) {
  EXPECT_LT((CudaVersion{12, 9}), (CudaVersion{13, 0}));
  EXPECT_LT((CudaVersion{13, 0}), (CudaVersion{13, 2}));
}

}  // namespace
}  // namespace llmctl
