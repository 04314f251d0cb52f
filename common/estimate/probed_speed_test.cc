// A probe's rates replace the data sheet's in the time estimate, term by term, as the arithmetic
// says (a fixed probe: rate_probe_test_support.h): matmuls over the grid, attention by length and
// head width, partial query blocks, the head's own cells, and the whole estimate at a probe's
// rates. Its cells of a step's whole parts (reference steps, new lengths, element-wise and layer
// cells): probed_step_cells_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/estimate/rate_probe.h"
#include "common/estimate/rate_probe_test_support.h"

namespace llmctl::estimate {
namespace {

using test_support::FixedProbe;
using test_support::FixedProbeWithReferenceSteps;
using test_support::TermSeconds;

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

}  // namespace
}  // namespace llmctl::estimate
