// The experiment files shipped in experiments/: each parses, survives the JSON round trip and
// validates with its inputs present, and the lab tables hold the lab's rows.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "common/experiment.h"
#include "common/files.h"
#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

using testing::SourceDir;

std::string Contents(const fs::path& path) {
  StatusOr<std::string> text = ReadFileToString(path.string());
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? *text : std::string();
}

// Every experiment shipped in experiments/ must parse.
TEST(ShippedExperimentsTest, AllParse) {
  const fs::path dir = SourceDir() / "experiments";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  size_t count = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    StatusOr<Experiment> experiment = LoadExperimentFile(entry.path().string());
    EXPECT_TRUE(experiment.ok()) << experiment.status().message();
  }
  EXPECT_GE(count, 1u);
}

// The controller stores each trial as TrialConfig::ToJson and the agent rebuilds it with FromJson:
// the trial must come back with the same values and the same keys set, and still validate (checks
// such as "peft.r without peft.method" look at which keys were set).
TEST(ShippedExperimentsTest, EveryTrialSurvivesTheJsonRoundTripWithItsSetKeys) {
  size_t trials = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(SourceDir() / "experiments")) {
    if (entry.path().extension() != ".yaml") continue;
    StatusOr<Experiment> experiment = LoadExperimentFile(entry.path().string());
    ASSERT_TRUE(experiment.ok()) << experiment.status().message();
    for (const Trial& trial : experiment->trials) {
      ++trials;
      const std::string where = entry.path().filename().string() + ", trial " + trial.name;
      StatusOr<TrialConfig> back = TrialConfig::FromJson(trial.config.ToJson());
      ASSERT_TRUE(back.ok()) << where << ": " << back.status().message();
      EXPECT_TRUE(*back == trial.config) << where;
      for (const KeySpec& spec : TrialKeys()) {
        EXPECT_EQ(back->IsSet(spec.name), trial.config.IsSet(spec.name))
            << where << ": " << spec.name;
      }
      const Status valid = ValidateTrialConfig(*back, FindPreset(back->GetString("model")));
      EXPECT_TRUE(valid.ok()) << where << ": " << valid.message();
    }
  }
  EXPECT_GE(trials, 5u);
}

// As `llmctl submit experiments/X.yaml` and `llm-train --config experiments/X.yaml` see them from
// the repository root: every file validates with its local paths resolved, and every relative input
// path names something in the repository (a typo in a GPU file would otherwise surface only on the
// node).
TEST(ShippedExperimentsTest, ValidateFromTheRepositoryRootWithEveryInputPresent) {
  const fs::path root = SourceDir();
  size_t count = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(root / "experiments")) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    const std::string filename = "experiments/" + entry.path().filename().string();
    StatusOr<Experiment> experiment =
        ParseExperiment(Contents(entry.path()), filename, {.resolve_local_paths = true});
    ASSERT_TRUE(experiment.ok()) << experiment.status().message();
    StatusOr<Experiment> as_written =
        ParseExperiment(Contents(entry.path()), filename, {.resolve_local_paths = false});
    ASSERT_TRUE(as_written.ok()) << as_written.status().message();
    for (const Trial& trial : as_written->trials) {
      for (const KeySpec& spec : TrialKeys()) {
        if (spec.type != KeyType::kPath && spec.name != "model") continue;
        const std::string written = trial.config.GetString(spec.name);
        if (written.empty() || !IsInputPathValue(spec, written)) continue;
        EXPECT_TRUE(fs::exists(root / ResolveLocalPath(filename, written)))
            << filename << ", trial " << trial.name << ": " << spec.name << " '" << written
            << "' names nothing";
      }
    }
  }
  EXPECT_GE(count,
            9u);  // demo, cpu-lab, peft, single(-a100) for BLIP-2 and for LLaMA, multi(-a100)
}

// The GPU tables: the labs' rows in order, on their GPU, with the labs' out-of-memory rows.
TEST(ShippedExperimentsTest, SingleGpuTables) {
  for (const auto& [file, flavor_key, flavor] :
       {std::tuple{"single-llama.yaml", "flavor", "g1.h100.pci.1"},
        std::tuple{"single-llama-a100.yaml", "node_type", "compute_gigaio"}}) {
    StatusOr<Experiment> experiment =
        LoadExperimentFile((SourceDir() / "experiments" / file).string());
    ASSERT_TRUE(experiment.ok()) << experiment.status().message();
    EXPECT_EQ(experiment->target.at(flavor_key), flavor) << file;
    std::vector<std::string> names, oom;
    for (const Trial& trial : experiment->trials) {
      names.push_back(trial.name);
      if (trial.expect == "oom") oom.push_back(trial.name);
      EXPECT_EQ(trial.config.GetString("device"), "cuda") << file << " " << trial.name;
      EXPECT_EQ(trial.config.GetInt("data.max_seq_length"), 512);
    }
    EXPECT_EQ(names,
              (std::vector<std::string>{
                  "baseline", "reduced-batch", "grad-accumulation", "bf16-true", "bf16-mixed",
                  "larger-model-3b", "larger-model", "even-larger", "smallest-batch", "sgd",
                  "adam-8bit", "activation-checkpointing", "cpu-offload", "lora", "qlora"}))
        << file;
    EXPECT_EQ(oom, (std::vector<std::string>{"baseline", "even-larger", "smallest-batch"})) << file;
  }
}

