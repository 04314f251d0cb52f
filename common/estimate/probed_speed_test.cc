// A probe's rates replace the data sheet's in the time estimate, term by term, as the arithmetic
// says (a fixed probe: rate_probe_test_support.h): matmuls over the grid, attention by length and
// head width, partial query blocks, and the reference steps' calibration.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "common/estimate/rate_probe.h"
#include "common/estimate/rate_probe_test_support.h"
#include "common/estimate/reference_step.h"

namespace llmctl::estimate {
namespace {

using test_support::FixedProbe;
using test_support::FixedProbeWithReferenceSteps;

// The seconds of `e`'s term `name` (-1: no such term).
double TermSeconds(const TimeEstimate& e, const std::string& name) {
  for (const TimeTerm& t : e.terms) {
    if (t.name == name) return t.seconds;
  }
  return -1.0;
}

// A bf16 step of 1,024 tokens whose 6 GFLOP of attention run at `seq` tokens a sequence on
// `head_width`-wide heads, beside `matmul_flops` of other matmuls.
StepWork Bf16AttentionWork(double seq, double head_width, double matmul_flops) {
  StepWork work;
  work.matmul_class = MatmulClass::kBf16;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.attention_flops = 6e9;
  work.matmul_flops = 6e9 + matmul_flops;
  work.attention_shapes = {{.queries = seq, .keys = seq, .head_width = head_width, .flops = 6e9}};
  return work;
}

// The seconds of the attention term of 6 GFLOP of bf16 attention at `seq` tokens a sequence on
// `head_width`-wide heads, at `probe`'s rates.
double AttentionTermSeconds(const RateProbe& probe, double seq, double head_width) {
  const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), probe, "a probe");
  return TermSeconds(EstimateTime(Bf16AttentionWork(seq, head_width, 0), probed,
                                  DefaultCalibration(probed, ModelFamily::kLlama), 0),
                     "attention");
}

// A step's attention takes the rate at its heads' width too: linear in log(width) between the
// measured widths around it, the nearest one's outside.
TEST(RateProbeTest, AttentionTakesTheRateAtItsHeadsWidth) {
  RateProbe p = FixedProbe();
  p.sdpa = {{"bf16", 1e10, 128, 32}, {"bf16", 4e10, 128, 64}, {"fp32", 4e10, 128, 64}};
  auto attention_seconds = [&](double width) { return AttentionTermSeconds(p, 128, width); };
  EXPECT_DOUBLE_EQ(attention_seconds(64), 6e9 / 4e10);
  EXPECT_DOUBLE_EQ(attention_seconds(32), 6e9 / 1e10);
  EXPECT_NEAR(attention_seconds(std::sqrt(32.0 * 64.0)), 6e9 / 2.5e10, 1e-12);  // halfway in log
  EXPECT_DOUBLE_EQ(attention_seconds(16), 6e9 / 1e10);   // below the narrowest: its rate
  EXPECT_DOUBLE_EQ(attention_seconds(128), 6e9 / 4e10);  // above the widest: its rate
}

// A step's attention takes the probe's rate at its sequences' length: linear in log(length)
// between the two measured lengths around it, the nearest one's outside them.
TEST(RateProbeTest, AttentionTakesTheRateAtItsSequenceLength) {
  RateProbe p = FixedProbe();
  p.sdpa = {{"bf16", 1e10, 32}, {"bf16", 3e10, 128}, {"bf16", 5e10, 512}, {"fp32", 4e10, 128}};
  auto attention_seconds = [&](double seq) { return AttentionTermSeconds(p, seq, 64); };
  EXPECT_DOUBLE_EQ(attention_seconds(128), 6e9 / 3e10);
  EXPECT_NEAR(attention_seconds(64), 6e9 / 2e10, 1e-12);  // halfway in log(length)
  EXPECT_NEAR(attention_seconds(256), 6e9 / 4e10, 1e-12);
  EXPECT_DOUBLE_EQ(attention_seconds(16), 6e9 / 1e10);    // below the shortest: its rate
  EXPECT_DOUBLE_EQ(attention_seconds(4096), 6e9 / 5e10);  // above the longest: its rate
  // The same FLOPs at 64 tokens a sequence cost 1.5x those at 128.
  EXPECT_NEAR(attention_seconds(64) / attention_seconds(128), 1.5, 1e-12);
}

// A probe times SDPA's forward and backward whole, as the step calls them: the calibration's factor
// (what the counted terms miss) scales the matmuls but not the attention, and a measured step's
// factor is taken over what it scales. Scaled, a CPU's bf16 factor of 1.5 priced a 104-token
// sequence's attention 1.5x what the step spent (12-06, the Xeon with AMX).
TEST(RateProbeTest, TheCalibrationFactorLeavesAProbesAttentionAsTimed) {
  RateProbe p = FixedProbe();
  p.sdpa = {{"bf16", 3e10, 128}, {"fp32", 4e10, 128}};
  const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), p, "a probe");
  const StepWork work = Bf16AttentionWork(128, 64, 6e9);
  Calibration once;
  Calibration twice;
  twice.bf16_factor = 2;
  twice.fp32_factor = 2;
  const TimeEstimate at_once = EstimateTime(work, probed, once, 0);
  const TimeEstimate at_twice = EstimateTime(work, probed, twice, 0);
  EXPECT_DOUBLE_EQ(TermSeconds(at_once, "attention"), 6e9 / 3e10);
  EXPECT_DOUBLE_EQ(TermSeconds(at_twice, "attention"), 6e9 / 3e10);
  EXPECT_DOUBLE_EQ(TermSeconds(at_twice, "matmuls"), 2 * TermSeconds(at_once, "matmuls"));
  EXPECT_NEAR(MeasuredFactor(work, probed, at_twice.step_seconds), 2, 1e-12);
}

// LibTorch's CPU flash attention runs a sequence's queries in blocks of 32 below 192 queries, 64
// below 768 and 256 from there.
TEST(RateProbeTest, QueriesArePaddedToTheFlashAttentionsBlocks) {
  for (const auto& [queries, padded] : std::vector<std::pair<double, double>>{{1, 32},
                                                                              {32, 32},
                                                                              {33, 64},
                                                                              {81.7, 96},
                                                                              {191, 192},
                                                                              {192, 192},
                                                                              {193, 256},
                                                                              {257, 320},
                                                                              {767, 768},
                                                                              {768, 768},
                                                                              {769, 1024}}) {
    EXPECT_EQ(PaddedQueries(queries), padded) << queries;
  }
}

