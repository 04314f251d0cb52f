// The estimate against the real trainer: llm-train runs each configuration for one step, and the
// bytes its snapshot after the optimizer step reports per category must equal the estimate's,
// exactly. Every configuration runs on the CPU (the categories count the tensors' storages, whose
// sizes do not depend on the device; fsdp's one cuda-only buffer is model_state_test's). The labs'
// table in miniature and DemoSweep's configurations are checked the same way in peak_test.cc, in
// the runs that measure their peaks.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/estimate/trainer_runs.h"

namespace llmctl::estimate {
namespace {

namespace fs = std::filesystem;

using testing::Case;
using testing::Sets;
using testing::With;

// One step, a snapshot of every phase, short sequences; the prompt not masked, so every
// micro-batch has targets and a backward; no device budget, so the labs' out-of-memory rows run.
const Sets kQuick = {{"train.max_steps", "1"},      {"snapshot_every", "1"},
                     {"data.max_seq_length", "32"}, {"data.mask_prompt", "false"},
                     {"device_memory", ""},         {"output_dir", ""},
                     {"checkpoint_every", "0"},     {"profile.steps", "0"}};

// Runs every case through llm-train (the one-rank cases in one process, each data-parallel case in
// its own: testing::RunLlmTrainCases) and compares rank 0's (and the other ranks') figures.
void ExpectExact(const std::vector<Case>& cases) {
  const fs::path dir = testing::TestDir();
  const std::vector<testing::TrainerRun> runs = testing::RunLlmTrainCases(cases, kQuick, dir, 0);
  ASSERT_EQ(runs.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(testing::Describe(c));
    StatusOr<testing::CaseConfig> loaded = testing::LoadCase(c, kQuick);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    const testing::TrainerRun& run = runs[i];
    ASSERT_EQ(run.exit_code, 0) << run.command << " exited with " << run.exit_code << "\n"
                                << run.output;
    testing::ExpectModelStateExact(c, *loaded, run.ranks);
  }
  fs::remove_all(dir);
}

// experiments/demo.yaml (llmctl-demo: tied embeddings, grouped-query attention) through the
// techniques that change the model state and that peak_test.cc's DemoSweep does not already run (it
// checks every one of its configurations exactly too: the plain model, each precision, SGD with and
// without momentum, 8-bit AdamW in fp32 and bf16, the optimizer in backward, offload,
// checkpointing, the chunked loss, LoRA with its default and all targets, QLoRA with its defaults
// and on k_proj, gate_proj and the head): at one example a micro-batch and two accumulated.
TEST(EstimateExactTest, DemoEveryTechnique) {
  const Sets small = {{"train.micro_batch_size", "1"}, {"train.global_batch_size", "2"}};
  const Sets in_backward = {{"optimizer_in_backward", "true"}, {"train.global_batch_size", "1"}};
  std::vector<Case> cases;
  for (const Sets& sets : std::vector<Sets>{
           {{"optimizer", "sgd"},
            {"train.momentum", "0.5"},
            {"train.weight_decay", "0.1"},
            {"precision", "bf16-true"}},
           With(in_backward, {{"optimizer", "sgd"}, {"train.momentum", "0.9"}}),
           With(in_backward, {{"optimizer", "adamw_8bit"}}),
           {{"offload", "optimizer"}, {"precision", "bf16-true"}},
           {{"train.micro_batch_size", "2"}, {"train.global_batch_size", "8"}},
           {{"peft.method", "lora"},
            {"peft.r", "16"},
            {"peft.alpha", "32"},
            {"peft.targets", "[o_proj, down_proj]"},
            {"precision", "bf16-true"}},
           {{"peft.method", "lora"}, {"optimizer", "adamw_8bit"}},
           {{"peft.method", "lora"}, {"offload", "optimizer"}},
           {{"peft.method", "qlora"},
            {"peft.double_quant", "false"},
            {"peft.compute_dtype", "fp32"}},
       }) {
    cases.push_back({"demo.yaml", "", With(small, sets)});
  }
  ExpectExact(cases);
}

// Two and three ranks: ddp's buckets, fsdp's shards (the demo's layers pad to a multiple of 3, or
// of 768 under 8-bit AdamW).
TEST(EstimateExactTest, DataParallelRanks) {
  const Sets two = {
      {"devices", "2"}, {"train.micro_batch_size", "2"}, {"train.global_batch_size", "4"}};
  ExpectExact({
      {"demo.yaml", "", With(two, {{"strategy", "ddp"}}), 2},
      {"demo.yaml", "", With(two, {{"strategy", "ddp"}, {"peft.method", "qlora"}}), 2},
      {"demo.yaml", "", With(two, {{"strategy", "fsdp"}}), 2},
      {"demo.yaml", "",
       With(two, {{"strategy", "fsdp"},
                  {"precision", "bf16-true"},
                  {"optimizer", "sgd"},
                  {"train.momentum", "0.9"}}),
       2},
      // 8-bit AdamW: the flats aligned to its state blocks, its state per piece of a parameter.
      {"demo.yaml", "", With(two, {{"strategy", "fsdp"}, {"optimizer", "adamw_8bit"}}), 2},
      {"demo.yaml",
       "",
       {{"strategy", "fsdp"},
        {"devices", "3"},
        {"train.micro_batch_size", "1"},
        {"train.global_batch_size", "3"}},
       3},
      {"demo.yaml",
       "",
       {{"strategy", "fsdp"},
        {"optimizer", "adamw_8bit"},
        {"devices", "3"},
        {"train.micro_batch_size", "1"},
        {"train.global_batch_size", "3"}},
       3},
  });
}

}  // namespace
}  // namespace llmctl::estimate
