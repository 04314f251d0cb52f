#include "common/estimate/step_time.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/estimate/step_work_test_support.h"
#include "common/estimate/trainer_runs.h"

namespace llmctl::estimate {
namespace {

using nlohmann::json;
using test_support::SmallConfig;
using test_support::SmallModel;
using testing::Case;
using testing::LoadCase;
using testing::SourceDir;

TEST(DeviceSpeedTest, NodesDeviceNamesMapToTheTable) {
  EXPECT_EQ(GpuOfDeviceName("NVIDIA H100 NVL")->name, "h100-94gb");
  EXPECT_EQ(GpuOfDeviceName("NVIDIA H100 80GB HBM3")->name, "h100-80gb");
  EXPECT_EQ(GpuOfDeviceName("NVIDIA H200")->name, "h200-141gb");
  EXPECT_EQ(GpuOfDeviceName("NVIDIA A100-SXM4-80GB")->name, "a100-80gb");
  EXPECT_EQ(GpuOfDeviceName("NVIDIA A100 80GB PCIe")->name, "a100-80gb");
  EXPECT_EQ(GpuOfDeviceName("NVIDIA A100-PCIE-40GB")->name, "a100-40gb");
  EXPECT_EQ(GpuOfDeviceName("Tesla V100-SXM2-32GB")->name, "v100-32gb");
  EXPECT_EQ(GpuOfDeviceName("Quadro RTX 6000")->name, "rtx6000-24gb");
  EXPECT_FALSE(GpuOfDeviceName("AMD EPYC 9454P 48-Core Processor").has_value());
}

TEST(CalibrationTest, TakesTheMedianRatioPerClassAndFallsBackToTheOther) {
  const DeviceSpeed device = GpuSpeed(*GpuNamed("a100-80gb"));
  StatusOr<StepWork> work =
      EstimateStepWork(SmallConfig({{"precision", "bf16-true"}}), SmallModel());
  ASSERT_TRUE(work.ok());
  const double nominal_per_token =
      NominalStepSeconds(*work, device).calibrated / static_cast<double>(work->tokens);
  std::vector<MeasuredRun> runs;
  for (double ratio : {2.0, 3.0, 10.0}) runs.push_back({*work, ratio * nominal_per_token});
  // Times no step of this work takes on this device (another process's error) are left out.
  for (double ratio : {kMinMeasuredFactor / 2, kMaxMeasuredFactor * 2, 1e300}) {
    runs.push_back({*work, ratio * nominal_per_token});
  }
  const Calibration c = Calibrate(device, ModelFamily::kLlama, runs);
  EXPECT_DOUBLE_EQ(c.bf16_factor, 3.0);
  EXPECT_DOUBLE_EQ(c.fp32_factor, 3.0);  // no fp32 run: the bf16 runs' factor
  EXPECT_EQ(c.bf16_runs, 3);
  EXPECT_EQ(c.fp32_runs, 0);
  const TimeEstimate e = EstimateTime(*work, device, c, 10);
  EXPECT_EQ(NominalStepSeconds(*work, device).fixed, 0);
  EXPECT_NEAR(e.step_seconds, 3 * NominalStepSeconds(*work, device).calibrated, 1e-12);
  EXPECT_NEAR(e.tokens_per_second * e.step_seconds, static_cast<double>(work->tokens), 1e-6);
  EXPECT_DOUBLE_EQ(e.trial_seconds, e.startup_seconds + 10 * e.step_seconds);
  // Without runs, the built-in calibration.
  EXPECT_EQ(Calibrate(device, ModelFamily::kLlama, {}).source,
            DefaultCalibration(device, ModelFamily::kLlama).source);
}

// A run with a pace counts at the probe's: its measured time times the probe's pace seconds over
// its own. A run measured while the machine ran 1.5x as fast as when probed (its canary 2 ms where
// the probe's took 3) sets the factor its time would have at the probe's pace, and the machine's
// usual pace, 1.5, times every term of a step 1.5x as fast; one without a pace, or on a device
// whose probe has none, counts as measured, at pace 1.
TEST(CalibrationTest, ARunWithAPaceCountsAtTheProbesPace) {
  DeviceSpeed device = GpuSpeed(*GpuNamed("a100-80gb"));
  StatusOr<StepWork> work =
      EstimateStepWork(SmallConfig({{"precision", "bf16-true"}}), SmallModel());
  ASSERT_TRUE(work.ok());
  const double nominal_per_token =
      NominalStepSeconds(*work, device).calibrated / static_cast<double>(work->tokens);
  const std::vector<MeasuredRun> runs = {
      {.work = *work, .seconds_per_token = 2 * nominal_per_token, .pace_seconds = 0.002}};
  device.pace_seconds = 0.003;
  Calibration c = Calibrate(device, ModelFamily::kLlama, runs);
  EXPECT_DOUBLE_EQ(c.bf16_factor, 3.0);
  EXPECT_EQ(c.paced_runs, 1);
  EXPECT_DOUBLE_EQ(c.pace, 1.5);
  EXPECT_NE(c.source.find("(1 bf16, 0 fp32, 1 at the probe's pace); the machine at 1.50 of its "
                          "probe's pace over 1 run"),
            std::string::npos)
      << c.source;
  const TimeEstimate paced = EstimateTime(*work, device, c, 10);
  Calibration unpaced = c;
  unpaced.pace = 1;
  const TimeEstimate at_probe = EstimateTime(*work, device, unpaced, 10);
  EXPECT_NEAR(paced.step_seconds * 1.5, at_probe.step_seconds, 1e-12);
  EXPECT_EQ(paced.pace, 1.5);
  // A family without runs of its own keeps the default factors, at the machine's usual pace.
  const Calibration blip2 = Calibrate(device, ModelFamily::kBlip2, runs);
  EXPECT_EQ(blip2.runs(), 0);
  EXPECT_DOUBLE_EQ(blip2.pace, 1.5);
  device.pace_seconds = 0;
  c = Calibrate(device, ModelFamily::kLlama, runs);
  EXPECT_DOUBLE_EQ(c.bf16_factor, 2.0);
  EXPECT_EQ(c.paced_runs, 0);
  EXPECT_EQ(c.pace, 1);
  EXPECT_NE(c.source.find("(1 bf16, 0 fp32)"), std::string::npos) << c.source;
  EXPECT_EQ(c.source.find("the machine at"), std::string::npos) << c.source;
}

// Where the device has element-wise rates, a LLaMA run whose work says no tensor size (stored
// before 12-05, its memory traffic timed at the one memory rate) is left out of its calibration:
// its factor scales another nominal time. A BLIP-2 run's work never says one, and counts.
TEST(CalibrationTest, LeavesOutLlamaRunsStoredBeforeElementwiseRates) {
  DeviceSpeed device = CpuSpeed();
  device.fp32_elementwise = {{.tensor_bytes = 1 << 20, .bytes_per_s = 1.5e11}};
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({}), SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  ASSERT_GT(work->elementwise_tensor_bytes, 0);
  const double per_token =
      NominalStepSeconds(*work, device).calibrated / static_cast<double>(work->tokens);
  StepWork stored_before = *work;
  stored_before.elementwise_tensor_bytes = 0;
  const std::vector<MeasuredRun> runs = {{*work, 2 * per_token}, {stored_before, 5 * per_token}};
  Calibration c = Calibrate(device, ModelFamily::kLlama, runs);
  EXPECT_EQ(c.fp32_runs, 1);
  EXPECT_DOUBLE_EQ(c.fp32_factor, 2.0);
  // Without element-wise rates both count alike.
  device.fp32_elementwise.clear();
  c = Calibrate(device, ModelFamily::kLlama, runs);
  EXPECT_EQ(c.fp32_runs, 2);
}

// Likewise, where the device has rates for the layers' element-wise ops, a LLaMA run whose work
// says no layer bytes (stored before the sixty-third stop, 12-06) is left out.
TEST(CalibrationTest, LeavesOutLlamaRunsStoredBeforeLayerRates) {
  DeviceSpeed device = CpuSpeed();
  device.fp32_elementwise = {{.tensor_bytes = 1 << 20, .bytes_per_s = 1.5e11}};
  device.layer_elementwise = {{.tensor_bytes = 1 << 20, .bytes_per_s = 3e10}};
  StatusOr<StepWork> work = EstimateStepWork(SmallConfig({{"kernels", "aten"}}), SmallModel());
  ASSERT_TRUE(work.ok()) << work.status().message();
  ASSERT_GT(work->layer_memory_bytes, 0);
  // Twice its calibrated time: a factor of 2.
  const auto nominal = NominalStepSeconds(*work, device);
  const double per_token = nominal.calibrated / static_cast<double>(work->tokens);
  const double measured =
      (nominal.fixed + 2 * nominal.calibrated) / static_cast<double>(work->tokens);
  StepWork stored_before = *work;
  stored_before.layer_memory_bytes = 0;
  const std::vector<MeasuredRun> runs = {{*work, measured}, {stored_before, 5 * per_token}};
  Calibration c = Calibrate(device, ModelFamily::kLlama, runs);
  EXPECT_EQ(c.fp32_runs, 1);
  EXPECT_DOUBLE_EQ(c.fp32_factor, 2.0);
  device.layer_elementwise.clear();
  c = Calibrate(device, ModelFamily::kLlama, runs);
  EXPECT_EQ(c.fp32_runs, 2);
}

// The 11-26 H200 run's finished rows (docs/gpu-runs/2026-11-26-h200/lab.jsonl), each the trial of
// experiments/single-llama-a100.yaml it ran, with its measured tokens/s.
struct H200Row {
  std::string trial;
  StepWork work;
  double tokens_per_second = 0;
};

std::vector<H200Row> H200Rows() {
  std::vector<H200Row> rows;
  std::ifstream in(SourceDir() + "/docs/gpu-runs/2026-11-26-h200/lab.jsonl");
  EXPECT_TRUE(in.good());
  for (std::string line; std::getline(in, line);) {
    const json row = json::parse(line);
    if (row["observed"] != "ok" || !row["tokens_per_second"].is_number()) continue;
    StatusOr<testing::CaseConfig> loaded =
        LoadCase(Case{"single-llama-a100.yaml", row["trial"].get<std::string>(), {}}, {});
    EXPECT_TRUE(loaded.ok()) << loaded.status().message();
    if (!loaded.ok()) continue;
    StatusOr<StepWork> work = EstimateStepWork(loaded->config, loaded->model);
    EXPECT_TRUE(work.ok()) << work.status().message();
    if (!work.ok()) continue;
    rows.push_back({row["trial"], *work, row["tokens_per_second"].get<double>()});
  }
  return rows;
}

// Issue 28's bar: each finished row predicted from the others alone (leave-one-out
// calibration from the data sheet's rates) within 20% of its measured tokens/s.
TEST(H200TimeTest, LeaveOneOutPredictsEveryFinishedRowWithinTwentyPercent) {
  const std::vector<H200Row> rows = H200Rows();
  ASSERT_EQ(rows.size(), 9u);
  const DeviceSpeed h200 = GpuSpeed(*GpuNamed("h200-141gb"));
  for (size_t left_out = 0; left_out < rows.size(); ++left_out) {
    std::vector<MeasuredRun> others;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i != left_out) others.push_back({rows[i].work, 1.0 / rows[i].tokens_per_second});
    }
    const Calibration c = Calibrate(h200, ModelFamily::kLlama, others);
    const TimeEstimate e = EstimateTime(rows[left_out].work, h200, c, 0);
    const double ratio = e.tokens_per_second / rows[left_out].tokens_per_second;
    std::printf("%-18s measured %8.0f tok/s, predicted %8.0f (%+.1f%%)\n",
                rows[left_out].trial.c_str(), rows[left_out].tokens_per_second, e.tokens_per_second,
                100 * (ratio - 1));
    EXPECT_GT(ratio, 0.8) << rows[left_out].trial;
    EXPECT_LT(ratio, 1.2) << rows[left_out].trial;
  }
}

// The built-in H200 calibration is the one all nine rows give.
TEST(H200TimeTest, BuiltInCalibrationIsTheRunsMedian) {
  const std::vector<H200Row> rows = H200Rows();
  const DeviceSpeed h200 = GpuSpeed(*GpuNamed("h200-141gb"));
  std::vector<MeasuredRun> runs;
  for (const H200Row& row : rows) runs.push_back({row.work, 1.0 / row.tokens_per_second});
  const Calibration measured = Calibrate(h200, ModelFamily::kLlama, runs);
  const Calibration built_in = DefaultCalibration(h200, ModelFamily::kLlama);
  std::printf("bf16 factor %.4f over %d runs, fp32 %.4f over %d\n", measured.bf16_factor,
              measured.bf16_runs, measured.fp32_factor, measured.fp32_runs);
  EXPECT_NEAR(built_in.bf16_factor / measured.bf16_factor, 1, 0.001);
  EXPECT_NEAR(built_in.fp32_factor / measured.fp32_factor, 1, 0.001);
}

}  // namespace
}  // namespace llmctl::estimate