// A version 8 probe's attention one query past a block says how much of a partial block's
// padding a sequence pays: the share of the way from the grid's time at its own length to its time
// at the next whole block. Every attention shape of that class then pays that share of its own
// padding (a self-attention's keys padded with its queries, a cross-attention's not); the other
// class, which measured no such row, pays none.
TEST(RateProbeTest, APartialQueryBlockCostsTheShareTheProbeMeasured) {
  RateProbe p = FixedProbe();
  // bf16 at 64 and 128 tokens, 64 wide: 1e10 and 2e10, so 1e10 x (1 + log2(T / 64)) between.
  p.sdpa = {{"bf16", 1e10, 64, 64}, {"bf16", 2e10, 128, 64}, {"fp32", 4e10, 128, 64}};
  auto rate = [](double tokens) {
    return 1e10 * (1 + std::log2(std::clamp(tokens, 64.0, 128.0) / 64));
  };
  // The probe's 65 tokens took 40% of the way to 96's time.
  const double own = 65.0 * 65 / rate(65), padded = 96.0 * 96 / rate(96);
  p.sdpa_partial_block = {{"bf16", 65.0 * 65 / (own + 0.4 * (padded - own)), 65, 64}};
  const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), p, "a probe");
  EXPECT_NEAR(probed.bf16_attention_block_share, 0.4, 1e-9);
  EXPECT_EQ(probed.fp32_attention_block_share, 0);

  StepWork work;
  work.matmul_class = MatmulClass::kBf16;
  work.tokens = 1024;
  work.micro_batches = 1;
  // Self-attention at 82 tokens (padded to 96), and 8 queries over 100 keys (8 padded to 32,
  // the keys as they are; rated at sqrt(queries x keys) tokens).
  work.attention_shapes = {{.queries = 82, .keys = 82, .head_width = 64, .flops = 4e9},
                           {.queries = 8, .keys = 100, .head_width = 64, .flops = 2e9}};
  work.attention_flops = 6e9;
  work.matmul_flops = 6e9;
  const double self = 4e9 / rate(82), self_padded = 4e9 * (96.0 * 96) / (82 * 82) / rate(96);
  // Both below 64 tokens (28 and 57): 64's rate.
  const double cross = 2e9 / rate(std::sqrt(800.0)),
               cross_padded = 2e9 * 4 / rate(std::sqrt(3200.0));
  const TimeEstimate e =
      EstimateTime(work, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0);
  EXPECT_NEAR(TermSeconds(e, "attention"),
              self + 0.4 * (self_padded - self) + cross + 0.4 * (cross_padded - cross), 1e-12);
  for (const TimeTerm& term : e.terms) {
    if (term.name != "attention") continue;
    EXPECT_NE(term.formula.find("bf16 SDPA by shape: 2 shapes at "), std::string::npos)
        << term.formula;
    EXPECT_NE(term.formula.find("partial query blocks at 0.40 of a whole one's cost"),
              std::string::npos)
        << term.formula;
  }
  // In fp32 none.
  work.attention_class = MatmulClass::kFp32;
  EXPECT_NEAR(
      TermSeconds(EstimateTime(work, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0),
                  "attention"),
      6e9 / 4e10, 1e-12);

  // A partial block timed faster than the grid's own length pays none; one slower than the whole
  // block all of it.
  p.sdpa_partial_block[0].flops_per_s = 65.0 * 65 / (0.9 * own);
  EXPECT_EQ(ProbedSpeed(CpuSpeed(), p, "a probe").bf16_attention_block_share, 0);
  p.sdpa_partial_block[0].flops_per_s = 65.0 * 65 / (1.2 * padded);
  EXPECT_EQ(ProbedSpeed(CpuSpeed(), p, "a probe").bf16_attention_block_share, 1);
}

// A version 7 probe had no partial-block row: it reads, written back without one, and a sequence
// pays none of its padding.
TEST(RateProbeTest, AVersionSevenProbePaysNoPartialBlock) {
  RateProbe probe = FixedProbeWithReferenceSteps();
  probe.sdpa_partial_block = {{"bf16", 0.5e9, 65, 64}};
  nlohmann::json old = nlohmann::json::parse(probe.ToJson().dump());
  old["version"] = 7;
  old.erase("sdpa_partial_block");
  StatusOr<RateProbe> parsed = RateProbe::FromJson(old);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(parsed->sdpa_partial_block.empty());
  EXPECT_FALSE(parsed->ToJson().contains("sdpa_partial_block"));
  EXPECT_EQ(ProbedSpeed(CpuSpeed(), *parsed, "a version 7 probe").bf16_attention_block_share, 0);
  // Nor its images' rates: the sheet's serve.
  old.erase("jpeg_pixels_per_s");
  old.erase("png_pixels_per_s");
  parsed = RateProbe::FromJson(old);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_FALSE(parsed->ToJson().contains("jpeg_pixels_per_s"));
  EXPECT_EQ(ProbedSpeed(CpuSpeed(), *parsed, "a version 7 probe").png_pixels_per_s,
            CpuSpeed().png_pixels_per_s);
  EXPECT_GT(ProbedSpeed(CpuSpeed(), probe, "a probe").bf16_attention_block_share, 0);
}

// Over the grid a rate is linear in log(rows) along each measured width, then linear in log(width)
// between the widths around it; outside them the nearest measured one's. A width measured at
// fewer rows (a dear cell left out) climbs past its most rows as the nearest width measured there
// does (12-02: where it kept its most rows' rate, a wide head's step was predicted 3x too slow).
TEST(RateProbeTest, AMatmulRateIsInterpolatedOverTheGrid) {
  RateProbe p = FixedProbe();
  p.matmul = {{"fp32", 512, 2e10, 128},
              {"fp32", 512, 4e10, 256},
              {"fp32", 512, 6e10, 512},
              {"fp32", 1024, 3e10, 128},
              {"fp32", 1024, 7e10, 256}};
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 512, 128), 2e10);
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 512, 512), 6e10);
  EXPECT_NEAR(p.MatmulFlops("fp32", 512, 181), 2e10 + 0.5 * 2e10, 1e8);  // 181 ~ 128 x sqrt(2)
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 512, 64), 2e10);
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 512, 4096), 6e10);
  // 512 wide climbs 1.5x from 256 rows to 512: so does 1024 past its 256.
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 1024, 512), 7e10 * 1.5);
  EXPECT_NEAR(p.MatmulFlops("fp32", 1024, 362), 7e10 * 1.25, 1e8);  // 362 ~ 256 x sqrt(2)
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 4096, 128), 3e10);
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 256, 256), 4e10);
  // sqrt(512 x 1024) is halfway in log(width): halfway between 2e10 and 3e10 at 128 rows, between
  // 6e10 and 10.5e10 at 512.
  EXPECT_NEAR(p.MatmulFlops("fp32", 724, 128), 2.5e10, 1e8);
  EXPECT_NEAR(p.MatmulFlops("fp32", 724, 512), 8.25e10, 1e8);
  // Past every width's rows: the most rows' rates, and the rise to them.
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 512, 8192), 6e10);
  EXPECT_DOUBLE_EQ(p.MatmulFlops("fp32", 1024, 8192), 7e10 * 1.5);
  ASSERT_EQ(p.MatmulRates("fp32").size(), 5u);
  EXPECT_TRUE(p.MatmulRates("fp16").empty());
}

