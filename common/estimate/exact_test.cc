// The estimate against the real trainer: llm-train runs each configuration for one step, and the
// bytes its snapshot after the optimizer step reports per category must equal the estimate's,
// exactly. Every configuration runs on the CPU (the categories count the tensors' storages, whose
// sizes do not depend on the device; fsdp's one cuda-only buffer is model_state_test's).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/estimate/model_state.h"
#include "common/experiment.h"
#include "tests/support/shell_command.h"

namespace llmctl::estimate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Sets = std::vector<std::pair<std::string, std::string>>;

struct Case {
  std::string file;   // under experiments/
  std::string trial;  // "" for the file's only trial
  Sets sets;
  int nproc = 1;  // > 1: strategy ddp or fsdp's ranks, started by llm-train --nproc
};

// One step, a snapshot of every phase, short sequences; the prompt not masked, so every
// micro-batch has targets and a backward; no device budget, so the labs' out-of-memory rows run.
const Sets kQuick = {{"train.max_steps", "1"},      {"snapshot_every", "1"},
                     {"data.max_seq_length", "32"}, {"data.mask_prompt", "false"},
                     {"device_memory", ""},         {"output_dir", ""},
                     {"checkpoint_every", "0"},     {"profile.steps", "0"}};

std::string SourceDir() {
  const char* dir = std::getenv("LLMCTL_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string FilePath(const Case& c) { return SourceDir() + "/experiments/" + c.file; }

std::string Describe(const Case& c) {
  std::string text = c.file + (c.trial.empty() ? "" : " --trial " + c.trial);
  for (const auto& [key, value] : c.sets) text += " " + key + "=" + value;
  if (c.nproc > 1) text += " --nproc " + std::to_string(c.nproc);
  return text;
}

// The trial as llm-train builds it from the same file and --set flags (llm_train_main.cc).
StatusOr<ModelStateEstimate> EstimateCase(const Case& c) {
  ASSIGN_OR_RETURN(Experiment experiment, LoadExperimentFile(FilePath(c)));
  const Trial* trial = &experiment.trials.front();
  for (const Trial& t : experiment.trials) {
    if (t.name == c.trial) trial = &t;
  }
  TrialConfig config = trial->config;
  for (const auto& [key, value] : kQuick) RETURN_IF_ERROR(config.SetFromText(key, value));
  for (const auto& [key, value] : c.sets) RETURN_IF_ERROR(config.SetFromText(key, value));
  LocalizeNodePaths(config);
  ApplyLabSpellings(config);
  ASSIGN_OR_RETURN(ModelConfig model, ResolveModel(config.GetString("model")));
  return EstimateModelState(config, model);
}

Sets With(Sets a, const Sets& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<json> ReadEvents(const fs::path& path) {
  std::vector<json> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) events.push_back(json::parse(line));
  return events;
}

// Runs every case through llm-train and compares rank 0's (and the other ranks') figures.
void ExpectExact(const std::vector<Case>& cases) {
  const fs::path dir =
      fs::temp_directory_path() / ("llmctl-estimate-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(Describe(c));
    StatusOr<ModelStateEstimate> estimate = EstimateCase(c);
    ASSERT_TRUE(estimate.ok()) << estimate.status().message();

    const fs::path events = dir / ("events-" + std::to_string(i) + ".jsonl");
    std::string command = (llmctl::testing::BuildDir() / "trainer/llm-train").string() +
                          " --config " + FilePath(c) + " --events " + events.string();
    if (!c.trial.empty()) command += " --trial " + c.trial;
    for (const auto& sets : {kQuick, c.sets}) {
      for (const auto& [key, value] : sets) command += " --set '" + key + "=" + value + "'";
    }
    if (c.nproc > 1) command += " --nproc " + std::to_string(c.nproc) + " --master-port 0";
    const llmctl::testing::CommandResult run = llmctl::testing::RunShellCommand(command);
    ASSERT_EQ(run.exit_code, 0) << command << "\n" << run.out;

    ASSERT_EQ(estimate->world_size, c.nproc);
    for (int rank = 0; rank < c.nproc; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      fs::path path = events;
      if (rank > 0) path.replace_extension(".rank" + std::to_string(rank) + ".jsonl");
      json start, after_step;
      for (const json& event : ReadEvents(path)) {
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
