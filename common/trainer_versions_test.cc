#include "common/trainer_versions.h"

#include <gtest/gtest.h>

#include <string>

namespace llmctl {
namespace {

TrainerVersions GpuTrainer() {
  return {.llmctl = "0.4.0",
          .libtorch = "2.15.0",
          .libtorch_cuda = "13.2",
          .cuda_devices = 1,
          .cuda_runtime = "13.0",
          .nvidia_driver = "580.95.05",
          .driver_cuda = "13.0",
          .cpu_threads = 16,
          .aten_cpu_capability = "AVX512",
          .onednn_isa_cap = "AVX2"};
}

TEST(TrainerVersionsTest, JsonRoundTrips) {
  auto parsed = ParseTrainerVersions(GpuTrainer().ToJson());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->ToJson(), GpuTrainer().ToJson());
  EXPECT_EQ(parsed->libtorch_cuda, "13.2");
  EXPECT_EQ(parsed->driver_cuda, "13.0");
  EXPECT_EQ(parsed->cuda_devices, 1);
  EXPECT_EQ(parsed->cpu_threads, 16);
  EXPECT_EQ(parsed->aten_cpu_capability, "AVX512");
  EXPECT_EQ(parsed->onednn_isa_cap, "AVX2");
}

// How LibTorch computes on the CPU, a rate probe's identity: the threads, ATen's kernels and
// oneDNN's cap when there is one.
TEST(TrainerVersionsTest, CpuKernelsSayTheThreadsAndTheVectorKernels) {
  TrainerVersions versions = GpuTrainer();
  EXPECT_EQ(versions.CpuKernels(), "16 threads, ATen AVX512, oneDNN at most AVX2");
  versions.cpu_threads = 1;
  versions.onednn_isa_cap.clear();
  EXPECT_EQ(versions.CpuKernels(), "1 thread, ATen AVX512");
  EXPECT_EQ(versions.CpuKernelsOrUnrecorded(), "1 thread, ATen AVX512");
  versions.cpu_threads = 0;  // an llm-train before 12-04
  EXPECT_EQ(versions.CpuKernels(), "");
  EXPECT_EQ(versions.CpuKernelsOrUnrecorded(), "threads and kernels not recorded");
}

// The first line is what llm-train --version printed before the other lines existed.
TEST(TrainerVersionsTest, TextKeepsTheSummaryLineFirst) {
  EXPECT_EQ(GpuTrainer().ToText(),
            "llm-train 0.4.0 (LibTorch 2.15.0, CUDA available)\n"
            "CPU: 16 threads, ATen AVX512, oneDNN at most AVX2\n"
            "LibTorch built for CUDA 13.2\n"
            "CUDA runtime 13.0, NVIDIA driver 580.95.05 (supports CUDA up to 13.0)\n");
  TrainerVersions cpu_machine = GpuTrainer();
  cpu_machine.cuda_devices = 0;
  cpu_machine.cuda_runtime.clear();
  cpu_machine.nvidia_driver.clear();
  cpu_machine.driver_cuda.clear();
  cpu_machine.cpu_threads = 0;
  EXPECT_EQ(cpu_machine.ToText(),
            "llm-train 0.4.0 (LibTorch 2.15.0, no CUDA device)\nLibTorch built for CUDA 13.2\n");
}

TEST(TrainerVersionsTest, OptionalFieldsDefault) {
  auto parsed = ParseTrainerVersions(R"({"llmctl": "0.4.0", "libtorch": "2.15.0"})");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->libtorch_cuda, "");
  EXPECT_EQ(parsed->cuda_devices, 0);
  EXPECT_EQ(parsed->cpu_threads, 0);
  EXPECT_EQ(parsed->onednn_isa_cap, "");
  EXPECT_EQ(parsed->CpuKernels(), "");
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
  for (const char* threads : {"1e30", "2.5", "\"2\"", "-1", "18446744073709551615"}) {
    EXPECT_EQ(
        ParseTrainerVersions(std::string(R"({"llmctl": "0", "libtorch": "2", "cpu_threads": )") +
                             threads + "}")
            .status()
            .message(),
        "llm-train --version --json: 'cpu_threads' is not a count")
        << threads;
  }
  EXPECT_EQ(ParseTrainerVersions(R"({"llmctl": "0", "libtorch": "2", "onednn_isa_cap": "\n"})")
                .status()
                .message(),
            "llm-train --version --json: 'onednn_isa_cap' holds a control character");
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