// Each of a step's matmul shapes takes the probe's rate at its rows and its weight's
// sqrt(in x out); attention takes the probe's SDPA rate; the FLOPs no shape counts take the rate
// at a micro-batch's tokens through the 512-wide weight.
TEST(RateProbeTest, EachMatmulShapeTakesItsOwnRate) {
  RateProbe p = FixedProbe();
  p.matmul = {{"fp32", 256, 1e10, 128},
              {"fp32", 256, 2e10, 512},
              {"fp32", 1024, 4e10, 128},
              {"fp32", 1024, 8e10, 512}};
  p.sdpa = {{"fp32", 5e9}};
  const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), p, "a probe");
  StepWork work;
  work.matmul_class = MatmulClass::kFp32;
  work.tokens = 512;
  work.micro_batches = 1;
  work.matmul_shapes = {
      {.rows = 128, .in = 256, .out = 256, .flops = 1e10, .matmul_class = std::nullopt},
      // sqrt(256 x 4096): 1024 wide
      {.rows = 512, .in = 256, .out = 4096, .flops = 8e10, .matmul_class = std::nullopt}};
  work.attention_flops = 1e9;
  work.attention_shapes = {{.queries = 128, .keys = 128, .head_width = 64, .flops = 1e9}};
  work.matmul_flops = 1e10 + 8e10 + 1e9 + 6e9;  // 6e9 counted by no shape
  const TimeEstimate e =
      EstimateTime(work, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0);
  auto term = [&](const std::string& name) { return TermSeconds(e, name); };
  // 1 s + 1 s, and the rest at 512 rows, 512 wide: halfway between 2e10 and 8e10.
  EXPECT_NEAR(term("matmuls"), 1 + 1 + 6e9 / 5e10, 1e-9);
  EXPECT_DOUBLE_EQ(term("attention"), 1e9 / 5e9);
  // Without an attention rate, attention is a matmul at the micro-batch's rate.
  p.sdpa.clear();
  const DeviceSpeed no_sdpa = ProbedSpeed(CpuSpeed(), p, "a probe");
  const TimeEstimate flat =
      EstimateTime(work, no_sdpa, DefaultCalibration(no_sdpa, ModelFamily::kLlama), 0);
  EXPECT_NEAR(flat.step_seconds - e.step_seconds, 1e9 / 5e10 - 1e9 / 5e9, 1e-9);
}

// A shape that says its class takes that class's rate, the others the work's; attention takes its
// own class's SDPA rate (a 32-true QLoRA step: NF4 projections in bf16, the head and adapters and
// attention in fp32). Its weight shapes' new-length costs are their class's.
TEST(RateProbeTest, EachShapeAndAttentionTakeTheirOwnClasssRates) {
  RateProbe p = FixedProbe();
  p.matmul = {{"fp32", 512, 2e10, 128}, {"bf16", 512, 8e10, 128}};
  p.sdpa = {{"fp32", 4e10, 128, 64}, {"bf16", 1e10, 128, 64}};
  p.reference_steps = {};
  const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), p, "a probe");
  StepWork work;
  work.matmul_class = MatmulClass::kBf16;
  work.attention_class = MatmulClass::kFp32;
  work.tokens = 128;
  work.micro_batches = 1;
  work.matmul_shapes = {
      {.rows = 128, .in = 512, .out = 512, .flops = 8e10, .matmul_class = MatmulClass::kBf16},
      {.rows = 128, .in = 512, .out = 512, .flops = 4e10, .matmul_class = MatmulClass::kFp32},
      {.rows = 128, .in = 256, .out = 1024, .flops = 8e10, .matmul_class = std::nullopt}};
  work.attention_flops = 4e10;
  work.attention_shapes = {{.queries = 128, .keys = 128, .head_width = 64, .flops = 4e10}};
  work.matmul_flops = 8e10 + 4e10 + 8e10 + 4e10;
  const TimeEstimate e =
      EstimateTime(work, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0);
  // 1 s in bf16, 2 s in fp32, 1 s for the unlabelled shape at the work's bf16.
  EXPECT_NEAR(TermSeconds(e, "matmuls"), 1 + 2 + 1, 1e-9);
  EXPECT_DOUBLE_EQ(TermSeconds(e, "attention"), 4e10 / 4e10);  // fp32's SDPA, not bf16's 4 s
  // The same work with every class the work's: the fp32 shape at bf16's rate, attention at bf16's.
  StepWork uniform = work;
  uniform.attention_class.reset();
  for (MatmulShape& shape : uniform.matmul_shapes) shape.matmul_class.reset();
  const TimeEstimate one =
      EstimateTime(uniform, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0);
  EXPECT_NEAR(TermSeconds(one, "matmuls"), 1 + 0.5 + 1, 1e-9);
  EXPECT_DOUBLE_EQ(TermSeconds(one, "attention"), 4e10 / 1e10);
  // Without SDPA rates attention is a matmul, at its own class's rate: fp32's here.
  p.sdpa.clear();
  const DeviceSpeed no_sdpa = ProbedSpeed(CpuSpeed(), p, "a probe");
  const TimeEstimate flat =
      EstimateTime(work, no_sdpa, DefaultCalibration(no_sdpa, ModelFamily::kLlama), 0);
  EXPECT_NEAR(TermSeconds(flat, "matmuls"), 1 + 2 + 1 + 4e10 / 2e10, 1e-9);
  // Two distinct bf16 weight shapes and one fp32 one.
  EXPECT_EQ(WeightShapes(work, MatmulClass::kBf16).size(), 2u);
  EXPECT_EQ(WeightShapes(work, MatmulClass::kFp32).size(), 1u);
  EXPECT_TRUE(WeightShapes(uniform, MatmulClass::kFp32).empty());
}

