// llm-train --probe's measurements: every rate it reports is measured (positive), its JSON reads
// back, and the CUDA path runs where LibTorch has a GPU (skipped, saying so, elsewhere). No test
// asserts a rate's size: that depends on the machine.
#include "trainer/train/rate_probe.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <iterator>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/cpu_matmul.h"
#include "common/estimate/rate_probe_test_support.h"
#include "common/estimate/reference_step.h"
#include "common/machine_cpu.h"

namespace llmctl::trainer {
namespace {

void ExpectEveryRateMeasured(const estimate::RateProbe& probe) {
  std::set<std::string> dtypes;
  for (const estimate::ProbedMatmul& m : probe.matmul) {
    EXPECT_GT(m.flops_per_s, 0) << m.dtype << " " << m.size;
    dtypes.insert(m.dtype);
  }
  EXPECT_EQ(dtypes, (std::set<std::string>{"fp32", "bf16", "fp16"}));
  std::set<std::string> attention_dtypes;
  for (const estimate::ProbedAttention& a : probe.sdpa) {
    EXPECT_GT(a.flops_per_s, 0) << a.dtype << " " << a.tokens;
    attention_dtypes.insert(a.dtype);
  }
  EXPECT_EQ(attention_dtypes, (std::set<std::string>{"fp32", "bf16", "fp16"}));
  EXPECT_GT(probe.memory_bytes_per_s, 0);
  if (probe.device == "cpu") {
    // Each dtype at each size, however fast.
    EXPECT_EQ(probe.elementwise.size(), 2 * std::size(estimate::kProbeElementwiseBytes));
    for (const estimate::ProbedElementwise& e : probe.elementwise) {
      EXPECT_GT(e.bytes_per_s, 0) << e.dtype << " " << e.bytes;
    }
    // A layer's element-wise ops at each size, by each precision's dtypes and each kernels.
    EXPECT_EQ(probe.layer_elementwise.size(), 3 * 2 * std::size(estimate::kProbeLayerTokens));
    std::set<std::tuple<std::string, std::string, std::string>> layer_keys;
    for (const estimate::ProbedLayerElementwise& l : probe.layer_elementwise) {
      EXPECT_GT(l.seconds, 0) << l.stream << " " << l.projected << " " << l.kernels << " "
                              << l.tokens;
      layer_keys.insert({l.stream, l.projected, l.kernels});
    }
    EXPECT_EQ(layer_keys.size(), 6u);
    EXPECT_EQ(probe.LayerElementwiseRates().size(), probe.layer_elementwise.size());
  } else {
    EXPECT_TRUE(probe.elementwise.empty());
    EXPECT_TRUE(probe.layer_elementwise.empty());
  }
  EXPECT_GT(probe.launch_seconds, 0);
  EXPECT_GT(probe.host_adamw_values_per_s, 0);
  EXPECT_GT(probe.threads, 0);
  EXPECT_FALSE(probe.versions.libtorch.empty());
  StatusOr<estimate::RateProbe> back =
      estimate::RateProbe::FromJson(nlohmann::json::parse(probe.ToJson().dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), probe.ToJson());
}

// A CPU probe, measured again (up to five times) while it refuses its rates (Unavailable): the
// probe's answer to other work holding the cores. ctest runs this binary's tests alone
// (RUN_SERIAL), so only work outside the suite can; 12-03, beside the suite's other tests, one
// run in three disagreed at load average 5.8. A VM's host can too: 12-06, in an hour whose trials
// moved 10-50% from one run to the next, three 0.05 s probes in a row put the bf16 reference step
// at new lengths at 0.0099 of its work at their own rates (a measured step must be 0.01 to 100
// times it), and the next four probes passed. The tests below check what a probe that passes
// holds; RatesThatDisagreeWithEachOtherAreRefused and AProbeOthersSharedTheCpusWithIsRefused
// check the refusals on a fixed probe.
StatusOr<estimate::RateProbe> ProbeCpuUntilSteady() {
  StatusOr<estimate::RateProbe> probe = ProbeRates({.device = "cpu", .seconds = 0.05});
  for (int attempt = 1; attempt < 5 && probe.status().code() == StatusCode::kUnavailable;
       ++attempt) {
    probe = ProbeRates({.device = "cpu", .seconds = 0.05});
  }
  return probe;
}

TEST(ProbeRatesTest, CpuMeasuresEveryRate) {
  StatusOr<estimate::RateProbe> probe = ProbeCpuUntilSteady();
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  EXPECT_EQ(probe->device, "cpu");
  ExpectEveryRateMeasured(*probe);
  EXPECT_GE(probe->rounds, 3);
  // How steady the machine was: some figure, whatever this machine's.
  ASSERT_TRUE(probe->speed_spread.has_value());
  EXPECT_TRUE(std::isfinite(*probe->speed_spread) && *probe->speed_spread >= 0)
      << *probe->speed_spread;
  // And what others took of the machine's CPU meanwhile: a share, whatever this machine's load.
  ASSERT_TRUE(probe->others_cpu_share.has_value());
  EXPECT_TRUE(*probe->others_cpu_share >= 0 && *probe->others_cpu_share <= 1)
      << *probe->others_cpu_share;
  // And the kernel's share of its own CPU time: a share, however dear this machine's page faults.
  ASSERT_TRUE(probe->kernel_cpu_share.has_value());
  EXPECT_TRUE(*probe->kernel_cpu_share >= 0 && *probe->kernel_cpu_share <= 1)
      << *probe->kernel_cpu_share;
  // And the machine's pace, which a trial's steps are set against: a canary's seconds.
  ASSERT_TRUE(probe->pace_seconds.has_value());
  EXPECT_TRUE(estimate::IsPaceSeconds(*probe->pace_seconds)) << *probe->pace_seconds;
  // Every matmul is a cell of the CPU's grid, and each dtype has at least its cheapest one (32
  // rows through a 64-wide weight), however slow.
  const std::set<int64_t> rows = {32, 128, 512, 2048};
  const std::set<int64_t> widths = {64, 128, 256, 512, 1024, 2048, 4096};
  std::set<std::string> cheapest;
  for (const estimate::ProbedMatmul& m : probe->matmul) {
    EXPECT_TRUE(rows.contains(m.tokens) && widths.contains(m.size)) << m.tokens << " x " << m.size;
    if (m.tokens == 32 && m.size == 64) cheapest.insert(m.dtype);
  }
  EXPECT_EQ(cheapest, (std::set<std::string>{"fp32", "bf16", "fp16"}));
  // Attention at the CPU's lengths and head widths, each of the estimate's dtypes from the
  // shortest at every width, however slow; fp16 at 128 tokens and 64 wide alone. And each at
  // every length up to the reference steps' longest rows, even at this 0.05 s budget, whose cut
  // left bf16 at 32 tokens alone: the estimate takes the reference steps' factor over what their
  // attention at these rates leaves of their time.
  const std::set<int64_t> lengths = {32, 64, 128, 256, 512};
  const int64_t reference_longest = estimate::kReferenceTokens + estimate::kReferenceLengthSpread;
  std::set<std::pair<std::string, int64_t>> shortest;
  std::set<std::tuple<std::string, int64_t, int64_t>> through_reference;
  for (const estimate::ProbedAttention& a : probe->sdpa) {
    EXPECT_TRUE(lengths.contains(a.tokens)) << a.dtype << " " << a.tokens;
    if (a.dtype == "fp16") {
      EXPECT_EQ(a.tokens, estimate::kProbeAttentionTokens);
      EXPECT_EQ(a.head_width, estimate::kProbeAttentionHeadWidth);
      continue;
    }
    if (a.tokens == 32) shortest.insert({a.dtype, a.head_width});
    if (a.tokens <= reference_longest) through_reference.insert({a.dtype, a.head_width, a.tokens});
  }
  EXPECT_EQ(shortest, (std::set<std::pair<std::string, int64_t>>{
                          {"fp32", 24}, {"fp32", 64}, {"bf16", 24}, {"bf16", 64}}));
  std::set<std::tuple<std::string, int64_t, int64_t>> expected_through_reference;
  for (const char* dtype : {"fp32", "bf16"}) {
    for (const int64_t width : {24, 64}) {
      for (const int64_t tokens : lengths) {
        if (tokens <= reference_longest) expected_through_reference.insert({dtype, width, tokens});
      }
    }
  }
  EXPECT_EQ(through_reference, expected_through_reference);
  // And each of the estimate's dtypes one query past a block, 64 wide.
  ASSERT_EQ(probe->sdpa_partial_block.size(), 2u);
  for (const estimate::ProbedAttention& a : probe->sdpa_partial_block) {
    EXPECT_EQ(a.tokens, estimate::kProbePartialBlockTokens);
    EXPECT_EQ(a.head_width, estimate::kProbeAttentionHeadWidth);
    EXPECT_GT(a.flops_per_s, 0);
  }
  EXPECT_EQ(probe->sdpa_partial_block[0].dtype, "fp32");
  EXPECT_EQ(probe->sdpa_partial_block[1].dtype, "bf16");
  // The vocabulary head's cells of both dtypes, and what their GEMMs took from LibTorch's
  // allocator beside their operands and output at each cell's width and every buffer vocabulary:
  // nothing where this CPU forms 16-bit products as fp32 GEMMs, whose scratch is outside it
  // (trainer/kernels/linear.h).
  std::set<std::string> head_dtypes;
  for (const estimate::ProbedHead& h : probe->head_matmul) {
    EXPECT_GT(h.flops_per_s, 0) << h.dtype << " " << h.hidden;
    head_dtypes.insert(h.dtype);
  }
  EXPECT_EQ(head_dtypes, (std::set<std::string>{"fp32", "bf16"}));
  ASSERT_EQ(probe->head_buffers.size(),
            probe->head_matmul.size() * std::size(estimate::kProbeHeadBufferVocabs));
  for (size_t i = 0; i < probe->head_buffers.size(); ++i) {
    const estimate::ProbedHeadBuffers& b = probe->head_buffers[i];
    const estimate::ProbedHead& cell =
        probe->head_matmul[i / std::size(estimate::kProbeHeadBufferVocabs)];
    EXPECT_EQ(b.dtype, cell.dtype) << i;
    EXPECT_EQ(b.hidden, cell.hidden) << i;
    EXPECT_EQ(b.vocab,
              estimate::kProbeHeadBufferVocabs[i % std::size(estimate::kProbeHeadBufferVocabs)])
        << i;
    for (const uint64_t bytes : {b.logits_bytes, b.input_gradient_bytes, b.weight_gradient_bytes}) {
      EXPECT_LT(bytes, uint64_t{1} << 30) << i;
      if (b.dtype == "bf16" && !CpuMultipliesBf16()) {
        EXPECT_EQ(bytes, 0u) << i;
      }
    }
  }
  // The host is the device: nothing to copy. The trainer's 8-bit AdamW step is the CPU's own.
  EXPECT_EQ(probe->host_to_device_bytes_per_s, 0);
  EXPECT_GT(probe->adamw_8bit_values_per_s, 0);
  EXPECT_GT(probe->nf4_dequant_values_per_s, 0);
  EXPECT_GT(probe->dropout_values_per_s, 0);
  EXPECT_GT(probe->jpeg_pixels_per_s, 0);
  EXPECT_GT(probe->png_pixels_per_s, 0);
  // The loss, ATen's and the fused kernel's, over fp32 and bf16 logits.
  std::set<std::pair<std::string, std::string>> losses;
  for (const estimate::ProbedLoss& l : probe->loss) {
    EXPECT_GT(l.logits_per_s, 0) << l.kernels << " " << l.dtype;
    losses.insert({l.kernels, l.dtype});
  }
  EXPECT_EQ(probe->loss.size(), 4u);
  EXPECT_EQ(losses, (std::set<std::pair<std::string, std::string>>{
                        {"aten", "fp32"}, {"aten", "bf16"}, {"fused", "fp32"}, {"fused", "bf16"}}));
  // The reference trial's step, each class at repeated lengths and at new ones
  // (common/estimate/reference_step.h).
  ASSERT_EQ(probe->reference_steps.size(), 4u);
  const std::vector<std::pair<std::string, bool>> steps = {
      {"fp32", false}, {"fp32", true}, {"bf16", false}, {"bf16", true}};
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(probe->reference_steps[i].dtype, steps[i].first) << i;
    EXPECT_EQ(probe->reference_steps[i].new_lengths, steps[i].second) << i;
    EXPECT_GT(probe->reference_steps[i].seconds, 0) << i;
  }
  // A projection's GEMMs at new and at repeated rows at each of NewShapeWeights: fp32 at 128 rows,
  // bf16 at 128 and, where this CPU multiplies bf16 natively, but for the widest (2,048 x 4,096),
  // at 384; elsewhere bf16's products are fp32 GEMMs, timed at 128 rows alone as fp32's.
  StatusOr<std::vector<estimate::WeightShape>> weights = estimate::NewShapeWeights();
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  const size_t n = weights->size();
  ASSERT_EQ(weights->back().values(), 2048 * 4096);
  ASSERT_EQ(probe->new_shapes.size(), CpuMultipliesBf16() ? 3 * n - 1 : 2 * n);
  for (size_t i = 0; i < probe->new_shapes.size(); ++i) {
    const estimate::ProbedNewShape& cell = probe->new_shapes[i];
    EXPECT_EQ(cell.dtype, i < n ? "fp32" : "bf16") << i;
    const estimate::WeightShape& weight = (*weights)[i % n];
    EXPECT_EQ(cell.in, weight.in) << i;
    EXPECT_EQ(cell.out, weight.out) << i;
    EXPECT_EQ(cell.rows, i < 2 * n ? 128 : 384) << i;
    EXPECT_GT(cell.new_seconds, 0) << i;
    EXPECT_GT(cell.repeated_seconds, 0) << i;
  }
}

// A probe whose reference step no step of its work at its own rates takes (what a probe beside
// other work measures, 12-01) is refused before anything is written, saying why; the same probe
// with its rates agreeing passes. The probe is a fixed one (rate_probe_test_support.h), as below.
TEST(ProbeRatesTest, RatesThatDisagreeWithEachOtherAreRefused) {
  const estimate::RateProbe probe = estimate::test_support::FixedProbeWithReferenceSteps();
  ASSERT_TRUE(CheckMeasuredProbe(probe).ok()) << CheckMeasuredProbe(probe).message();
  estimate::RateProbe busy = probe;
  busy.reference_steps[0].seconds = 1e-9;
  const Status checked = CheckMeasuredProbe(busy);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.code(), StatusCode::kUnavailable);
  for (const char* part : {"other work holds this machine's cores", "'reference_steps[0].seconds'",
                           "Nothing is written"}) {
    EXPECT_NE(checked.message().find(part), std::string::npos) << part << ": " << checked.message();
  }
}

