// llm-train --probe's measurements: every rate it reports is measured (positive), its JSON reads
// back, and the CUDA path runs where LibTorch has a GPU (skipped, saying so, elsewhere). No test
// asserts a rate's size: that depends on the machine.
#include "trainer/train/rate_probe.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <set>
#include <string>

namespace llmctl::trainer {
namespace {

void ExpectEveryRateMeasured(const estimate::RateProbe& probe) {
  std::set<std::string> dtypes;
  for (const estimate::ProbedMatmul& m : probe.matmul) {
    EXPECT_GT(m.flops_per_s, 0) << m.dtype << " " << m.size;
    dtypes.insert(m.dtype);
  }
  EXPECT_EQ(dtypes, (std::set<std::string>{"fp32", "bf16", "fp16"}));
  ASSERT_EQ(probe.sdpa.size(), 3u);
  for (const estimate::ProbedAttention& a : probe.sdpa) EXPECT_GT(a.flops_per_s, 0) << a.dtype;
  EXPECT_GT(probe.memory_bytes_per_s, 0);
  EXPECT_GT(probe.launch_seconds, 0);
  EXPECT_GT(probe.host_adamw_values_per_s, 0);
  EXPECT_GT(probe.threads, 0);
  EXPECT_FALSE(probe.versions.libtorch.empty());
  StatusOr<estimate::RateProbe> back =
      estimate::RateProbe::FromJson(nlohmann::json::parse(probe.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
}

TEST(ProbeRatesTest, CpuMeasuresEveryRate) {
  StatusOr<estimate::RateProbe> probe =
      ProbeRates({.device = "cpu", .seconds_per_measurement = 0.01});
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  EXPECT_EQ(probe->device, "cpu");
  ExpectEveryRateMeasured(*probe);
  // fp32 and bf16 at each of a CPU micro-batch's token counts, the estimate's rates by tokens.
  for (const std::string dtype : {"fp32", "bf16"}) {
    std::set<int64_t> tokens;
    for (const estimate::ProbedMatmul& m : probe->matmul) {
      if (m.dtype == dtype && m.size == 256) tokens.insert(m.tokens);
    }
    EXPECT_EQ(tokens, (std::set<int64_t>{128, 256, 512})) << dtype;
  }
  // The host is the device: nothing to copy.
  EXPECT_EQ(probe->host_to_device_bytes_per_s, 0);
}

TEST(ProbeRatesTest, CudaMeasuresEveryRateAndTheHostLink) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: the probe's CUDA path is checked on a GPU machine";
  }
  StatusOr<estimate::RateProbe> probe =
      ProbeRates({.device = "cuda", .seconds_per_measurement = 0.01});
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  EXPECT_EQ(probe->device, "cuda");
  ExpectEveryRateMeasured(*probe);
  EXPECT_GT(probe->host_to_device_bytes_per_s, 0);
  EXPECT_GT(probe->device_to_host_bytes_per_s, 0);
}

TEST(ProbeRatesTest, RefusesAnUnknownDevice) {
  StatusOr<estimate::RateProbe> probe = ProbeRates({.device = "tpu"});
  ASSERT_FALSE(probe.ok());
  EXPECT_NE(probe.status().message().find("'tpu'"), std::string::npos);
}

}  // namespace
}  // namespace llmctl::trainer