// The current labs' BLIP-2 tables: rows 1-6 (OPT-2.7B and 6.7B) and 7-14 (Flan-T5-XXL), on their
// GPU, from the published weights, captions cut at the lab's 50 tokens.
TEST(ShippedExperimentsTest, SingleGpuBlip2Tables) {
  for (const auto& [file, flavor_key, flavor, oom_batch] :
       {std::tuple{"single.yaml", "flavor", "g1.h100.pci.1", 64},
        std::tuple{"single-a100.yaml", "node_type", "compute_gigaio", 32}}) {
    StatusOr<Experiment> experiment =
        LoadExperimentFile((SourceDir() / "experiments" / file).string());
    ASSERT_TRUE(experiment.ok()) << experiment.status().message();
    EXPECT_EQ(experiment->target.at(flavor_key), flavor) << file;
    std::vector<std::string> names;
    for (const Trial& trial : experiment->trials) {
      names.push_back(trial.name);
      EXPECT_EQ(trial.config.GetString("data.format"), "imagefolder") << file;
      EXPECT_EQ(trial.config.GetInt("data.max_seq_length"), 50) << file;
      EXPECT_EQ(trial.config.GetString("init"), "pretrained") << file;
      // Rows 1-6 on OPT, 7-14 on Flan-T5-XXL.
      EXPECT_TRUE(trial.config.GetString("model").starts_with(
          names.size() <= 6 ? "hf:Salesforce/blip2-opt-" : "hf:Salesforce/blip2-flan-t5-xxl"))
          << file << " " << trial.name;
    }
    EXPECT_EQ(names, (std::vector<std::string>{
                         "baseline", "reduced-batch", "grad-accumulation", "bf16-true",
                         "bf16-mixed", "larger-model", "even-larger", "xxl-smallest-batch", "sgd",
                         "adam-8bit", "activation-checkpointing", "cpu-offload", "lora", "qlora"}))
        << file;
    // The lab's spellings, as llmctl runs them; T5's projection names.
    const Trial& offload = experiment->trials.at(11);
    EXPECT_EQ(offload.config.GetString("offload"), "optimizer") << file;
    EXPECT_EQ(offload.config.GetString("optimizer"), "adamw") << file;
    EXPECT_EQ(experiment->trials.at(9).config.GetString("optimizer"), "adamw_8bit") << file;
    EXPECT_EQ(experiment->trials.at(13).config.GetStringList("peft.targets"),
              (std::vector<std::string>{"q", "v"}))
        << file;
    EXPECT_EQ(experiment->trials.at(6).expect, "oom") << file;  // 91.1 GiB of bf16 state
    EXPECT_EQ(experiment->trials.at(7).expect, "oom") << file;
    EXPECT_EQ(experiment->trials.front().expect, "oom") << file;
    EXPECT_EQ(experiment->trials.front().config.GetInt("train.micro_batch_size"), oom_batch);
  }
}

// The current multi-GPU lab: BLIP-2 OPT-2.7B in bf16-true, one device against 4 ranks of ddp, fsdp
// and fsdp with checkpointing, at one global batch of 64 captions.
TEST(ShippedExperimentsTest, MultiGpuBlip2Table) {
  StatusOr<Experiment> experiment =
      LoadExperimentFile((SourceDir() / "experiments" / "multi-blip2.yaml").string());
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  EXPECT_EQ(experiment->target.at("flavor"), "g1.h100.pci.4");
  std::vector<std::string> names, strategies;
  for (const Trial& trial : experiment->trials) {
    names.push_back(trial.name);
    strategies.push_back(trial.config.GetString("strategy"));
    EXPECT_EQ(trial.config.GetString("model"), "hf:Salesforce/blip2-opt-2.7b");
    EXPECT_EQ(trial.config.GetString("data.format"), "imagefolder");
    EXPECT_EQ(trial.config.GetString("precision"), "bf16-true");
    EXPECT_EQ(trial.config.GetInt("train.global_batch_size"), 64);
    EXPECT_EQ(trial.config.GetInt("devices"), trial.name == "one-device" ? 1 : 4);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"one-device", "ddp", "fsdp", "fsdp-checkpointing"}));
  EXPECT_EQ(strategies, (std::vector<std::string>{"auto", "ddp", "fsdp", "fsdp"}));
  EXPECT_TRUE(experiment->trials.back().config.GetBool("activation_checkpointing"));
}

