// The predicted peak against the real trainer: llm-train runs each configuration for two steps (the
// second is the steady state, with the optimizer's state held through forward and backward) on
// examples longer than the sequence length, so every micro-batch is full as the estimate assumes.
// The bound (testing::PeakBound, testing::ExpectPeaksWithin): the estimate's peak at most 3% over
// the highest allocated bytes it measures and at most 2% under them (issue 28: an estimate under
// the peak says "fits" for a run that does not; the tied-vocabulary test: 1% either way), but a
// run below 32-bit precision may lie a further kCpuSixteenBitMatmulWorkspace (1 MiB) under: the
// buffers oneDNN packs a 16-bit matmul's operands into, which the estimate leaves out. On the
// demo's 10-15 MB peaks that is 7-10.5% more, so a 16-bit demo row passes down to about -9% to
// -12.5%. Measured (docs/estimate.md): the 32-bit rows -0.73% to +0.75%, the 16-bit rows down to
// -3.69% on the Zen 4 and -5.91% on a Xeon with AMX (777 KiB of buffers, where 512 KiB was the
// allowance until 12-05). The same run's model state must equal the estimate's byte for byte
// (exact_test.cc's check), so no configuration runs twice for the two.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/estimate/step_memory.h"
#include "common/estimate/trainer_runs.h"