// A vocabulary head's shape takes the probe's head cells' rate at its rows and inner width (linear
// in log(hidden) between the two measured around it), where without them, or wider than the widest,
// it takes the grid's at its weight's sqrt(in x out); a projection takes the grid's either way, and
// so does a wide one whose output is not kHeadMinRatio times its input.
TEST(RateProbeTest, AHeadTakesTheProbesHeadRateWhereItHasOne) {
  RateProbe p = FixedProbe();
  p.matmul = {{"fp32", 1024, 4e10, 256}};
  p.head_matmul = {{"fp32", 256, 64, 16384, 6e10}, {"fp32", 256, 256, 16384, 9e10}};
  StepWork work;
  work.matmul_class = MatmulClass::kFp32;
  work.tokens = 256;
  work.micro_batches = 1;
  work.matmul_shapes = {
      // 128 wide into a 32,768-token vocabulary: halfway (in log) between the head cells.
      {.rows = 256, .in = 128, .out = 32768, .flops = 1.5e11, .matmul_class = std::nullopt},
      {.rows = 256, .in = 1024, .out = 1024, .flops = 4e10, .matmul_class = std::nullopt},
      {.rows = 256, .in = 8192, .out = 16384, .flops = 8e10, .matmul_class = std::nullopt}};
  work.matmul_flops = 1.5e11 + 4e10 + 8e10;
  ASSERT_TRUE(IsHeadShape(work.matmul_shapes[0]));
  ASSERT_FALSE(IsHeadShape(work.matmul_shapes[2]));
  auto matmul_seconds = [&](const RateProbe& probe) {
    const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), probe, "a probe");
    return TermSeconds(
        EstimateTime(work, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0), "matmuls");
  };
  // The head at 7.5e10: 2 s; the others at the grid's one rate: 1 s and 2 s.
  EXPECT_NEAR(matmul_seconds(p), 2 + 1 + 2, 1e-9);
  // Without head cells the head takes the grid's 4e10 (its only cell, the nearest): 3.75 s.
  RateProbe no_heads = p;
  no_heads.head_matmul.clear();
  EXPECT_NEAR(matmul_seconds(no_heads), 3.75 + 1 + 2, 1e-9);
  // A head wider than the widest head cell takes the grid's rate: 512 into 131,072, sqrt 8,192.
  StepWork wide = work;
  wide.matmul_shapes[0].in = 512;
  wide.matmul_shapes[0].out = 131072;
  ASSERT_TRUE(IsHeadShape(wide.matmul_shapes[0]));
  const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), p, "a probe");
  EXPECT_NEAR(
      TermSeconds(EstimateTime(wide, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0),
                  "matmuls"),
      3.75 + 1 + 2, 1e-9);
  // A bf16 work's head takes bf16's cells, of which this probe has none: the grid's rate.
  RateProbe bf16_heads = p;
  for (ProbedHead& h : bf16_heads.head_matmul) h.dtype = "bf16";
  EXPECT_NEAR(matmul_seconds(bf16_heads), 3.75 + 1 + 2, 1e-9);
}

// A step's matmuls take the probe's rate at the tokens of one of its micro-batches: the same FLOPs
// in micro-batches of 128 rows cost three times those in micro-batches of 512.
TEST(RateProbeTest, AStepsMatmulsTakeTheRateAtItsMicroBatchsTokens) {
  RateProbe p = FixedProbe();
  p.matmul = {{"fp32", 512, 2e10, 128}, {"fp32", 512, 4e10, 256}, {"fp32", 512, 6e10, 512}};
  const DeviceSpeed probed = ProbedSpeed(CpuSpeed(), p, "a probe");
  ASSERT_EQ(probed.fp32_flops_by_shape.size(), 3u);
  StepWork work;
  work.matmul_class = MatmulClass::kFp32;
  work.matmul_flops = 6e10;
  auto matmul_seconds = [&](int64_t tokens, int64_t micro_batches) {
    work.tokens = tokens * micro_batches;
    work.micro_batches = micro_batches;
    return TermSeconds(
        EstimateTime(work, probed, DefaultCalibration(probed, ModelFamily::kLlama), 0), "matmuls");
  };
  EXPECT_DOUBLE_EQ(matmul_seconds(512, 1), 1);
  EXPECT_DOUBLE_EQ(matmul_seconds(128, 4), 3);  // 512 tokens a step, in four micro-batches of 128
  EXPECT_DOUBLE_EQ(matmul_seconds(256, 2), 1.5);
}

TEST(RateProbeTest, ProbedSpeedTakesTheProbesRatesAndKeepsTheRest) {
  const DeviceSpeed sheet = CpuSpeed();
  const DeviceSpeed probed = ProbedSpeed(sheet, FixedProbe(), "a probe");
  EXPECT_EQ(probed.rates, "a probe");
  EXPECT_EQ(probed.name, "cpu");  // the stored runs of the device still calibrate it
  EXPECT_EQ(probed.fp32_flops, 6e10);
  EXPECT_EQ(probed.bf16_flops, 1e9);
  EXPECT_EQ(probed.memory_bytes_per_s, 1.25e10);
  EXPECT_EQ(probed.launch_seconds, 5e-6);
  EXPECT_EQ(probed.host_optimizer_values_per_s, 4e8);
  EXPECT_EQ(probed.startup_seconds, sheet.startup_seconds);
  EXPECT_EQ(probed.network_bytes_per_s, sheet.network_bytes_per_s);
  // Not probed on a CPU: the link to the host is the same memory.
  EXPECT_EQ(probed.host_link_bytes_per_s, sheet.host_link_bytes_per_s);
}

