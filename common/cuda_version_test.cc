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

NodeCuda ChameleonNode() {
  // CC-Ubuntu24.04-CUDA's nvidia-driver-560 and the pinned PyPI wheel (torch 2.15.0+cu132).
  return {.node = "n1",
          .gpus = 4,
          .driver = "560.35.03",
          .driver_cuda = "12.6",
          .libtorch = "2.15.0",
          .libtorch_cuda = "13.2"};
}

TEST(CheckDriverRunsLibTorchTest, DriverOfAnOlderCudaMajorIsOneClearMessage) {
  const Status status = CheckDriverRunsLibTorch(ChameleonNode());
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "node n1: NVIDIA driver 560.35.03 supports CUDA up to 12.6, but llm-train's LibTorch "
            "2.15.0 was built for CUDA 13.2: use an image whose NVIDIA driver supports CUDA 13 "
            "(driver >= 580.65.06), or an llm-train built with a LibTorch for CUDA 12.x");
}

TEST(CheckDriverRunsLibTorchTest, SameMajorRunsThroughMinorVersionCompatibility) {
  NodeCuda node = ChameleonNode();
  node.driver = "580.65.06";
  node.driver_cuda = "13.0";
  EXPECT_TRUE(CheckDriverRunsLibTorch(node).ok());
  node.driver_cuda = "13.2";
  EXPECT_TRUE(CheckDriverRunsLibTorch(node).ok());
  node = ChameleonNode();
  node.libtorch_cuda = "12.8";  // a cu128 wheel on the 12.6 driver
  EXPECT_TRUE(CheckDriverRunsLibTorch(node).ok());
}

TEST(CheckDriverRunsLibTorchTest, CpuNodesCpuBuildsAndMissingFactsAreFine) {
  NodeCuda node = ChameleonNode();
  node.gpus = 0;
  node.driver.clear();
  node.driver_cuda.clear();
  EXPECT_TRUE(CheckDriverRunsLibTorch(node).ok()) << "a CPU node with a CUDA LibTorch";
  node = ChameleonNode();
  node.libtorch_cuda.clear();
  EXPECT_TRUE(CheckDriverRunsLibTorch(node).ok()) << "a CPU build of LibTorch";
  node = ChameleonNode();
  node.driver_cuda.clear();
  EXPECT_TRUE(CheckDriverRunsLibTorch(node).ok()) << "an agent that does not report the driver";
}

TEST(CheckDriverRunsLibTorchTest, UnknownCudaMajorStillSaysWhatToChange) {
  NodeCuda node = ChameleonNode();
  node.libtorch_cuda = "14.0";
  node.driver_cuda = "13.0";
  const Status status = CheckDriverRunsLibTorch(node);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("use an image whose NVIDIA driver supports CUDA 14, or"),
            std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace llmctl