// The multi-GPU tables: one device against 4 ranks of ddp and fsdp at the same global batch, the
// 13B row that only fsdp holds, on a 4-GPU node of each site.
TEST(ShippedExperimentsTest, MultiGpuTables) {
  for (const auto& [file, flavor_key, flavor] :
       {std::tuple{"multi.yaml", "flavor", "g1.h100.pci.4"},
        std::tuple{"multi-a100.yaml", "node_type", "gpu_a100_pcie"}}) {
    StatusOr<Experiment> experiment =
        LoadExperimentFile((SourceDir() / "experiments" / file).string());
    ASSERT_TRUE(experiment.ok()) << experiment.status().message();
    EXPECT_EQ(experiment->target.at(flavor_key), flavor) << file;
    std::vector<std::string> names, strategies, offloads, oom;
    std::vector<int64_t> global_batches;
    for (const Trial& trial : experiment->trials) {
      names.push_back(trial.name);
      strategies.push_back(trial.config.GetString("strategy"));
      offloads.push_back(trial.config.GetString("offload"));
      global_batches.push_back(trial.config.GetInt("train.global_batch_size"));
      if (trial.expect == "oom") oom.push_back(trial.name);
      EXPECT_EQ(trial.config.GetString("device"), "cuda") << file << " " << trial.name;
      EXPECT_EQ(trial.config.GetString("precision"), "bf16-true") << file << " " << trial.name;
      EXPECT_EQ(trial.config.GetInt("devices"), trial.name == "one-device" ? 1 : 4)
          << file << " " << trial.name;
    }
    EXPECT_EQ(names, (std::vector<std::string>{"one-device", "ddp", "fsdp", "fsdp-batch-8",
                                               "ddp-13b", "fsdp-13b", "deepspeed-13b"}))
        << file;
    // The lab's deepspeed_stage_3_offload, in llmctl's words.
    EXPECT_EQ(strategies,
              (std::vector<std::string>{"auto", "ddp", "fsdp", "fsdp", "ddp", "fsdp", "fsdp"}))
        << file;
    EXPECT_EQ(offloads,
              (std::vector<std::string>{"none", "none", "none", "none", "none", "none", "full"}))
        << file;
    EXPECT_EQ(global_batches, (std::vector<int64_t>{16, 16, 16, 32, 4, 4, 4})) << file;
    EXPECT_EQ(oom, (std::vector<std::string>{"ddp-13b"})) << file;
  }
}

TEST(ShippedExperimentsTest, Demo) {
  // Parsed from the repository root, as `make demo` runs it.
  const std::string text = Contents(SourceDir() / "experiments" / "demo.yaml");
  StatusOr<Experiment> experiment = ParseExperiment(text, "experiments/demo.yaml");
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  EXPECT_EQ(experiment->name, "demo");
  ASSERT_EQ(experiment->trials.size(), 1u);
  const TrialConfig& config = experiment->trials[0].config;
  EXPECT_EQ(config.GetString("model"), "llmctl-demo");
  EXPECT_EQ(config.GetString("init"), "random");
  EXPECT_EQ(config.GetString("tokenizer"), "experiments/tokenizers/demo/tokenizer.json");
  EXPECT_EQ(config.GetString("data.path"), "experiments/data/alpaca-demo.jsonl");
  EXPECT_EQ(config.GetInt("data.max_seq_length"), 128);
  EXPECT_EQ(config.GetInt("train.micro_batch_size"), 4);
  EXPECT_EQ(config.GetInt("train.global_batch_size"), 8);
  EXPECT_EQ(config.GetInt("train.max_steps"), 20);
  EXPECT_DOUBLE_EQ(config.GetFloat("train.lr"), 1e-3);
  EXPECT_EQ(config.GetInt("train.warmup_steps"), 2);
  EXPECT_EQ(config.GetInt("snapshot_every"), 10);
  EXPECT_EQ(config.GetString("precision"), "32-true");
  EXPECT_EQ(config.GetString("optimizer"), "adamw");
  EXPECT_EQ(config.GetString("device"), "cpu");
}

}  // namespace
}  // namespace llmctl
