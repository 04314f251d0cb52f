// The probe's JSON round-trips and is checked field by field, older versions read as what they
// measured (a fixed probe: rate_probe_test_support.h). The speed a probe gives:
// probed_speed_test.cc.
#include "common/estimate/rate_probe.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/estimate/rate_probe_test_support.h"
#include "common/estimate/reference_step.h"

namespace llmctl::estimate {
namespace {

using test_support::FixedProbe;
using test_support::FixedProbeWithReferenceSteps;

TEST(RateProbeTest, JsonRoundTrips) {
  RateProbe p = FixedProbeWithReferenceSteps();
  p.sdpa_partial_block = {{"fp32", 1.9e10, 65, 64}, {"bf16", 0.7e9, 65, 64}};
  StatusOr<RateProbe> back = RateProbe::FromJson(nlohmann::json::parse(p.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), p.ToJson());
  EXPECT_TRUE(back->SameIdentity(p));
  EXPECT_EQ(back->MatmulFlops("fp32", 512), 6e10);
  EXPECT_EQ(back->MatmulFlops("bf16", 1024), 1e9);  // the nearest size measured
  EXPECT_EQ(back->MatmulFlops("fp16", 512), 0);     // none measured
}

// Version 11's head cells round-trip and are refused by name when wrong; a version 10 probe, which
// had none, reads without them and gives its speed no head rates.
// Each edit of `good` is refused, the message naming its field.
using JsonEdit = std::pair<std::function<void(nlohmann::json&)>, std::string>;
void ExpectEachRefusedNaming(const nlohmann::json& good, const std::vector<JsonEdit>& edits) {
  for (const auto& [edit, field] : edits) {
    nlohmann::json bad = good;
    edit(bad);
    StatusOr<RateProbe> parsed = RateProbe::FromJson(bad);
    ASSERT_FALSE(parsed.ok()) << field;
    EXPECT_NE(parsed.status().message().find("'" + field + "'"), std::string::npos)
        << parsed.status().message();
  }
}

TEST(RateProbeTest, HeadCellsRoundTripAndAVersionTenProbeHasNone) {
  RateProbe p = FixedProbeWithReferenceSteps();
  p.head_matmul = {{"fp32", 256, 128, 16384, 9e10}, {"bf16", 256, 128, 16384, 5e10}};
  const nlohmann::json good = nlohmann::json::parse(p.ToJson().dump());
  StatusOr<RateProbe> back = RateProbe::FromJson(good);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), p.ToJson());
  ASSERT_EQ(back->HeadRates("fp32").size(), 1u);
  EXPECT_EQ(back->HeadRates("fp32")[0].rows, 256);
  EXPECT_EQ(back->HeadRates("fp32")[0].width, 128);
  EXPECT_EQ(back->HeadRates("fp32")[0].flops_per_s, 9e10);
  const DeviceSpeed speed = ProbedSpeed(CpuSpeed(), *back, "a probe");
  EXPECT_EQ(speed.fp32_head_flops_by_shape.size(), 1u);
  EXPECT_EQ(speed.bf16_head_flops_by_shape.size(), 1u);
  ExpectEachRefusedNaming(
      good,
      {{[](nlohmann::json& j) { j.erase("head_matmul"); }, "head_matmul"},
       {[](nlohmann::json& j) { j["head_matmul"][0]["hidden"] = 0; }, "head_matmul[0].hidden"},
       {[](nlohmann::json& j) { j["head_matmul"][1].erase("vocab"); }, "head_matmul[1].vocab"},
       {[](nlohmann::json& j) { j["head_matmul"][0]["dtype"] = "fp16"; }, "head_matmul[0].dtype"},
       {[](nlohmann::json& j) { j["head_matmul"][1]["flops_per_s"] = -1; },
        "head_matmul[1].flops_per_s"}});
  nlohmann::json ten = good;
  ten["version"] = 10;
  ten.erase("head_matmul");
  StatusOr<RateProbe> old = RateProbe::FromJson(ten);
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_TRUE(old->head_matmul.empty());
  EXPECT_FALSE(old->ToJson().contains("head_matmul"));
  EXPECT_TRUE(ProbedSpeed(CpuSpeed(), *old, "a version 10 probe").fp32_head_flops_by_shape.empty());
}