namespace llmctl::estimate {
namespace {

namespace fs = std::filesystem;
using testing::Case;
using testing::Sets;
using testing::With;

// testing::ExpectPeaksWithin with PeakRunSets: the one-rank cases in one llm-train process.
void ExpectPeaksWithin(const std::vector<Case>& cases, testing::PeakBound bound = {}) {
  const fs::path dir = testing::TestDir();
  testing::ExpectPeaksWithin(cases, testing::PeakRunSets(dir), dir, bound);
  fs::remove_all(dir);
}

TEST(EstimatePeakTest, DemoSweep) {
  const Sets base = {{"train.micro_batch_size", "4"},
                     {"train.global_batch_size", "4"},
                     {"data.max_seq_length", "128"}};
  std::vector<Case> cases;
  for (const Sets& sets : std::vector<Sets>{
           {},
           {{"precision", "bf16-true"}},
           {{"precision", "bf16-mixed"}},
           {{"precision", "16-mixed"}},
           {{"optimizer", "sgd"}},
           {{"optimizer", "sgd"}, {"train.momentum", "0.9"}},
           {{"optimizer", "adamw_8bit"}},
           {{"optimizer", "adamw_8bit"}, {"precision", "bf16-true"}},
           {{"optimizer_in_backward", "true"}},
           {{"offload", "optimizer"}},
           {{"activation_checkpointing", "true"}},
           {{"activation_checkpointing", "true"}, {"precision", "bf16-true"}},
           {{"train.global_batch_size", "16"}},
           {{"train.micro_batch_size", "1"}, {"train.global_batch_size", "2"}},
           {{"train.micro_batch_size", "16"}, {"train.global_batch_size", "16"}},
           {{"data.max_seq_length", "32"}},
           {{"kernels", "aten"}, {"loss", "chunked_ce"}},
           {{"loss", "chunked_ce"}, {"train.grad_clip", "1.0"}, {"precision", "bf16-true"}},
           {{"peft.method", "lora"}},
           {{"peft.method", "lora"}, {"peft.dropout", "0.1"}},
           {{"peft.method", "lora"},
            {"peft.r", "4"},
            {"peft.targets",
             "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head]"}},
           {{"peft.method", "lora"},
            {"precision", "bf16-true"},
            {"peft.targets", "[o_proj, down_proj]"}},
           {{"peft.method", "lora"}, {"precision", "bf16-mixed"}},
           {{"peft.method", "lora"}, {"activation_checkpointing", "true"}},
           {{"peft.method", "qlora"}},
           {{"peft.method", "qlora"}, {"peft.compute_dtype", "fp32"}},
           {{"peft.method", "qlora"},
            {"peft.targets", "[k_proj, gate_proj, lm_head]"},
            {"precision", "bf16-true"},
            {"activation_checkpointing", "true"}},
           // The ATen composition transformers runs (the rows above run demo.yaml's kernels,
           // fused, with the chunked loss): more saved activations, the full logits.
           {{"kernels", "aten"}},
           {{"kernels", "aten"}, {"precision", "bf16-true"}},
           {{"kernels", "aten"}, {"precision", "bf16-mixed"}},
           {{"kernels", "aten"}, {"peft.method", "lora"}},
           {{"kernels", "aten"}, {"activation_checkpointing", "true"}},
       }) {
    cases.push_back({"demo.yaml", "", With(base, sets)});
  }
  // Two ranks (rank 0's peak; the ranks hold alike, but for 8-bit AdamW's state by a few hundred
  // bytes): ddp's buckets, fsdp's shards and gathered units (two layers at once with the prefetch,
  // every layer without reshard_after_forward), fsdp's full offload (the state on the host), 8-bit
  // AdamW on shards, LoRA and QLoRA on shards (frozen flats, NF4 buffers in their own dtypes),
  // fsdp's bf16 gathers under bf16-mixed.
  const Sets two = With(base, {{"devices", "2"}, {"train.global_batch_size", "8"}});
  cases.push_back({"demo.yaml", "", With(two, {{"strategy", "ddp"}}), 2});
  cases.push_back({"demo.yaml", "", With(two, {{"strategy", "fsdp"}}), 2});
  cases.push_back({"demo.yaml", "",
                   With(two, {{"strategy", "fsdp"}, {"fsdp.reshard_after_forward", "false"}}), 2});
  cases.push_back({"demo.yaml", "", With(two, {{"strategy", "fsdp"}, {"offload", "full"}}), 2});
  cases.push_back(
      {"demo.yaml", "", With(two, {{"strategy", "fsdp"}, {"optimizer", "adamw_8bit"}}), 2});
  cases.push_back({"demo.yaml", "", With(two, {{"strategy", "fsdp"}, {"peft.method", "lora"}}), 2});
  cases.push_back(
      {"demo.yaml", "", With(two, {{"strategy", "fsdp"}, {"peft.method", "qlora"}}), 2});
  cases.push_back(
      {"demo.yaml", "", With(two, {{"strategy", "fsdp"}, {"precision", "bf16-mixed"}}), 2});
  ExpectPeaksWithin(cases);
}

// A tied embedding whose vocabulary dwarfs the layers (bench/models/llama-100m: 32,000 x 768, 98 MB
// in fp32, at 1 x 32 tokens): the step peaks while the embedding's two gradient parts are summed,
// which the estimate once missed by 9% (issue 28). Both losses, since they sum differently.
// Measured on SmolLM-135M's shape as well: +0.00% to +0.05%, accumulation -0.5%.
TEST(EstimatePeakTest, TiedLargeVocabularyWithinOnePercent) {
  const Sets tied = {{"model", testing::SourceDir() + "/bench/models/llama-100m"},
                     {"train.micro_batch_size", "1"},
                     {"train.global_batch_size", "1"},
                     {"data.max_seq_length", "32"}};
  ExpectPeaksWithin({{"demo.yaml", "", With(tied, {{"kernels", "aten"}})},
                     {"demo.yaml", "", With(tied, {{"kernels", "fused"}})}},
                    {.under = 0.01, .over = 0.01});
}

// --fit's answer, checked the way a student would: under a 40 MiB device the largest micro-batch
// the estimate says fits runs, and one more example runs out of memory. Each run accumulates as
// FitMicroBatch assumes (two micro-batches a step where the file's global batch is larger: the
// gradients are then held through the second forward).
TEST(EstimatePeakTest, FitIsTheLargestMicroBatchThatRuns) {
  const fs::path dir = testing::TestDir();
  const Sets common = testing::PeakRunSets(dir);
  const Sets budget = {{"device_memory", "40MiB"}, {"data.max_seq_length", "128"}};
  std::vector<Case> cases;  // each technique's fit, then one example more: all in one process
  std::vector<std::string> expected;
  for (const Sets& technique :
       std::vector<Sets>{{}, {{"precision", "bf16-true"}}, {{"peft.method", "lora"}}}) {
    const Sets sets = With(budget, technique);
    SCOPED_TRACE(testing::Describe({"demo.yaml", "", sets}));
    StatusOr<testing::CaseConfig> loaded = testing::LoadCase({"demo.yaml", "", sets}, common);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    StatusOr<MicroBatchFit> fit = FitMicroBatch(loaded->config, loaded->model, 40 << 20, {});
    ASSERT_TRUE(fit.ok()) << fit.status().message();
    ASSERT_GT(fit->micro_batch_size, 0);
    std::printf("fit under 40 MiB: micro-batch %lld (peak %llu B), %lld would peak at %llu B\n",
                static_cast<long long>(fit->micro_batch_size),
                static_cast<unsigned long long>(fit->peak_bytes),
                static_cast<long long>(fit->micro_batch_size + 1),
                static_cast<unsigned long long>(fit->next_peak_bytes));
    const int64_t file_global = loaded->config.GetInt("train.global_batch_size");
    for (const int64_t micro : {fit->micro_batch_size, fit->micro_batch_size + 1}) {
      const std::string batch = std::to_string(micro);
      const std::string global = std::to_string(micro < file_global ? 2 * micro : micro);
      cases.push_back(
          {"demo.yaml", "",
           With(sets, {{"train.micro_batch_size", batch}, {"train.global_batch_size", global}})});
      expected.push_back(micro == fit->micro_batch_size ? "ok" : "oom");
    }
  }
  const std::vector<testing::TrainerRun> runs = testing::RunLlmTrainSeries(cases, common, dir, 0);
  ASSERT_EQ(runs.size(), cases.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(testing::Outcome(runs[i]), expected[i]) << testing::Describe(cases[i]);
  }
  fs::remove_all(dir);
}

// Every row of the labs' table in miniature at its own micro-batch and sequence length, as the
// file runs it (kernels: aten) and with the fused block and loss (kernels: fused, loss: auto), one
// test each so that ctest spreads the rows' minutes of bf16 matmuls over its jobs. Measured
// (11-28): aten -0.46% to +0.06%, fused -0.15% to +0.10% (before the layers' backward was walked
// stage by stage: -1.3% to +4.4%).
class CpuLabRowTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CpuLabRowTest, PeakWithinThreePercent) {
  ExpectPeaksWithin(
      {{"cpu-lab.yaml", GetParam(), {}}, {"cpu-lab.yaml", GetParam(), {{"kernels", "fused"}}}});
}

INSTANTIATE_TEST_SUITE_P(EstimatePeakTest, CpuLabRowTest,
                         ::testing::Values("baseline", "reduced-batch", "grad-accumulation",
                                           "bf16-true", "bf16-mixed", "larger-model", "even-larger",
                                           "smallest-batch", "sgd", "adam-8bit",
                                           "activation-checkpointing", "cpu-offload", "lora",
                                           "qlora"),
                         testing::RowTestName);

}  // namespace
}  // namespace llmctl::estimate