// A step's terms at the probe's rates are its work over them, with no other machine's factor:
// a bf16 step on a CPU that emulates bf16 costs its FLOPs at the probe's bf16 rate, the host's
// optimizer step its values at the probe's AdamW rate, the CPU's 8-bit step its values at the
// probe's 8-bit rate, its NF4 dequantisation its values at the probe's NF4 rate, its dropout masks'
// draws at the probe's dropout rate, attention its FLOPs at the probe's attention rate.
TEST(RateProbeTest, AnEstimateWithAProbeIsTheWorkOverTheProbesRates) {
  StepWork work;
  work.matmul_class = MatmulClass::kBf16;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.matmul_flops = 3e11;
  work.memory_bytes = 2.5e9;
  work.launches = 4000;
  work.host_optimizer_values = 4e7;
  work.adamw_8bit_values = 3e6;
  work.nf4_dequant_values = 3e8;
  work.dropout_values = 5e7;
  work.attention_flops = 1e10;
  work.attention_shapes = {{.queries = 128, .keys = 128, .head_width = 64, .flops = 1e10}};
  work.jpeg_pixels = 3e7;
  work.png_pixels = 1e7;
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();  // no reference steps, so no factor of its own
  const DeviceSpeed probed = ProbedSpeed(sheet, probe, "a probe");
  const Calibration calibration = DefaultCalibration(probed, ModelFamily::kLlama);
  EXPECT_EQ(calibration.Factor(MatmulClass::kBf16), 1);
  const TimeEstimate with = EstimateTime(work, probed, calibration, 0);
  const auto term = TermSeconds;
  EXPECT_DOUBLE_EQ(term(with, "matmuls"), (3e11 - 1e10) / 1e9);
  EXPECT_DOUBLE_EQ(term(with, "attention"), 1e10 / 1e9);
  EXPECT_DOUBLE_EQ(term(with, "images"), 3e7 / 6e7 + 1e7 / 2.5e7);
  for (const TimeTerm& t : with.terms) {
    if (t.name == "images") {
      EXPECT_EQ(t.formula,
                "30 Mpixels JPEG / 60 Mpixels/s + 10 Mpixels PNG / 25 Mpixels/s (decoded and "
                "resized)");
    }
  }
  EXPECT_DOUBLE_EQ(term(with, "memory"), 2.5e9 / 1.25e10);
  EXPECT_DOUBLE_EQ(term(with, "launches"), 4000 * 5e-6);
  EXPECT_DOUBLE_EQ(term(with, "host optimizer"), 4e7 / 4e8);
  EXPECT_DOUBLE_EQ(term(with, "8-bit AdamW"), 3e6 / 9e7);
  EXPECT_DOUBLE_EQ(term(with, "NF4 dequant"), 3e8 / 6e8);
  EXPECT_DOUBLE_EQ(term(with, "dropout"), 5e7 / 2.5e8);
  EXPECT_DOUBLE_EQ(with.step_seconds,
                   290 + 10 + 0.2 + 0.02 + 0.1 + 3e6 / 9e7 + 0.5 + 0.2 + 0.5 + 0.4);
  // The data sheet's bf16 rate is twice its fp32: the probe's emulated bf16 makes the same step
  // (its matmuls dominate it) far slower than the sheet says.
  const TimeEstimate without =
      EstimateTime(work, sheet, DefaultCalibration(sheet, ModelFamily::kLlama), 0);
  EXPECT_GT(with.step_seconds, 100 * without.step_seconds);
  // The optimizer steps the probe timed with the trainer's own kernels take no factor; at the
  // sheet's rates (another machine's) they do, as on a CPU every other term does.
  auto calibrated = [](const TimeEstimate& e, const std::string& name) {
    for (const TimeTerm& t : e.terms) {
      if (t.name == name) return t.calibrated;
    }
    ADD_FAILURE() << "no term " << name;
    return false;
  };
  EXPECT_FALSE(calibrated(with, "8-bit AdamW"));
  EXPECT_FALSE(calibrated(with, "NF4 dequant"));
  EXPECT_FALSE(calibrated(with, "dropout"));
  EXPECT_TRUE(calibrated(without, "dropout"));
  EXPECT_FALSE(calibrated(with, "host optimizer"));
  EXPECT_TRUE(calibrated(with, "memory"));
  EXPECT_TRUE(calibrated(without, "8-bit AdamW"));
  EXPECT_TRUE(calibrated(without, "NF4 dequant"));
  EXPECT_TRUE(calibrated(without, "host optimizer"));
}

// The probe's reference steps calibrate the LLaMA family on its node before any trial has run
// there: each class's factor is the step's measured seconds over the nominal time of the reference
// trial's counted work at the probe's rates (less the uncalibrated terms), as Calibrate takes a
// stored run's. BLIP-2 keeps the probed rates' factor 1; a class without a step takes the other's.
TEST(RateProbeTest, ReferenceStepsAreTheNodesOwnCalibration) {
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();
  const DeviceSpeed uncalibrated = ProbedSpeed(sheet, probe, "a probe");
  auto nominal = [&](MatmulClass c) {
    StatusOr<StepWork> work = ReferenceWork(c);
    EXPECT_TRUE(work.ok()) << work.status().message();
    return NominalStepSeconds(*work, uncalibrated);
  };
  const NominalStep fp32 = nominal(MatmulClass::kFp32);
  const NominalStep bf16 = nominal(MatmulClass::kBf16);
  ASSERT_GT(fp32.calibrated, 0);
  ASSERT_GT(bf16.calibrated, 0);
  // The steps took 1.5x and 0.8x their nominal calibrated time beyond the fixed terms.
  probe.reference_steps = {{"fp32", fp32.fixed + 1.5 * fp32.calibrated},
                           {"bf16", bf16.fixed + 0.8 * bf16.calibrated}};
  const DeviceSpeed probed = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_DOUBLE_EQ(probed.probed_fp32_factor, 1.5);
  EXPECT_DOUBLE_EQ(probed.probed_bf16_factor, 0.8);
  const Calibration llama = DefaultCalibration(probed, ModelFamily::kLlama);
  EXPECT_DOUBLE_EQ(llama.Factor(MatmulClass::kFp32), 1.5);
  EXPECT_DOUBLE_EQ(llama.Factor(MatmulClass::kBf16), 0.8);
  EXPECT_NE(llama.source.find("reference steps"), std::string::npos) << llama.source;
  EXPECT_EQ(DefaultCalibration(probed, ModelFamily::kBlip2).Factor(MatmulClass::kFp32), 1);
  // Stored runs of the device still take over: Calibrate starts from this default.
  probe.reference_steps = {{"fp32", fp32.fixed + 1.5 * fp32.calibrated}};
  const Calibration one =
      DefaultCalibration(ProbedSpeed(sheet, probe, "a probe"), ModelFamily::kLlama);
  EXPECT_DOUBLE_EQ(one.Factor(MatmulClass::kBf16), 1.5);
  // A step no longer than its fixed terms measures no factor.
  probe.reference_steps = {{"fp32", fp32.fixed}};
  EXPECT_EQ(ProbedSpeed(sheet, probe, "a probe").probed_fp32_factor, 0);
}

bool Unmeasured(const NewLengthCost& cost) { return !cost.measured(); }