// A CPU probe during which other processes took a tenth or more of its CPUs' time (a compiler, a
// trial, a VM's neighbours as steal) is refused, saying how much they took: kept, it would serve
// every later estimate. Below that it passes, and a GPU probe passes whatever the CPU's load. The
// probe is a fixed one whose rates agree (rate_probe_test_support.h): a measured one, on a host
// whose speed moved within the probe's 0.05 s, was itself refused three times in a row (12-06).
TEST(ProbeRatesTest, AProbeOthersSharedTheCpusWithIsRefused) {
  estimate::RateProbe shared = estimate::test_support::FixedProbeWithReferenceSteps();
  ASSERT_TRUE(CheckMeasuredProbe(shared).ok()) << CheckMeasuredProbe(shared).message();
  shared.others_cpu_share = 0.37;
  const Status checked = CheckMeasuredProbe(shared);
  ASSERT_FALSE(checked.ok());
  EXPECT_EQ(checked.code(), StatusCode::kUnavailable);
  for (const char* part : {"other processes took 37% of the time of the CPUs the probe ran on",
                           "from 10%", "Nothing is written"}) {
    EXPECT_NE(checked.message().find(part), std::string::npos) << part << ": " << checked.message();
  }
  shared.others_cpu_share = kBusyMachineShare;
  EXPECT_FALSE(CheckMeasuredProbe(shared).ok());
  shared.others_cpu_share = 0.09;
  EXPECT_TRUE(CheckMeasuredProbe(shared).ok()) << CheckMeasuredProbe(shared).message();
  shared.others_cpu_share = std::nullopt;  // a machine whose /proc/stat cannot be read
  EXPECT_TRUE(CheckMeasuredProbe(shared).ok());
  // The same figure on a GPU's probe: its rates are the GPU's.
  estimate::RateProbe gpu;
  gpu.device = "cuda";
  gpu.others_cpu_share = 0.37;
  const Status gpu_checked = CheckMeasuredProbe(gpu);
  EXPECT_EQ(gpu_checked.message().find("other processes took"), std::string::npos)
      << gpu_checked.message();
}

