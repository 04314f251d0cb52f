// The estimate against the real trainer: llm-train runs each configuration for one step, and the
// bytes its snapshot after the optimizer step reports per category must equal the estimate's,
// exactly. Every configuration runs on the CPU (the categories count the tensors' storages, whose
// sizes do not depend on the device; fsdp's one cuda-only buffer is model_state_test's).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/estimate/model_state.h"
#include "common/estimate/trainer_runs.h"

namespace llmctl::estimate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::Case;
using testing::Sets;
using testing::With;

// One step, a snapshot of every phase, short sequences; the prompt not masked, so every
// micro-batch has targets and a backward; no device budget, so the labs' out-of-memory rows run.
const Sets kQuick = {{"train.max_steps", "1"},      {"snapshot_every", "1"},
                     {"data.max_seq_length", "32"}, {"data.mask_prompt", "false"},
                     {"device_memory", ""},         {"output_dir", ""},
                     {"checkpoint_every", "0"},     {"profile.steps", "0"}};

// Runs every case through llm-train and compares rank 0's (and the other ranks') figures.
void ExpectExact(const std::vector<Case>& cases) {
  const fs::path dir = testing::TestDir();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(testing::Describe(c));
    StatusOr<testing::CaseConfig> loaded = testing::LoadCase(c, kQuick);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    StatusOr<ModelStateEstimate> estimate = EstimateModelState(loaded->config, loaded->model);
    ASSERT_TRUE(estimate.ok()) << estimate.status().message();
    auto ranks = testing::RunLlmTrainOk(c, kQuick, dir, static_cast<int>(i));
    ASSERT_TRUE(ranks.ok()) << ranks.status().message();

    ASSERT_EQ(estimate->world_size, c.nproc);
    for (int rank = 0; rank < c.nproc; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      json start, after_step;
      for (const json& event : (*ranks)[static_cast<size_t>(rank)]) {
        if (event["type"] == "start") start = event;
        if (event["type"] == "snapshot" && event["step"] == 0 &&
            event["phase"] == "phase3_after_opt_step") {
          after_step = event;
        }
      }
      ASSERT_FALSE(start.is_null());
      ASSERT_FALSE(after_step.is_null());
      EXPECT_EQ(start["parameters_total"].get<int64_t>(), estimate->parameters_total);
      EXPECT_EQ(start["parameters_trainable"].get<int64_t>(), estimate->parameters_trainable);
      EXPECT_EQ(after_step["params_bytes"].get<uint64_t>(), estimate->params_bytes);
      EXPECT_EQ(after_step["grads_bytes"].get<uint64_t>(), estimate->grads_bytes);
      EXPECT_EQ(after_step["optim_device_bytes"].get<uint64_t>(), estimate->optim_device_bytes);
      EXPECT_EQ(after_step["optim_host_bytes"].get<uint64_t>(), estimate->optim_host_bytes);
      EXPECT_EQ(after_step["comm_bytes"].get<uint64_t>(), estimate->comm_bytes);
    }
  }
  fs::remove_all(dir);
}

// experiments/demo.yaml (llmctl-demo: tied embeddings, grouped-query attention) through every
// technique that changes the model state, at one example a micro-batch and two accumulated.
TEST(EstimateExactTest, DemoEveryTechnique) {
  const Sets small = {{"train.micro_batch_size", "1"}, {"train.global_batch_size", "2"}};
  const Sets in_backward = {{"optimizer_in_backward", "true"}, {"train.global_batch_size", "1"}};
  std::vector<Case> cases;
  for (const Sets& sets : std::vector<Sets>{
           {},
           {{"precision", "bf16-true"}},
           {{"precision", "bf16-mixed"}},
           {{"precision", "16-mixed"}},
           {{"optimizer", "sgd"}},
           {{"optimizer", "sgd"}, {"train.momentum", "0.9"}},
           {{"optimizer", "sgd"},
            {"train.momentum", "0.5"},
            {"train.weight_decay", "0.1"},
            {"precision", "bf16-true"}},
           {{"optimizer", "adamw_8bit"}},
           {{"optimizer", "adamw_8bit"}, {"precision", "bf16-true"}},
           in_backward,
           With(in_backward, {{"optimizer", "sgd"}, {"train.momentum", "0.9"}}),
           With(in_backward, {{"optimizer", "adamw_8bit"}}),
           {{"offload", "optimizer"}},
           {{"offload", "optimizer"}, {"precision", "bf16-true"}},
           {{"activation_checkpointing", "true"}},
           {{"train.micro_batch_size", "2"}, {"train.global_batch_size", "8"}},
           {{"loss", "chunked_ce"}, {"train.grad_clip", "1.0"}},
           {{"peft.method", "lora"}},
           {{"peft.method", "lora"},
            {"peft.r", "4"},
            {"peft.targets",
             "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head]"}},
           {{"peft.method", "lora"},
            {"peft.r", "16"},
            {"peft.alpha", "32"},
            {"peft.targets", "[o_proj, down_proj]"},
            {"precision", "bf16-true"}},
           {{"peft.method", "lora"}, {"optimizer", "adamw_8bit"}},
           {{"peft.method", "lora"}, {"offload", "optimizer"}},
           {{"peft.method", "qlora"}},
           {{"peft.method", "qlora"},
            {"peft.double_quant", "false"},
            {"peft.compute_dtype", "fp32"}},
           {{"peft.method", "qlora"},
            {"peft.targets", "[k_proj, gate_proj, lm_head]"},
            {"precision", "bf16-true"},
            {"activation_checkpointing", "true"}},
       }) {
    cases.push_back({"demo.yaml", "", With(small, sets)});
  }
  ExpectExact(cases);
}

// Every row of the labs' table in miniature (three untied models of 8.65M to 31.4M parameters):
// its model, precision, optimizer and technique, without its device budget (so the rows that run
// out of memory there run). One micro-batch of 8 tokens a step, as the batch does not enter the
// model state: the CPU's bf16 matmuls take the larger models' backward from 10 to 25 seconds at
// the rows' own batches, to 2 or 3 here.
TEST(EstimateExactTest, EveryCpuLabRow) {
  std::vector<Case> cases;
  for (const char* trial :
       {"baseline", "reduced-batch", "grad-accumulation", "bf16-true", "bf16-mixed", "larger-model",
        "even-larger", "smallest-batch", "sgd", "adam-8bit", "activation-checkpointing",
        "cpu-offload", "lora", "qlora"}) {
    cases.push_back({"cpu-lab.yaml",
                     trial,
                     {{"train.micro_batch_size", "1"},
                      {"train.global_batch_size", "1"},
                      {"data.max_seq_length", "8"}}});
  }
  ExpectExact(cases);
}

// Two and three ranks: ddp's buckets, fsdp's shards (the demo's layers pad to a multiple of 3).
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
      {"demo.yaml",
       "",
       {{"strategy", "fsdp"},
        {"devices", "3"},
        {"train.micro_batch_size", "1"},
        {"train.global_batch_size", "3"}},
       3},
  });
}

}  // namespace
}  // namespace llmctl::estimate