// With steps at new lengths and at repeated ones (version 5) the factor is the repeated step's,
// and the difference, over the step's micro-batches and the reference work's distinct weight
// shapes, is what each shape of a micro-batch at a new length costs; never below 0. A version 4
// probe's only step (at new lengths) keeps giving the factor, and no such cost.
TEST(RateProbeTest, ReferenceStepsAtNewAndRepeatedLengthsPriceANewLength) {
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();
  const DeviceSpeed uncalibrated = ProbedSpeed(sheet, probe, "a probe");
  StatusOr<StepWork> work = ReferenceWork(MatmulClass::kBf16);
  ASSERT_TRUE(work.ok()) << work.status().message();
  ASSERT_EQ(work->micro_batches, 2);
  // 512 x 512 (q, k, v, o), 512 x 1,408 (gate, up), 1,408 x 512 (down), 512 x 4,096 (the head).
  ASSERT_EQ(WeightShapes(*work, MatmulClass::kBf16).size(), 4u);
  const NominalStep bf16 = NominalStepSeconds(*work, uncalibrated);
  const double repeated = bf16.fixed + 1.2 * bf16.calibrated;
  probe.reference_steps = {{"bf16", repeated + 0.016, true}, {"bf16", repeated, false}};
  const DeviceSpeed probed = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_DOUBLE_EQ(probed.probed_bf16_factor, 1.2);
  // Without new_shapes cells (a version 13 probe's) each weight shape an equal part.
  ASSERT_EQ(probed.bf16_new_length.by_values.size(), 1u);
  EXPECT_NEAR(probed.bf16_new_length.ShapeSeconds(1e6), 0.016 / 2 / 4, 1e-15);
  EXPECT_EQ(probed.bf16_new_length.per_micro_batch, 0);
  EXPECT_TRUE(Unmeasured(probed.fp32_new_length));
  // A new-length step quicker than the repeated one prices nothing, and bounds the repeated
  // step's time: the factor is its own.
  probe.reference_steps = {{"bf16", bf16.fixed + 1.1 * bf16.calibrated, true},
                           {"bf16", repeated, false}};
  const DeviceSpeed bounded = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_TRUE(Unmeasured(bounded.bf16_new_length));
  EXPECT_DOUBLE_EQ(bounded.probed_bf16_factor, 1.1);
  // Version 4: the one step.
  probe.reference_steps = {{"bf16", repeated, true}};
  const DeviceSpeed four = ProbedSpeed(sheet, probe, "a probe");
  EXPECT_DOUBLE_EQ(four.probed_bf16_factor, 1.2);
  EXPECT_TRUE(Unmeasured(four.bf16_new_length));
  // The JSON says which step is which, and version 5 must.
  probe.reference_steps = {{"bf16", repeated + 0.016, true}, {"bf16", repeated, false}};
  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  EXPECT_EQ(j["reference_steps"][0]["lengths"], "new");
  EXPECT_EQ(j["reference_steps"][1]["lengths"], "repeated");
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  j["reference_steps"][1]["lengths"] = "sometimes";
  EXPECT_NE(RateProbe::FromJson(j).status().message().find("'reference_steps[1].lengths'"),
            std::string::npos);
  j["reference_steps"][1].erase("lengths");
  EXPECT_NE(
      RateProbe::FromJson(j).status().message().find("'reference_steps[1].lengths' is missing"),
      std::string::npos);
}

// With new_shapes cells (version 14) a weight shape's cost is the cells' (new over repeated, cells
// of one size averaged, none below 0) by its values, and the rest of the reference steps'
// difference a micro-batch is a micro-batch's own part; without cells of the class, or without a
// difference, as before. The cells round-trip through the JSON, which refuses a broken one by
// name.
TEST(RateProbeTest, NewShapeCellsSplitANewLengthByWeight) {
  const DeviceSpeed sheet = CpuSpeed();
  RateProbe probe = FixedProbe();
  const DeviceSpeed uncalibrated = ProbedSpeed(sheet, probe, "a probe");
  StatusOr<StepWork> work = ReferenceWork(MatmulClass::kBf16);
  ASSERT_TRUE(work.ok()) << work.status().message();
  const std::vector<WeightShape> weights = WeightShapes(*work, MatmulClass::kBf16);
  // 512 x 512, 512 x 1,408 and 1,408 x 512, 512 x 4,096.
  ASSERT_EQ(weights.size(), 4u);
  const NominalStep bf16 = NominalStepSeconds(*work, uncalibrated);
  const double repeated = bf16.fixed + 1.2 * bf16.calibrated;
  const double micro_batch = 0.043;  // the step at new lengths' more, over its 2 micro-batches
  probe.reference_steps = {{"bf16", repeated + 2 * micro_batch, true}, {"bf16", repeated, false}};
  const auto cell = [](int64_t in, int64_t out, double more) {
    return ProbedNewShape{"bf16", in, out, 128, 1e-3 + more, 1e-3};
  };
  probe.new_shapes = {cell(128, 128, 3e-3),  cell(512, 512, 5e-3),   cell(512, 1408, 6e-3),
                      cell(1408, 512, 8e-3), cell(512, 4096, 15e-3), cell(2048, 4096, 25e-3)};
  const NewLengthCost cost = ProbedSpeed(sheet, probe, "a probe").bf16_new_length;
  ASSERT_EQ(cost.by_values.size(), 5u);  // 512 x 1,408's two averaged
  EXPECT_EQ(cost.by_values[2].values, 512 * 1408);
  EXPECT_DOUBLE_EQ(cost.by_values[2].seconds, 7e-3);
  EXPECT_NEAR(cost.per_micro_batch, micro_batch - (5e-3 + 7e-3 + 7e-3 + 15e-3), 1e-12);
  EXPECT_NEAR(cost.MicroBatchSeconds(weights), micro_batch, 1e-12);
  EXPECT_TRUE(Unmeasured(ProbedSpeed(sheet, probe, "a probe").fp32_new_length));
  // A cell quicker at new rows than at repeated ones costs nothing.
  probe.new_shapes[0].new_seconds = 0.5e-3;
  EXPECT_EQ(ProbedSpeed(sheet, probe, "a probe").bf16_new_length.by_values[0].seconds, 0);
  // No difference between the steps: nothing, whatever the cells.
  probe.reference_steps = {{"bf16", repeated, true}, {"bf16", repeated, false}};
  EXPECT_TRUE(Unmeasured(ProbedSpeed(sheet, probe, "a probe").bf16_new_length));
  // The JSON.
  probe.new_shapes = {cell(128, 128, 3e-3), cell(512, 1408, 6e-3)};
  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  ASSERT_EQ(j["new_shapes"].size(), 2u);
  EXPECT_EQ(j["new_shapes"][1]["out"], 1408);
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  for (const auto& [field, value, problem] :
       {std::tuple{"in", nlohmann::json(0), "must be an integer from 1 to 1048576"},
        std::tuple{"rows", nlohmann::json(1.5), "must be an integer from 1 to 1048576"},
        std::tuple{"dtype", nlohmann::json("fp16"), "must be fp32 or bf16"},
        std::tuple{"new_seconds", nlohmann::json(-1), "must be 0 (not measured) or from"}}) {
    nlohmann::json broken = j;
    broken["new_shapes"][1][field] = value;
    EXPECT_NE(RateProbe::FromJson(broken).status().message().find(std::string("'new_shapes[1].") +
                                                                  field + "' " + problem),
              std::string::npos)
        << field << ": " << RateProbe::FromJson(broken).status().message();
  }
  nlohmann::json missing = j;
  missing.erase("new_shapes");
  EXPECT_NE(RateProbe::FromJson(missing).status().message().find("'new_shapes' must be a list"),
            std::string::npos);
  missing["version"] = 13;  // before the cells: none
  EXPECT_TRUE(RateProbe::FromJson(missing).ok());
}

