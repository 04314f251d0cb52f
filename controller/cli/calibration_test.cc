#include "controller/cli/calibration.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace llmctl::cli {
namespace {

estimate::StepWork Work(estimate::MatmulClass matmul_class) {
  estimate::StepWork work;
  work.matmul_class = matmul_class;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.matmul_flops = 1e12;
  work.memory_bytes = 1e9;
  work.launches = 1000;
  return work;
}

// A stored run of `work` on `device` that took `factor` times its nominal time.
store::TimedRun StoredRun(const estimate::StepWork& work, const estimate::DeviceSpeed& device,
                          double factor) {
  const double seconds = factor * estimate::NominalStepSeconds(work, device).calibrated;
  const nlohmann::json prediction = {
      {"peak_bytes", 1}, {"time_device", device.name}, {"work", work.ToJson()}};
  return {.prediction_json = prediction.dump(),
          .seconds_per_token = seconds / static_cast<double>(work.tokens),
          .steps = 3};
}

TEST(StoredCalibrationsTest, EachDeviceIsCalibratedFromItsOwnRuns) {
  const estimate::DeviceSpeed cpu = estimate::CpuSpeed();
  const estimate::DeviceSpeed a100 = estimate::GpuSpeed(*estimate::GpuNamed("a100-80gb"));
  const StoredCalibrations calibrations = StoredCalibrations::FromRuns(
      {StoredRun(Work(estimate::MatmulClass::kFp32), cpu, 2.0),
       StoredRun(Work(estimate::MatmulClass::kFp32), cpu, 4.0),
       StoredRun(Work(estimate::MatmulClass::kBf16), cpu, 1.5),
       // Not calibration material: no work stored with it, or a broken prediction.
       {.prediction_json = R"({"peak_bytes":1,"time_device":"cpu"})",
        .seconds_per_token = 1,
        .steps = 1},
       {.prediction_json = "not json", .seconds_per_token = 1, .steps = 1},
       // Issue 37: a non-finite number was stored as null; reading one threw.
       {.prediction_json = R"({"peak_bytes":1,"time_device":null,"work":{}})",
        .seconds_per_token = 1,
        .steps = 1},
       {.prediction_json = nlohmann::json{{"time_device", "cpu"},
                                          {"work", nlohmann::json{{"matmul_flops", nullptr}}}}
                               .dump(),
        .seconds_per_token = 1,
        .steps = 1}},
      "the local store (test)");
  const estimate::Calibration c = calibrations.For(cpu, estimate::ModelFamily::kLlama);
  EXPECT_DOUBLE_EQ(c.fp32_factor, 3.0);  // the median of 2 and 4
  EXPECT_DOUBLE_EQ(c.bf16_factor, 1.5);
  EXPECT_EQ(c.runs(), 3);
  EXPECT_EQ(c.source, "3 measured llama runs on cpu (1 bf16, 2 fp32) in the local store (test)");
  // No run on the A100, and no BLIP-2 run at all: the built-in calibrations.
  EXPECT_EQ(calibrations.For(a100, estimate::ModelFamily::kLlama).source,
            estimate::DefaultCalibration(a100, estimate::ModelFamily::kLlama).source);
  EXPECT_EQ(calibrations.For(cpu, estimate::ModelFamily::kBlip2).source,
            estimate::DefaultCalibration(cpu, estimate::ModelFamily::kBlip2).source);
}

// A stored run's pace reaches the calibration only as a canary's seconds: another process's
// figure outside them counts the run as measured, at no pace.
TEST(StoredCalibrationsTest, ARunsPaceCountsOnlyAsACanarysSeconds) {
  estimate::DeviceSpeed cpu = estimate::CpuSpeed();
  cpu.pace_seconds = 0.003;
  store::TimedRun paced = StoredRun(Work(estimate::MatmulClass::kFp32), cpu, 2.0);
  paced.pace_seconds = 0.002;
  store::TimedRun hostile = StoredRun(Work(estimate::MatmulClass::kBf16), cpu, 2.0);
  hostile.pace_seconds = 1e-300;
  const StoredCalibrations calibrations =
      StoredCalibrations::FromRuns({paced, hostile}, "the local store (test)");
  const estimate::Calibration c = calibrations.For(cpu, estimate::ModelFamily::kLlama);
  EXPECT_DOUBLE_EQ(c.fp32_factor, 3.0);  // 2x its nominal time at 2 ms, 3x at the probe's 3
  EXPECT_DOUBLE_EQ(c.bf16_factor, 2.0);
  EXPECT_EQ(c.paced_runs, 1);
  EXPECT_DOUBLE_EQ(c.pace, 1.5);  // the hostile run's pace is none
}

}  // namespace
}  // namespace llmctl::cli