// The heads' buffers (version 13) round-trip; the speed takes each dtype's by vocabulary, each
// product's most over the hidden widths; a version 12 probe has none, which reads as not measured,
// and version 13 requires the list and every figure of each row.
TEST(RateProbeTest, HeadBuffersRoundTripAndTheSpeedTakesThemByVocabulary) {
  RateProbe p = FixedProbeWithReferenceSteps();
  p.head_matmul = {{"bf16", 256, 64, 16384, 5e10}, {"bf16", 256, 128, 16384, 6e10}};
  p.head_buffers = {{"fp32", 256, 64, 2048, 0, 0, 0},
                    {"bf16", 256, 64, 16384, 1'000'000, 2'000'000, 3'000'000},
                    {"bf16", 256, 128, 16384, 1'100'000, 1'900'000, 3'100'000},
                    {"bf16", 256, 64, 2048, 149'120, 329'344, 460'544}};
  const nlohmann::json good = nlohmann::json::parse(p.ToJson().dump());
  EXPECT_EQ(good["head_buffers"][3]["weight_gradient_bytes"], 460'544);
  StatusOr<RateProbe> back = RateProbe::FromJson(good);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), p.ToJson());
  const MatmulBuffers buffers = ProbedSpeed(CpuSpeed(), *back, "a probe").matmul_buffers;
  ASSERT_EQ(buffers.bf16.size(), 2u);
  EXPECT_EQ(buffers.bf16[0].vocab, 2048);
  EXPECT_EQ(buffers.bf16[0].weight_gradient, 460'544u);
  EXPECT_EQ(buffers.bf16[1].vocab, 16384);
  EXPECT_EQ(buffers.bf16[1].logits, 1'100'000u);
  EXPECT_EQ(buffers.bf16[1].input_gradient, 2'000'000u);
  EXPECT_EQ(buffers.bf16[1].weight_gradient, 3'100'000u);
  ASSERT_EQ(buffers.fp32.size(), 1u);
  EXPECT_EQ(buffers.fp32[0].weight_gradient, 0u);
  EXPECT_TRUE(CpuSpeed().matmul_buffers.bf16.empty());  // a data sheet knows none
  ExpectEachRefusedNaming(
      good,
      {{[](nlohmann::json& j) { j.erase("head_buffers"); }, "head_buffers"},
       {[](nlohmann::json& j) { j["head_buffers"][1].erase("logits_bytes"); },
        "head_buffers[1].logits_bytes"},
       {[](nlohmann::json& j) { j["head_buffers"][0]["input_gradient_bytes"] = -1; },
        "head_buffers[0].input_gradient_bytes"},
       {[](nlohmann::json& j) { j["head_buffers"][0]["weight_gradient_bytes"] = 1.5; },
        "head_buffers[0].weight_gradient_bytes"},
       {[](nlohmann::json& j) { j["head_buffers"][2]["logits_bytes"] = "450 KiB"; },
        "head_buffers[2].logits_bytes"},
       {[](nlohmann::json& j) { j["head_buffers"][2]["logits_bytes"] = 1e300; },
        "head_buffers[2].logits_bytes"},
       {[](nlohmann::json& j) { j["head_buffers"][2]["logits_bytes"] = (1ull << 40) + 1; },
        "head_buffers[2].logits_bytes"},
       {[](nlohmann::json& j) { j["head_buffers"][3]["vocab"] = 0; }, "head_buffers[3].vocab"},
       {[](nlohmann::json& j) { j["head_buffers"][3]["dtype"] = "fp16"; },
        "head_buffers[3].dtype"}});
  nlohmann::json twelve = good;
  twelve["version"] = 12;
  twelve.erase("head_buffers");
  StatusOr<RateProbe> old = RateProbe::FromJson(twelve);
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_TRUE(old->head_buffers.empty());
  EXPECT_TRUE(ProbedSpeed(CpuSpeed(), *old, "a version 12 probe").matmul_buffers.bf16.empty());
  EXPECT_FALSE(old->ToJson().contains("head_buffers"));
}

TEST(RateProbeTest, HowSteadyTheMachineWasRoundTripsAndIsNamedOnceItMatters) {
  RateProbe p = FixedProbeWithReferenceSteps();
  p.speed_spread = 0.04;
  StatusOr<RateProbe> back = RateProbe::FromJson(nlohmann::json::parse(p.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->speed_spread, 0.04);
  EXPECT_EQ(back->Summary(),
            "cpu AMD EPYC 7763 64-Core Processor (2 threads, LibTorch 2.9.1), "
            "2026-11-29T01:00:00Z");
  EXPECT_FALSE(back->WarnsOfItsMoment());
  p.speed_spread = 0.224;
  EXPECT_EQ(p.Summary(),
            "cpu AMD EPYC 7763 64-Core Processor (2 threads, LibTorch 2.9.1), "
            "2026-11-29T01:00:00Z, its speed moving 22% while measured");
  EXPECT_TRUE(p.WarnsOfItsMoment());
  // A version 8 probe did not measure it: none, and written back without it.
  nlohmann::json old = nlohmann::json::parse(p.ToJson().dump());
  old["version"] = 8;
  old.erase("speed_spread");
  StatusOr<RateProbe> eight = RateProbe::FromJson(old);
  ASSERT_TRUE(eight.ok()) << eight.status().message();
  EXPECT_FALSE(eight->speed_spread.has_value());
  EXPECT_FALSE(eight->ToJson().contains("speed_spread"));
  EXPECT_EQ(eight->Summary().find("speed"), std::string::npos);
}

// A probe's optional share `field` (JSON `key`): `value` kept through ToJson and FromJson; once
// reset, neither written nor read back, as in an older llm-train's probe.
void ExpectOptionalShareRoundTrips(std::optional<double> RateProbe::*field, const std::string& key,
                                   double value) {
  RateProbe p = FixedProbeWithReferenceSteps();
  p.*field = value;
  StatusOr<RateProbe> back = RateProbe::FromJson(nlohmann::json::parse(p.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ((*back).*field, value) << key;
  (p.*field).reset();
  EXPECT_FALSE(p.ToJson().contains(key));
  back = RateProbe::FromJson(nlohmann::json::parse(p.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(((*back).*field).has_value()) << key;
}

// What other processes took of the machine's CPU while it was probed: kept, and named once it is
// kBusyMachineShare or more; a probe without it (an older llm-train's) reads and writes none.
TEST(RateProbeTest, WhatOthersTookOfTheCpuRoundTripsAndIsNamedOnceItMatters) {
  ExpectOptionalShareRoundTrips(&RateProbe::others_cpu_share, "others_cpu_share", 0.03);
  RateProbe p = FixedProbeWithReferenceSteps();
  p.others_cpu_share = 0.03;
  EXPECT_EQ(p.Summary().find("other processes"), std::string::npos) << p.Summary();
  EXPECT_FALSE(p.WarnsOfItsMoment());
  p.others_cpu_share = 0.486;
  EXPECT_TRUE(p.WarnsOfItsMoment());
  EXPECT_EQ(p.Summary(),
            "cpu AMD EPYC 7763 64-Core Processor (2 threads, LibTorch 2.9.1), "
            "2026-11-29T01:00:00Z, other processes taking 49% of its CPU time meanwhile");
}

// The machine's pace as the probe measured it (version 20): kept through the JSON, and what the
// rates it makes carry; 0 or none (a GPU's probe, an older llm-train's) reads as none, and rates
// without it carry 0.
TEST(RateProbeTest, ThePaceRoundTripsAndTheRatesCarryIt) {
  RateProbe p = FixedProbeWithReferenceSteps();
  p.pace_seconds = 0.0011;
  StatusOr<RateProbe> back = RateProbe::FromJson(nlohmann::json::parse(p.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->pace_seconds, 0.0011);
  EXPECT_EQ(ProbedSpeed(CpuSpeed(), *back, "a probe").pace_seconds, 0.0011);
  nlohmann::json zero = nlohmann::json::parse(p.ToJson().dump());
  zero["pace_seconds"] = 0;
  back = RateProbe::FromJson(zero);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->pace_seconds.has_value());
  p.pace_seconds.reset();
  EXPECT_FALSE(p.ToJson().contains("pace_seconds"));
  back = RateProbe::FromJson(nlohmann::json::parse(p.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->pace_seconds.has_value());
  EXPECT_EQ(ProbedSpeed(CpuSpeed(), *back, "a probe").pace_seconds, 0);
}

// The kernel's share of the probe's own CPU time: kept, and named once it is
// kKernelShareWorthSaying or more, where a new length's measured cost runs high; a probe without it
// (an older llm-train's) reads and writes none.
TEST(RateProbeTest, TheKernelsShareOfTheProbeRoundTripsAndIsNamedOnceItMatters) {
  ExpectOptionalShareRoundTrips(&RateProbe::kernel_cpu_share, "kernel_cpu_share", 0.07);
  RateProbe p = FixedProbeWithReferenceSteps();
  p.kernel_cpu_share = 0.07;
  EXPECT_EQ(p.Summary().find("kernel"), std::string::npos) << p.Summary();
  EXPECT_FALSE(p.WarnsOfItsMoment());
  p.kernel_cpu_share = 0.274;
  EXPECT_TRUE(p.WarnsOfItsMoment());
  EXPECT_EQ(p.Summary(),
            "cpu AMD EPYC 7763 64-Core Processor (2 threads, LibTorch 2.9.1), "
            "2026-11-29T01:00:00Z, the kernel taking 27% of its CPU time (page faults: a new "
            "length's cost may read high)");
  // A GPU probe's says nothing of new lengths, which it does not measure: not named.
  RateProbe gpu = p;
  gpu.device = "cuda";
  EXPECT_EQ(gpu.Summary().find("kernel"), std::string::npos) << gpu.Summary();
  EXPECT_FALSE(gpu.WarnsOfItsMoment());
}

// The median over measurements of slowest over quickest, less one; a measurement of one sample
// says nothing of it.
TEST(RateProbeTest, SpeedSpreadIsTheMedianMeasurementsSlowestOverQuickest) {
  EXPECT_EQ(SpeedSpread({}), 0);
  EXPECT_EQ(SpeedSpread({{0.5}}), 0);
  // Within a few rounding errors of a division (2.2 / 2 - 1 is 0.1 + 9e-17).
  EXPECT_NEAR(SpeedSpread({{1.0, 1.5, 1.25}}), 0.5, 1e-12);
  EXPECT_NEAR(SpeedSpread({{2.0, 2.2}, {1.0, 3.0}, {4.0, 4.4, 4.0}, {7.0}}), 0.1, 1e-12);
  EXPECT_NEAR(SpeedSpread({{2.0, 2.2}, {1.0, 3.0}, {4.0, 5.0}}), 0.25, 1e-12);
}

// A probe of a newer llmctl (one downgraded since, or a file from elsewhere) is refused naming its
// version and the ones this llmctl reads, not as if its version were not a number.
TEST(RateProbeTest, AProbeOfANewerVersionIsRefusedNamingBothVersions) {
  nlohmann::json newer = nlohmann::json::parse(FixedProbe().ToJson().dump());
  newer["version"] = kRateProbeVersion + 1;
  const std::string reads = std::to_string(kRateProbeVersion);
  EXPECT_EQ(RateProbe::FromJson(newer).status().message(),
            "rate probe: 'version' is " + std::to_string(kRateProbeVersion + 1) +
                ", newer than this llmctl reads (1 to " + reads +
                "): a newer llm-train --probe wrote it; measure again with this llmctl's llm-train "
                "--probe");
  newer["version"] = "9";
  EXPECT_EQ(RateProbe::FromJson(newer).status().message(),
            "rate probe: 'version' must be an integer from 1 to " + reads);
}

TEST(RateProbeTest, RefusesEachBadFieldByName) {
  const nlohmann::json good = nlohmann::json::parse(FixedProbeWithReferenceSteps().ToJson().dump());
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& field) {
    ExpectEachRefusedNaming(good, {{edit, field}});
  };
  refused([](nlohmann::json& j) { j["version"] = kRateProbeVersion + 1; }, "version");
  refused([](nlohmann::json& j) { j["version"] = 0; }, "version");
  refused([](nlohmann::json& j) { j.erase("rounds"); }, "rounds");
  refused([](nlohmann::json& j) { j["rounds"] = 0; }, "rounds");
  refused([](nlohmann::json& j) { j.erase("speed_spread"); }, "speed_spread");
  refused([](nlohmann::json& j) { j["speed_spread"] = -0.1; }, "speed_spread");
  refused([](nlohmann::json& j) { j["speed_spread"] = 1e300; }, "speed_spread");
  refused([](nlohmann::json& j) { j["speed_spread"] = "calm"; }, "speed_spread");
  refused([](nlohmann::json& j) { j["others_cpu_share"] = -0.01; }, "others_cpu_share");
  refused([](nlohmann::json& j) { j["others_cpu_share"] = 1.5; }, "others_cpu_share");
  refused([](nlohmann::json& j) { j["others_cpu_share"] = "busy"; }, "others_cpu_share");
  refused([](nlohmann::json& j) { j["kernel_cpu_share"] = -0.01; }, "kernel_cpu_share");
  refused([](nlohmann::json& j) { j["kernel_cpu_share"] = 1.5; }, "kernel_cpu_share");
  refused([](nlohmann::json& j) { j["kernel_cpu_share"] = nullptr; }, "kernel_cpu_share");
  refused([](nlohmann::json& j) { j["pace_seconds"] = -0.001; }, "pace_seconds");
  refused([](nlohmann::json& j) { j["pace_seconds"] = 2.0; }, "pace_seconds");
  refused([](nlohmann::json& j) { j["pace_seconds"] = 1e-9; }, "pace_seconds");
  refused([](nlohmann::json& j) { j["pace_seconds"] = "slow"; }, "pace_seconds");
  refused([](nlohmann::json& j) { j["matmul"][1].erase("tokens"); }, "matmul[1].tokens");
  refused([](nlohmann::json& j) { j["matmul"][0]["tokens"] = -128; }, "matmul[0].tokens");
  refused([](nlohmann::json& j) { j.erase("memory_bytes_per_s"); }, "memory_bytes_per_s");
  refused([](nlohmann::json& j) { j["launch_seconds"] = -1; }, "launch_seconds");
  refused([](nlohmann::json& j) { j.erase("adamw_8bit_values_per_s"); }, "adamw_8bit_values_per_s");
  refused([](nlohmann::json& j) { j.erase("reference_steps"); }, "reference_steps");
  refused([](nlohmann::json& j) { j["reference_steps"][0]["dtype"] = "fp16"; },
          "reference_steps[0].dtype");
  refused([](nlohmann::json& j) { j["reference_steps"][1]["seconds"] = -1; },
          "reference_steps[1].seconds");
  // An absurd step would make a factor whose times overflow: refused where it is read.
  refused([](nlohmann::json& j) { j["reference_steps"][0]["seconds"] = 1.7e308; },
          "reference_steps[0].seconds");
  refused([](nlohmann::json& j) { j["adamw_8bit_values_per_s"] = -9e7; },
          "adamw_8bit_values_per_s");
  refused([](nlohmann::json& j) { j.erase("nf4_dequant_values_per_s"); },
          "nf4_dequant_values_per_s");
  refused([](nlohmann::json& j) { j["nf4_dequant_values_per_s"] = -1; },
          "nf4_dequant_values_per_s");
  refused([](nlohmann::json& j) { j.erase("dropout_values_per_s"); }, "dropout_values_per_s");
  refused([](nlohmann::json& j) { j["dropout_values_per_s"] = "many"; }, "dropout_values_per_s");
  refused([](nlohmann::json& j) { j.erase("loss"); }, "loss");
  refused([](nlohmann::json& j) { j["loss"][0]["kernels"] = "liger"; }, "loss[0].kernels");
  refused([](nlohmann::json& j) { j["loss"][1]["dtype"] = "fp16"; }, "loss[1].dtype");
  refused([](nlohmann::json& j) { j["loss"][2]["logits_per_s"] = 1e-300; }, "loss[2].logits_per_s");
  refused([](nlohmann::json& j) { j["loss"][3].erase("logits_per_s"); }, "loss[3].logits_per_s");
  refused([](nlohmann::json& j) { j["matmul"][1]["dtype"] = "int8"; }, "matmul[1].dtype");
  refused([](nlohmann::json& j) { j["matmul"][0]["size"] = 0; }, "matmul[0].size");
  refused([](nlohmann::json& j) { j["matmul"][2]["flops_per_s"] = "fast"; },
          "matmul[2].flops_per_s");
  refused([](nlohmann::json& j) { j["sdpa"] = 3; }, "sdpa");
  refused([](nlohmann::json& j) { j["sdpa"][1]["tokens"] = 0; }, "sdpa[1].tokens");
  refused([](nlohmann::json& j) { j["sdpa"][0]["tokens"] = 1e15; }, "sdpa[0].tokens");
  refused([](nlohmann::json& j) { j.erase("sdpa_partial_block"); }, "sdpa_partial_block");
  refused([](nlohmann::json& j) { j.erase("jpeg_pixels_per_s"); }, "jpeg_pixels_per_s");
  refused([](nlohmann::json& j) { j["png_pixels_per_s"] = -1; }, "png_pixels_per_s");
  refused([](nlohmann::json& j) { j["sdpa_partial_block"] = 3; }, "sdpa_partial_block");
  refused(
      [](nlohmann::json& j) {
        j["sdpa_partial_block"] = {{{"dtype", "bf16"}, {"tokens", 65}, {"flops_per_s", 1e10}}};
      },
      "sdpa_partial_block[0].head_width");
  refused(
      [](nlohmann::json& j) {
        j["sdpa_partial_block"] = {
            {{"dtype", "bf16"}, {"tokens", 65}, {"head_width", 64}, {"flops_per_s", -1}}};
      },
      "sdpa_partial_block[0].flops_per_s");
  refused([](nlohmann::json& j) { j["identity"]["device"] = "tpu"; }, "identity.device");
  refused([](nlohmann::json& j) { j["identity"]["threads"] = 0; }, "identity.threads");
  refused([](nlohmann::json& j) { j["identity"]["device_name"] = std::string(257, 'x'); },
          "identity.device_name");
  refused([](nlohmann::json& j) { j["identity"]["device_name"] = "EPYC\x1b[2J"; },
          "identity.device_name");
  refused([](nlohmann::json& j) { j["identity"]["device_name"] = "EPYC\nfake line"; },
          "identity.device_name");
  refused([](nlohmann::json& j) { j["identity"]["versions"].erase("libtorch"); },
          "identity.versions");
  // Summary prints these under estimate's and plan's tables: none may forge a line there.
  refused(
      [](nlohmann::json& j) { j["identity"]["versions"]["libtorch"] = "\x1b]0;T\x07\r\nFORGED"; },
      "identity.versions");
  refused([](nlohmann::json& j) { j["identity"]["versions"]["llmctl"] = "0.4\u202e"; },
          "identity.versions");
  refused([](nlohmann::json& j) { j["identity"]["device_name"] = "EPYC\u009b2J"; },
          "identity.device_name");
  refused([](nlohmann::json& j) { j["measured_at"] = "2026-12-01\x1b[2J\nFORGED"; }, "measured_at");
  refused([](nlohmann::json& j) { j["measured_at"] = std::string(65, '1'); }, "measured_at");
  refused([](nlohmann::json& j) { j["matmul"] = nlohmann::json::array(); }, "matmul");
  // Measured, but not of any machine: a step timed at them would take 1e300 s, or none.
  refused([](nlohmann::json& j) { j["matmul"][0]["flops_per_s"] = 1e-300; },
          "matmul[0].flops_per_s");
  refused([](nlohmann::json& j) { j["sdpa"][0]["flops_per_s"] = 1e300; }, "sdpa[0].flops_per_s");
  refused([](nlohmann::json& j) { j["memory_bytes_per_s"] = 5e-324; }, "memory_bytes_per_s");
  refused([](nlohmann::json& j) { j["launch_seconds"] = 2; }, "launch_seconds");
  refused([](nlohmann::json& j) { j["host_to_device_bytes_per_s"] = 1e-3; },
          "host_to_device_bytes_per_s");
  refused([](nlohmann::json& j) { j["dropout_values_per_s"] = 1e20; }, "dropout_values_per_s");
  refused([](nlohmann::json& j) { j["reference_steps"][0]["seconds"] = 1e-300; },
          "reference_steps[0].seconds");
}

// A reference step is measured beside the probe's rates: one that ran far faster than its work at
// those rates allows, or 100x slower, would scale every trial's time by that, and is refused.
TEST(RateProbeTest, RefusesAReferenceStepNoStepOfItsWorkTakes) {
  const RateProbe probe = FixedProbeWithReferenceSteps();
  const DeviceSpeed speed = ProbedSpeed(CpuSpeed(), probe, "");
  StatusOr<StepWork> work = ReferenceWork(MatmulClass::kFp32);
  ASSERT_TRUE(work.ok());
  const NominalStep nominal = NominalStepSeconds(*work, speed);
  auto with_fp32_step = [&](double factor) {
    nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
    j["reference_steps"][0]["seconds"] = nominal.fixed + factor * nominal.calibrated;
    return RateProbe::FromJson(j);
  };
  for (const double factor : {kMinMeasuredFactor * 1.01, 1.0, kMaxMeasuredFactor * 0.99}) {
    StatusOr<RateProbe> parsed = with_fp32_step(factor);
    ASSERT_TRUE(parsed.ok()) << factor << ": " << parsed.status().message();
    EXPECT_NEAR(ProbedSpeed(CpuSpeed(), *parsed, "").probed_fp32_factor, factor, 1e-9 * factor);
  }
  for (const double factor : {kMinMeasuredFactor * 0.99, kMaxMeasuredFactor * 1.01}) {
    StatusOr<RateProbe> parsed = with_fp32_step(factor);
    ASSERT_FALSE(parsed.ok()) << factor;
    EXPECT_NE(parsed.status().message().find("'reference_steps[0].seconds'"), std::string::npos)
        << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("not a measurement of this machine"),
              std::string::npos)
        << parsed.status().message();
  }
  // llm-train --probe times reference steps on a CPU only (and the loss: without its rows here).
  nlohmann::json cuda = nlohmann::json::parse(probe.ToJson().dump());
  cuda["identity"]["device"] = "cuda";
  cuda["loss"] = nlohmann::json::array();
  StatusOr<RateProbe> parsed = RateProbe::FromJson(cuda);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("'reference_steps' must be empty on cuda"),
            std::string::npos)
      << parsed.status().message();
  cuda["reference_steps"] = nlohmann::json::array();
  EXPECT_TRUE(RateProbe::FromJson(cuda).ok());
}

// A probe of version 1 (no tokens: its matmuls were 512 rows) still reads, as 512-row rates.
TEST(RateProbeTest, AVersionOneProbeReadsAsFiveHundredTwelveTokens) {
  nlohmann::json old = nlohmann::json::parse(FixedProbe().ToJson().dump());
  old["version"] = 1;
  old.erase("rounds");
  for (nlohmann::json& row : old["matmul"]) row.erase("tokens");
  StatusOr<RateProbe> parsed = RateProbe::FromJson(old);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->version, 1);
  for (const ProbedMatmul& m : parsed->matmul) EXPECT_EQ(m.tokens, kProbeMatmulTokens);
  EXPECT_EQ(parsed->MatmulFlops("fp32", 512, 128), 6e10);  // one token count: the same at any
}

// A probe of version 3 timed attention's forward alone and had no 8-bit AdamW: it reads, and its
// speed keeps the sheet's for both (the step's attention at its matmul rate), where version 4's
// takes the probe's.
TEST(RateProbeTest, AVersionThreeProbesAttentionAndEightBitStepAreNotUsed) {
  nlohmann::json old = nlohmann::json::parse(FixedProbe().ToJson().dump());
  old["version"] = 3;
  old.erase("adamw_8bit_values_per_s");
  old.erase("reference_steps");
  StatusOr<RateProbe> parsed = RateProbe::FromJson(old);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const DeviceSpeed sheet = CpuSpeed();
  const DeviceSpeed three = ProbedSpeed(sheet, *parsed, "a version 3 probe");
  EXPECT_TRUE(three.fp32_attention_by_length.empty());
  EXPECT_TRUE(three.bf16_attention_by_length.empty());
  EXPECT_EQ(three.adamw_8bit_values_per_s, sheet.adamw_8bit_values_per_s);
  const DeviceSpeed five = ProbedSpeed(sheet, FixedProbe(), "a version 5 probe");
  ASSERT_EQ(five.fp32_attention_by_length.size(), 1u);
  EXPECT_EQ(five.fp32_attention_by_length[0].flops_per_s, 2e10);
  ASSERT_EQ(five.bf16_attention_by_length.size(), 1u);
  EXPECT_EQ(five.bf16_attention_by_length[0].flops_per_s, 1e9);
  EXPECT_EQ(five.adamw_8bit_values_per_s, 9e7);
}

// A probe of version 6 had no dropout rate: it reads, written back without one, and its speed
// keeps the sheet's; version 7's is the probe's.
TEST(RateProbeTest, AVersionSixProbeKeepsTheSheetsDropoutRate) {
  nlohmann::json old = nlohmann::json::parse(FixedProbeWithReferenceSteps().ToJson().dump());
  old["version"] = 6;
  old.erase("dropout_values_per_s");
  StatusOr<RateProbe> parsed = RateProbe::FromJson(old);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_FALSE(parsed->ToJson().contains("dropout_values_per_s"));
  const DeviceSpeed sheet = CpuSpeed();
  ASSERT_GT(sheet.dropout_values_per_s, 0);
  EXPECT_EQ(ProbedSpeed(sheet, *parsed, "a version 6 probe").dropout_values_per_s,
            sheet.dropout_values_per_s);
  EXPECT_EQ(ProbedSpeed(sheet, FixedProbe(), "a probe").dropout_values_per_s, 2.5e8);
}

// A probe of version 9 had no loss rates: it reads, written back without them, and its speed keeps
// the sheet's; version 10's are the probe's, each kernels' and dtype's in its place.
TEST(RateProbeTest, AVersionNineProbeKeepsTheSheetsLossRates) {
  nlohmann::json old = nlohmann::json::parse(FixedProbeWithReferenceSteps().ToJson().dump());
  old["version"] = 9;
  old.erase("loss");
  StatusOr<RateProbe> parsed = RateProbe::FromJson(old);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(parsed->loss.empty());
  EXPECT_FALSE(parsed->ToJson().contains("loss"));
  const DeviceSpeed sheet = CpuSpeed();
  ASSERT_GT(sheet.loss_logits_per_s.aten_fp32, 0);
  const DeviceSpeed nine = ProbedSpeed(sheet, *parsed, "a version 9 probe");
  EXPECT_EQ(nine.loss_logits_per_s.aten_fp32, sheet.loss_logits_per_s.aten_fp32);
  EXPECT_EQ(nine.loss_logits_per_s.fused_bf16, sheet.loss_logits_per_s.fused_bf16);
  const DeviceSpeed ten = ProbedSpeed(sheet, FixedProbe(), "a probe");
  EXPECT_EQ(ten.loss_logits_per_s.Of(Kernels::kAten, MatmulClass::kFp32), 2e8);
  EXPECT_EQ(ten.loss_logits_per_s.Of(Kernels::kFused, MatmulClass::kFp32), 7e8);
  EXPECT_EQ(ten.loss_logits_per_s.Of(Kernels::kAten, MatmulClass::kBf16), 2.5e8);
  EXPECT_EQ(ten.loss_logits_per_s.Of(Kernels::kFused, MatmulClass::kBf16), 5e8);
}

// The loss is timed on a CPU only: a GPU probe's loss rows would be no measurement of it.
TEST(RateProbeTest, AGpuProbeWithLossRatesIsRefused) {
  nlohmann::json gpu = nlohmann::json::parse(FixedProbe().ToJson().dump());
  gpu["identity"]["device"] = "cuda";  // FixedProbe has no reference steps, which are a CPU's too
  StatusOr<RateProbe> parsed = RateProbe::FromJson(gpu);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("'loss' must be empty on cuda"), std::string::npos)
      << parsed.status().message();
  gpu["loss"] = nlohmann::json::array();
  EXPECT_TRUE(RateProbe::FromJson(gpu).ok());
}

// A probe of `version` lacks its attention rows' `field`: they read as `expected` (what it
// measured), written back without it; the current version refuses a row without it, by name.
void ExpectAttentionFieldReadAsBefore(int version, const std::string& field,
                                      int64_t ProbedAttention::*member, int64_t expected) {
  nlohmann::json old = nlohmann::json::parse(FixedProbeWithReferenceSteps().ToJson().dump());
  old["version"] = version;
  for (nlohmann::json& row : old["sdpa"]) row.erase(field);
  StatusOr<RateProbe> parsed = RateProbe::FromJson(old);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  for (const ProbedAttention& a : parsed->sdpa) EXPECT_EQ(a.*member, expected);
  EXPECT_FALSE(parsed->ToJson()["sdpa"][0].contains(field));  // written back as it was read
  old["version"] = kRateProbeVersion;
  StatusOr<RateProbe> refused = RateProbe::FromJson(old);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'sdpa[0]." + field + "' is missing"),
            std::string::npos)
      << refused.status().message();
}

// A probe of version 4 timed attention at 128 tokens alone and its rows have no tokens: they read
// as 128-token rates, used at every length. Version 5's rows must say their length.
TEST(RateProbeTest, AVersionFourProbesAttentionReadsAsOneHundredTwentyEightTokens) {
  ExpectAttentionFieldReadAsBefore(4, "tokens", &ProbedAttention::tokens, kProbeAttentionTokens);
}

// A probe of version 5 timed attention 64 wide alone and its rows have no head_width: they read
// as 64-wide rates, used at every width. Version 6's rows must say their width.
TEST(RateProbeTest, AVersionFiveProbesAttentionReadsAsSixtyFourWideHeads) {
  ExpectAttentionFieldReadAsBefore(5, "head_width", &ProbedAttention::head_width,
                                   kProbeAttentionHeadWidth);
  nlohmann::json zero = nlohmann::json::parse(FixedProbe().ToJson().dump());
  zero["sdpa"][1]["head_width"] = 0;
  const StatusOr<RateProbe> refused = RateProbe::FromJson(zero);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("sdpa[1].head_width"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace llmctl::estimate