// With elementwise cells (version 15) a step's memory traffic takes the rate of its stream's dtype
// at its stream's tensor size, linear in log(bytes) between the cells around it and the nearest
// one's outside, and its traffic over the model's state the memory copy's; a work that says no size
// (stored before, or a BLIP-2's) and a probe without cells of the dtype keep the one memory rate.
// The cells round-trip through the JSON, which refuses a broken one by name and any on a GPU.
TEST(RateProbeTest, ElementwiseCellsTimeTheMemoryTrafficAtTheStreamsSize) {
  RateProbe probe = FixedProbe();
  probe.elementwise = {{"fp32", 1 << 20, 1.5e11},
                       {"fp32", 256 << 10, 1e11},
                       {"fp32", 16 << 20, 3e10},
                       {"bf16", 1 << 20, 5e10}};
  const DeviceSpeed speed = ProbedSpeed(CpuSpeed(), probe, "a probe");
  ASSERT_EQ(speed.fp32_elementwise.size(), 3u);  // fewest bytes first
  EXPECT_EQ(speed.fp32_elementwise.front().tensor_bytes, 256 << 10);
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 512 << 10), 1.25e11);
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 4 << 20), 9e10);  // halfway in log
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 1024), 1e11);
  EXPECT_DOUBLE_EQ(ElementwiseRateAt(speed.fp32_elementwise, 1e12), 3e10);

  StepWork work;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.memory_bytes = 1e9;
  work.elementwise_tensor_bytes = 512 << 10;
  const Calibration none = {.source = "none"};
  auto memory_seconds = [&](const StepWork& w, const DeviceSpeed& d) {
    return TermSeconds(EstimateTime(w, d, none, 0), "memory");
  };
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / 1.25e11);
  const TimeEstimate estimate = EstimateTime(work, speed, none, 0);
  const auto memory = std::find_if(estimate.terms.begin(), estimate.terms.end(),
                                   [](const TimeTerm& t) { return t.name == "memory"; });
  ASSERT_NE(memory, estimate.terms.end());
  EXPECT_NE(memory->formula.find("fp32 element-wise at 524 kB tensors)"), std::string::npos)
      << memory->formula;
  // Its dtype casts are named, and take the same rate.
  work.cast_memory_bytes = 3e8;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / 1.25e11);
  const TimeEstimate with_casts = EstimateTime(work, speed, none, 0);
  const auto cast_memory = std::find_if(with_casts.terms.begin(), with_casts.terms.end(),
                                        [](const TimeTerm& t) { return t.name == "memory"; });
  ASSERT_NE(cast_memory, with_casts.terms.end());
  EXPECT_NE(cast_memory->formula.find("524 kB tensors, of it 300 MB dtype casts)"),
            std::string::npos)
      << cast_memory->formula;
  work.cast_memory_bytes = 0;
  // The traffic over the model's state at the memory copy's rate.
  work.state_memory_bytes = 4e8;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 6e8 / 1.25e11 + 4e8 / probe.memory_bytes_per_s);
  work.state_memory_bytes = 0;
  work.elementwise_class = MatmulClass::kBf16;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / 5e10);
  work.elementwise_tensor_bytes = 0;
  EXPECT_DOUBLE_EQ(memory_seconds(work, speed), 1e9 / probe.memory_bytes_per_s);
  work.elementwise_tensor_bytes = 512 << 10;
  EXPECT_DOUBLE_EQ(memory_seconds(work, ProbedSpeed(CpuSpeed(), FixedProbe(), "a probe")),
                   1e9 / probe.memory_bytes_per_s);

  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  ASSERT_EQ(j["elementwise"].size(), 4u);
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  for (const auto& [field, value, problem] :
       {std::tuple{"bytes", nlohmann::json(0), "must be an integer from 1 to 1099511627776"},
        std::tuple{"bytes", nlohmann::json(2.5), "must be an integer from 1 to 1099511627776"},
        std::tuple{"dtype", nlohmann::json("fp16"), "must be fp32 or bf16"},
        std::tuple{"bytes_per_s", nlohmann::json(-1), "must be 0 (not measured) or from"}}) {
    nlohmann::json broken = j;
    broken["elementwise"][1][field] = value;
    EXPECT_NE(RateProbe::FromJson(broken).status().message().find(std::string("'elementwise[1].") +
                                                                  field + "' " + problem),
              std::string::npos)
        << field << ": " << RateProbe::FromJson(broken).status().message();
  }
  nlohmann::json on_gpu = j;
  on_gpu["identity"]["device"] = "cuda";
  EXPECT_NE(RateProbe::FromJson(on_gpu).status().message().find("'elementwise' must be empty"),
            std::string::npos)
      << RateProbe::FromJson(on_gpu).status().message();
  nlohmann::json missing = j;
  missing.erase("elementwise");
  EXPECT_NE(RateProbe::FromJson(missing).status().message().find("'elementwise' must be a list"),
            std::string::npos);
  missing["version"] = 14;  // before the cells: none
  StatusOr<RateProbe> v14 = RateProbe::FromJson(missing);
  ASSERT_TRUE(v14.ok()) << v14.status().message();
  EXPECT_TRUE(ProbedSpeed(CpuSpeed(), *v14, "a probe").fp32_elementwise.empty());
}