TEST(ProbeRatesTest, CudaMeasuresEveryRateAndTheHostLink) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: the probe's CUDA path is checked on a GPU machine";
  }
  StatusOr<estimate::RateProbe> probe = ProbeRates({.device = "cuda", .seconds = 0.05});
  ASSERT_TRUE(probe.ok()) << probe.status().message();
  EXPECT_EQ(probe->device, "cuda");
  ExpectEveryRateMeasured(*probe);
  EXPECT_GT(probe->host_to_device_bytes_per_s, 0);
  EXPECT_GT(probe->device_to_host_bytes_per_s, 0);
  // CUDA's 8-bit step is ATen's elementwise ops, which the memory rate times.
  EXPECT_EQ(probe->adamw_8bit_values_per_s, 0);
  EXPECT_EQ(probe->nf4_dequant_values_per_s, 0);
  EXPECT_EQ(probe->dropout_values_per_s, 0);  // its draws: elementwise kernels, memory's rate
  EXPECT_TRUE(probe->loss.empty());           // memory-bound: its bytes time it
  EXPECT_TRUE(probe->reference_steps.empty());
  EXPECT_TRUE(probe->new_shapes.empty());
  EXPECT_FALSE(probe->kernel_cpu_share.has_value());  // the driver's system calls: a CPU's only
  EXPECT_FALSE(probe->pace_seconds.has_value());      // a GPU's step is the GPU's
  EXPECT_TRUE(probe->sdpa_partial_block.empty());     // LibTorch's CPU kernel's blocks: a CPU's
  EXPECT_GT(probe->jpeg_pixels_per_s, 0);             // the host's, which decodes the images
  EXPECT_GT(probe->png_pixels_per_s, 0);
}

TEST(ProbeRatesTest, RefusesAnUnknownDevice) {
  StatusOr<estimate::RateProbe> probe = ProbeRates({.device = "tpu"});
  ASSERT_FALSE(probe.ok());
  EXPECT_NE(probe.status().message().find("'tpu'"), std::string::npos);
}

}  // namespace
}  // namespace llmctl::trainer
