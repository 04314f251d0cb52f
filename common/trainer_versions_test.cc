#include "common/trainer_versions.h"

#include <gtest/gtest.h>

namespace llmctl {
namespace {

TrainerVersions GpuTrainer() {
  return {.llmctl = "0.4.0",
          .libtorch = "2.15.0",
          .libtorch_cuda = "13.2",
          .cuda_devices = 1,
          .cuda_runtime = "13.0",
          .nvidia_driver = "580.95.05",
          .driver_cuda = "13.0"};
}

TEST(TrainerVersionsTest, JsonRoundTrips) {
  auto parsed = ParseTrainerVersions(GpuTrainer().ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->ToJson(), GpuTrainer().ToJson());
  EXPECT_EQ(parsed->libtorch_cuda, "13.2");
  EXPECT_EQ(parsed->driver_cuda, "13.0");
  EXPECT_EQ(parsed->cuda_devices, 1);
}

// The first line is what llm-train --version printed before the other lines existed.
TEST(TrainerVersionsTest, TextKeepsTheSummaryLineFirst) {
  EXPECT_EQ(GpuTrainer().ToText(),
            "llm-train 0.4.0 (LibTorch 2.15.0, CUDA available)\n"
            "LibTorch built for CUDA 13.2\n"
            "CUDA runtime 13.0, NVIDIA driver 580.95.05 (supports CUDA up to 13.0)\n");
  TrainerVersions cpu_machine = GpuTrainer();
  cpu_machine.cuda_devices = 0;
  cpu_machine.cuda_runtime.clear();
  cpu_machine.nvidia_driver.clear();
  cpu_machine.driver_cuda.clear();
  EXPECT_EQ(cpu_machine.ToText(),
            "llm-train 0.4.0 (LibTorch 2.15.0, no CUDA device)\nLibTorch built for CUDA 13.2\n");
}

TEST(TrainerVersionsTest, OptionalFieldsDefault) {
  auto parsed = ParseTrainerVersions(R"({"llmctl": "0.4.0", "libtorch": "2.15.0"})");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->libtorch_cuda, "");
  EXPECT_EQ(parsed->cuda_devices, 0);
}

TEST(TrainerVersionsTest, RejectsWhatIsNotTheReport) {
  EXPECT_EQ(
      ParseTrainerVersions("llm-train 0.4.0 (LibTorch 2.15.0, no CUDA device)").status().message(),
      "llm-train --version --json: not a JSON object: 'llm-train 0.4.0 (LibTorch 2.15.0, no "
      "CUDA device)'");
  EXPECT_EQ(ParseTrainerVersions(R"({"llmctl": "0.4.0"})").status().message(),
            "llm-train --version --json: 'libtorch' is missing");
  EXPECT_EQ(ParseTrainerVersions(R"({"llmctl": "0.4.0", "libtorch": 2})").status().message(),
            "llm-train --version --json: 'libtorch' is not a string");
  EXPECT_EQ(ParseTrainerVersions(R"({"llmctl": "0", "libtorch": "2", "cuda_devices": -1})")
                .status()
                .message(),
            "llm-train --version --json: 'cuda_devices' is not a count");
}

// `llmctl nodes`, estimate and plan print the versions: a trainer's (or a probe file's) that
// would move the cursor, forge a line or fill the screen is refused, and so is what is not JSON
// shown without its controls.
TEST(TrainerVersionsTest, RejectsVersionsThatAreNotPrintable) {
  EXPECT_EQ(
      ParseTrainerVersions(R"({"llmctl": "0.4.0", "libtorch": "2.15.0\u001b]0;T\u0007\r\nFORGED"})")
          .status()
          .message(),
      "llm-train --version --json: 'libtorch' holds a control character");
  EXPECT_EQ(
      ParseTrainerVersions(R"({"llmctl": "0.4.0", "libtorch": "2", "nvidia_driver": "5\u202e8"})")
          .status()
          .message(),
      "llm-train --version --json: 'nvidia_driver' holds a bidirectional text control");
  EXPECT_EQ(
      ParseTrainerVersions(R"({"llmctl": "0.4.0", "libtorch": ")" + std::string(65, '2') + "\"}")
          .status()
          .message(),
      "llm-train --version --json: 'libtorch' longer than 64 bytes");
  EXPECT_EQ(ParseTrainerVersions("oops\x1b[2J\nFORGED").status().message(),
            "llm-train --version --json: not a JSON object: 'oops [2J FORGED'");
}

}  // namespace
}  // namespace llmctl