// With layer cells (version 16) the layers' own element-wise traffic takes their rate: the bytes
// LayerElementwiseBytes counts for a cell over its seconds less its ops' dispatch at the probe's
// launch time (the step's launches count that), by the work's stream and projections' dtypes and
// its kernels, at its stream's tensor size; the rest of the activations' traffic keeps the
// element-wise product's rate. The layer ops are a term of their own, calibrated as the rest. A
// work that says no layer bytes (stored before), or whose dtypes or kernels no cell measured, takes
// the product's rate for all of it. The cells round-trip through the
// JSON, which refuses a broken one by name and any on a GPU, and a version 15 probe has none.
TEST(RateProbeTest, LayerCellsTimeTheLayersElementwiseOps) {
  RateProbe probe = FixedProbe();
  probe.elementwise = {{"fp32", 1 << 20, 1.5e11}};
  probe.layer_elementwise = {{"fp32", "fp32", "aten", 512, 512, 512, 512, 1408, 0.006},
                             {"fp32", "fp32", "aten", 128, 512, 512, 512, 1408, 0.002},
                             {"bf16", "bf16", "fused", 512, 512, 512, 512, 1408, 0.004}};
  const DeviceSpeed speed = ProbedSpeed(CpuSpeed(), probe, "a probe");
  ASSERT_EQ(speed.layer_elementwise.size(), 3u);
  const LayerWidths widths = {.hidden = 512, .q = 512, .kv = 512, .inter = 1408};
  auto cell_rate = [&](double tokens, Kernels kernels, double seconds) {
    return tokens * LayerElementwiseBytes(widths, 4, 4, kernels) /
           (seconds - LayerElementwiseLaunches(kernels) * probe.launch_seconds);
  };
  const double at_128 = cell_rate(128, Kernels::kAten, 0.002);
  const double at_512 = cell_rate(512, Kernels::kAten, 0.006);

  StepWork work;
  work.tokens = 1024;
  work.micro_batches = 1;
  work.memory_bytes = 1e9;
  work.layer_memory_bytes = 6e8;
  work.elementwise_tensor_bytes = 512 * 512 * 4;  // the 512-token cell's stream
  const Calibration none = {.source = "none"};
  auto seconds_of = [&](const StepWork& w, const char* term) {
    return TermSeconds(EstimateTime(w, speed, none, 0), term);
  };
  EXPECT_DOUBLE_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work), at_512);
  EXPECT_DOUBLE_EQ(seconds_of(work, "layer ops"), 6e8 / at_512);
  EXPECT_DOUBLE_EQ(seconds_of(work, "memory"), 4e8 / 1.5e11);
  // Both are calibrated.
  const Calibration doubled = {.bf16_factor = 2, .fp32_factor = 2, .source = "doubled"};
  const TimeEstimate scaled = EstimateTime(work, speed, doubled, 0);
  EXPECT_DOUBLE_EQ(TermSeconds(scaled, "layer ops"), 2 * 6e8 / at_512);
  EXPECT_DOUBLE_EQ(TermSeconds(scaled, "memory"), 2 * 4e8 / 1.5e11);
  const TimeEstimate estimate = EstimateTime(work, speed, none, 0);
  const auto layer_ops = std::find_if(estimate.terms.begin(), estimate.terms.end(),
                                      [](const TimeTerm& t) { return t.name == "layer ops"; });
  ASSERT_NE(layer_ops, estimate.terms.end());
  EXPECT_TRUE(layer_ops->calibrated);
  EXPECT_NE(layer_ops->formula.find("600 MB / "), std::string::npos) << layer_ops->formula;
  EXPECT_NE(layer_ops->formula.find("(aten norms, RoPE, activation, residual adds and layout "
                                    "copies: fp32 stream, fp32 projections)"),
            std::string::npos)
      << layer_ops->formula;
  const auto memory = std::find_if(estimate.terms.begin(), estimate.terms.end(),
                                   [](const TimeTerm& t) { return t.name == "memory"; });
  ASSERT_NE(memory, estimate.terms.end());
  EXPECT_TRUE(memory->formula.starts_with("400 MB / 150 GB/s")) << memory->formula;
  // Halfway in log(bytes) between the cells, the mean of their rates.
  work.elementwise_tensor_bytes = 256 * 512 * 4;
  EXPECT_DOUBLE_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work), (at_128 + at_512) / 2);
  work.elementwise_tensor_bytes = 512 * 512 * 4;
  // No cell of these kernels in fp32, or no layer bytes: the element-wise product's rate.
  work.layer_kernels = Kernels::kFused;
  EXPECT_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work), 0);
  EXPECT_EQ(seconds_of(work, "layer ops"), -1);  // no such term
  EXPECT_DOUBLE_EQ(seconds_of(work, "memory"), 1e9 / 1.5e11);
  work.layer_kernels = Kernels::kAten;
  work.layer_memory_bytes = 0;
  EXPECT_EQ(seconds_of(work, "layer ops"), -1);  // no such term
  EXPECT_DOUBLE_EQ(seconds_of(work, "memory"), 1e9 / 1.5e11);
  // A probe with the layer cells but no element-wise product of the stream's dtype (another
  // process's JSON): the rest at the one memory rate, the layer bytes counted once.
  work.layer_memory_bytes = 6e8;
  RateProbe without_products = probe;
  without_products.elementwise.clear();
  const DeviceSpeed layers_alone = ProbedSpeed(CpuSpeed(), without_products, "a probe");
  const TimeEstimate alone = EstimateTime(work, layers_alone, none, 0);
  EXPECT_DOUBLE_EQ(TermSeconds(alone, "layer ops"), 6e8 / at_512);
  EXPECT_DOUBLE_EQ(TermSeconds(alone, "memory"), 4e8 / probe.memory_bytes_per_s);
  // A bf16-true fused layer: its own cell.
  work.elementwise_class = MatmulClass::kBf16;
  work.layer_projected_class = MatmulClass::kBf16;
  work.layer_kernels = Kernels::kFused;
  work.elementwise_tensor_bytes = 512 * 512 * 2;
  EXPECT_DOUBLE_EQ(LayerElementwiseRateAt(speed.layer_elementwise, work),
                   512 * LayerElementwiseBytes(widths, 2, 2, Kernels::kFused) /
                       (0.004 - LayerElementwiseLaunches(Kernels::kFused) * probe.launch_seconds));

  nlohmann::json j = nlohmann::json::parse(probe.ToJson().dump());
  ASSERT_EQ(j["layer_elementwise"].size(), 3u);
  StatusOr<RateProbe> back = RateProbe::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
  for (const auto& [field, value, problem] :
       {std::tuple{"stream", nlohmann::json("fp16"), "must be fp32 or bf16"},
        std::tuple{"projected", nlohmann::json(16), "must be a string"},
        std::tuple{"kernels", nlohmann::json("triton"), "must be aten or fused"},
        std::tuple{"tokens", nlohmann::json(0), "must be an integer from 1 to 1048576"},
        std::tuple{"inter", nlohmann::json(1.5), "must be an integer from 1 to 1048576"},
        std::tuple{"kv_width", nlohmann::json(nullptr), "must be an integer from 1 to 1048576"},
        std::tuple{"seconds", nlohmann::json(-1), "must be 0 (not measured) or from"}}) {
    nlohmann::json broken = j;
    broken["layer_elementwise"][1][field] = value;
    const std::string message = RateProbe::FromJson(broken).status().message();
    EXPECT_NE(message.find(std::string("'layer_elementwise[1].") + field + "' " + problem),
              std::string::npos)
        << field << ": " << message;
  }
  nlohmann::json on_gpu = j;
  on_gpu["identity"]["device"] = "cuda";
  on_gpu["elementwise"] = nlohmann::json::array();
  EXPECT_NE(
      RateProbe::FromJson(on_gpu).status().message().find("'layer_elementwise' must be empty"),
      std::string::npos)
      << RateProbe::FromJson(on_gpu).status().message();
  nlohmann::json missing = j;
  missing.erase("layer_elementwise");
  EXPECT_NE(
      RateProbe::FromJson(missing).status().message().find("'layer_elementwise' must be a list"),
      std::string::npos);
  missing["version"] = 15;  // before the cells: none
  StatusOr<RateProbe> v15 = RateProbe::FromJson(missing);
  ASSERT_TRUE(v15.ok()) << v15.status().message();
  EXPECT_TRUE(ProbedSpeed(CpuSpeed(), *v15, "a probe").layer_elementwise.empty());
}

}  // namespace
}  // namespace llmctl::estimate
