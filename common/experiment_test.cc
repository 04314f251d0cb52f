#include "common/experiment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

using testing::SourceDir;

fs::path FixtureDir() { return SourceDir() / "tests" / "fixtures" / "experiments"; }

std::string ReadFile(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string TrimNewlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

Experiment MustParse(std::string_view yaml, std::string_view filename = "exp.yaml") {
  StatusOr<Experiment> experiment = ParseExperiment(yaml, filename);
  EXPECT_TRUE(experiment.ok()) << experiment.status().message();
  return experiment.ok() ? *experiment : Experiment{};
}

std::string ParseError(std::string_view yaml, std::string_view filename = "exp.yaml") {
  StatusOr<Experiment> experiment = ParseExperiment(yaml, filename);
  EXPECT_FALSE(experiment.ok()) << yaml;
  if (experiment.ok()) return "";
  EXPECT_EQ(experiment.status().code(), StatusCode::kInvalidArgument);
  return experiment.status().message();
}

std::vector<std::string> TrialNames(const Experiment& experiment) {
  std::vector<std::string> names;
  for (const Trial& trial : experiment.trials) names.push_back(trial.name);
  return names;
}

TEST(ParseExperimentTest, MinimalFileIsOneTrialNamedAfterTheFile) {
  const Experiment experiment = MustParse("data: {path: train.jsonl}\n", "dir/my-lab.yaml");
  EXPECT_EQ(experiment.name, "my-lab");
  EXPECT_EQ(experiment.description, "");
  EXPECT_TRUE(experiment.target.empty());
  ASSERT_EQ(experiment.trials.size(), 1u);
  const Trial& trial = experiment.trials[0];
  EXPECT_EQ(trial.name, "my-lab");
  EXPECT_FALSE(trial.expect.has_value());
  EXPECT_EQ(trial.config.GetString("data.path"), "train.jsonl");
  EXPECT_EQ(trial.config.GetString("model"), "llmctl-demo");
}

// `llmctl submit --trial`: the named trials in the file's order, after the whole file is checked;
// a name the file lacks is refused with the file's trial names.
TEST(ParseExperimentTest, KeepOnlyTrialsKeepsTheNamedOnesInFileOrder) {
  const std::string text =
      "data: {path: t.jsonl}\ntrials:\n  - {name: a}\n  - {name: b}\n  - {name: c}\n";
  Experiment kept = MustParse(text, "lab.yaml");
  ASSERT_TRUE(KeepOnlyTrials({"c", "a"}, "lab.yaml", kept).ok());
  ASSERT_EQ(kept.trials.size(), 2u);
  EXPECT_EQ(kept.trials[0].name, "a");
  EXPECT_EQ(kept.trials[1].name, "c");
  Experiment unknown = MustParse(text, "lab.yaml");
  const Status refused = KeepOnlyTrials({"d"}, "lab.yaml", unknown);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "lab.yaml: no trial named 'd' (its trials: a, b, c)");
}

TEST(ParseExperimentTest, FileStemIsMadeIntoAValidName) {
  EXPECT_EQ(MustParse("data: {path: t.jsonl}\n", "my lab (v2).yaml").name, "my-lab--v2-");
  EXPECT_EQ(MustParse("data: {path: t.jsonl}\n", "").name, "experiment");
}

TEST(ParseExperimentTest, NameDescriptionTarget) {
  const Experiment experiment = MustParse(R"(
name: single-gpu
description: |
  Two lines
  of text.
target: {site: KVM@TACC, flavor: g1.h100.pci.1, node_type: gpu_a100_pcie}
data: {path: t.jsonl}
)");
  EXPECT_EQ(experiment.name, "single-gpu");
  EXPECT_EQ(experiment.description, "Two lines\nof text.\n");
  EXPECT_EQ(
      experiment.target,
      (std::map<std::string, std::string>{
          {"site", "KVM@TACC"}, {"flavor", "g1.h100.pci.1"}, {"node_type", "gpu_a100_pcie"}}));
  EXPECT_EQ(experiment.trials[0].name, "single-gpu");
}

TEST(ParseExperimentTest, NestedAndDottedKeysAreTheSame) {
  const Experiment nested =
      MustParse("data: {path: t.jsonl}\ntrain: {micro_batch_size: 4, lr: 1e-3}\n");
  const Experiment dotted =
      MustParse("data.path: t.jsonl\ntrain.micro_batch_size: 4\ntrain.lr: 1e-3\n");
  ASSERT_EQ(nested.trials.size(), 1u);
  ASSERT_EQ(dotted.trials.size(), 1u);
  EXPECT_EQ(nested.trials[0].config, dotted.trials[0].config);
  EXPECT_EQ(nested.trials[0].config.GetInt("train.micro_batch_size"), 4);
  EXPECT_DOUBLE_EQ(nested.trials[0].config.GetFloat("train.lr"), 1e-3);
  EXPECT_TRUE(nested.trials[0].config.IsSet("train.lr"));
  EXPECT_FALSE(nested.trials[0].config.IsSet("seed"));
}

TEST(ParseExperimentTest, TrialsEditTheBase) {
  const Experiment experiment = MustParse(R"(
model: tinyllama-1.1b
data: {path: t.jsonl}
train: {micro_batch_size: 16, global_batch_size: 16}
trials:
  - name: baseline
    set: {train.micro_batch_size: 8}
    expect: oom
  - name: reduced-batch
    description: smaller
    set: {train: {micro_batch_size: 4}}
    expect: ok
  - name: as-is
)");
  EXPECT_EQ(TrialNames(experiment),
            (std::vector<std::string>{"baseline", "reduced-batch", "as-is"}));
  EXPECT_EQ(experiment.trials[0].config.GetInt("train.micro_batch_size"), 8);
  EXPECT_EQ(experiment.trials[0].config.GetInt("train.global_batch_size"), 16);
  EXPECT_EQ(experiment.trials[0].expect, "oom");
  EXPECT_EQ(experiment.trials[1].config.GetInt("train.micro_batch_size"), 4);
  EXPECT_EQ(experiment.trials[1].description, "smaller");
  EXPECT_EQ(experiment.trials[1].expect, "ok");
  EXPECT_EQ(experiment.trials[2].config.GetInt("train.micro_batch_size"), 16);
  EXPECT_FALSE(experiment.trials[2].expect.has_value());
  for (const Trial& trial : experiment.trials)
    EXPECT_EQ(trial.config.GetString("model"), "tinyllama-1.1b");
}

TEST(ParseExperimentTest, TrialsMayComeBeforeTheBase) {
  const Experiment experiment = MustParse(R"(
trials:
  - name: a
    set: {seed: 7}
data: {path: t.jsonl}
seed: 1
)");
  ASSERT_EQ(experiment.trials.size(), 1u);
  EXPECT_EQ(experiment.trials[0].config.GetInt("seed"), 7);
}

TEST(ParseExperimentTest, SweepMultipliesTrials) {
  const Experiment experiment = MustParse(R"(
data: {path: t.jsonl}
trials:
  - name: a
  - name: b
    set: {seed: 3}
sweep:
  precision: [32-true, bf16-true]
  train: {micro_batch_size: [1, 2]}
)");
  EXPECT_EQ(TrialNames(experiment),
            (std::vector<std::string>{"a/precision=32-true,train.micro_batch_size=1",
                                      "a/precision=32-true,train.micro_batch_size=2",
                                      "a/precision=bf16-true,train.micro_batch_size=1",
                                      "a/precision=bf16-true,train.micro_batch_size=2",
                                      "b/precision=32-true,train.micro_batch_size=1",
                                      "b/precision=32-true,train.micro_batch_size=2",
                                      "b/precision=bf16-true,train.micro_batch_size=1",
                                      "b/precision=bf16-true,train.micro_batch_size=2"}));
  EXPECT_EQ(experiment.trials[2].config.GetString("precision"), "bf16-true");
  EXPECT_EQ(experiment.trials[2].config.GetInt("train.micro_batch_size"), 1);
  EXPECT_EQ(experiment.trials[7].config.GetInt("seed"), 3);
  EXPECT_EQ(experiment.trials[0].config.GetInt("seed"), 42);
}

TEST(ParseExperimentTest, SweepWithoutTrialsUsesTheExperimentName) {
  const Experiment experiment = MustParse(R"(
name: lr-scan
data: {path: t.jsonl}
train.lr: 1e-4
sweep: {train.lr: [1e-3, 2e-4]}
)");
  EXPECT_EQ(TrialNames(experiment),
            (std::vector<std::string>{"lr-scan/train.lr=1e-3", "lr-scan/train.lr=2e-4"}));
  EXPECT_DOUBLE_EQ(experiment.trials[0].config.GetFloat("train.lr"),
                   1e-3);  // the sweep beats the base
}

TEST(ParseExperimentTest, SweepOverAListTypedKey) {
  const Experiment experiment = MustParse(R"(
data: {path: t.jsonl}
sweep:
  train.betas: [[0.9, 0.95], [0.9, 0.999]]
)");
  ASSERT_EQ(experiment.trials.size(), 2u);
  EXPECT_EQ(experiment.trials[1].name, "exp/train.betas=[0.9, 0.999]");
  EXPECT_EQ(experiment.trials[1].config.GetFloatList("train.betas"),
            (std::vector<double>{0.9, 0.999}));
}

// A node names a run's directory after its trial: a sweep whose values make a name too long for
// one is refused at the value, not by the node at launch.
TEST(ParseExperimentTest, ASweepNameTooLongForANodeIsRefusedAtItsValue) {
  // 143 bytes, 63 of them '/' or '=': 269 as a directory name.
  std::string path = "d/";
  for (int i = 0; i < 60; ++i) path += "a/";
  path += "t.jsonl";
  const std::string message =
      ParseError("data: {path: t.jsonl}\nsweep:\n  data.path: [t.jsonl, " + path + "]\n");
  EXPECT_EQ(message.rfind("exp.yaml:3:", 0), 0u) << message;
  EXPECT_NE(message.find("' is 269 bytes as a directory name"), std::string::npos) << message;
  EXPECT_NE(message.find("bytes as a directory name"), std::string::npos) << message;
  EXPECT_NE(message.find(": shorten the trial's name or the sweep's values"), std::string::npos)
      << message;
}

// A sweep's values as written make the trials' names, which every listing prints: a value (a local
// model directory's name) with a control character, a bidirectional control or a byte that breaks
// UTF-8 is refused at the value, the message showing it without them.
TEST(ParseExperimentTest, ASweepValueThatWouldMakeAnUnprintableTrialNameIsRefusedAtItsValue) {
  const std::string forged = ParseError(
      "data: {path: t.jsonl}\nsweep:\n  model: [llmctl-demo, \"./m\\e]0;T\\a\\r\\nFORGED\"]\n");
  EXPECT_EQ(forged,
            "exp.yaml:3:24: sweep value of model './m ]0;T   FORGED' holds a control character, "
            "and trial names are made of the sweep's values: rename it");
  EXPECT_EQ(
      ParseError("data: {path: t.jsonl}\nsweep:\n  data.path: [t.jsonl, \"gnp\\u202E.jsonl\"]\n"),
      "exp.yaml:3:24: sweep value of data.path 'gnp .jsonl' holds a bidirectional text "
      "control, and trial names are made of the sweep's values: rename it");
  EXPECT_NE(ParseError("data: {path: t.jsonl}\nsweep:\n  data.path: [t.jsonl, \"a\\x85.jsonl\"]\n")
                .find("holds a control character"),
            std::string::npos);
  // Printable names from other scripts are names like any other.
  EXPECT_EQ(
      TrialNames(MustParse("data: {path: t.jsonl}\nsweep:\n  data.path: [\u00e9t\u00e9.jsonl]\n")),
      std::vector<std::string>{"exp/data.path=\u00e9t\u00e9.jsonl"});
}

TEST(ParseExperimentTest, ExpectIsCopiedToSweepTrials) {
  const Experiment experiment = MustParse(R"(
data: {path: t.jsonl}
trials: [{name: a, expect: oom}]
sweep: {seed: [1, 2]}
)");
  ASSERT_EQ(experiment.trials.size(), 2u);
  EXPECT_EQ(experiment.trials[0].expect, "oom");
  EXPECT_EQ(experiment.trials[1].expect, "oom");
}

TEST(ParseExperimentTest, HugeSweepsAreRefused) {
  const std::string message = ParseError(R"(
data: {path: t.jsonl}
sweep:
  seed: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  train.epochs: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  log_every: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
  train.max_steps: [1, 2]
)");
  EXPECT_NE(message.find("the sweep makes more than 1000 trials"), std::string::npos) << message;
}

// Found while fuzzing (tests/fuzz/experiment_fuzz.cc, by hand: inputs this long exceed -max_len):
// with a value list this long, checking the values for duplicates took minutes (quadratic) before
// Expand refused the sweep.
TEST(ParseExperimentTest, LongSweepListsAreRefusedBeforeTheirValuesAreCompared) {
  std::string yaml = "data: {path: t.jsonl}\nsweep:\n  seed: [0";
  for (int i = 1; i < 90000; ++i) yaml += ", " + std::to_string(i);  // under kMaxYamlValues
  yaml += "]\n";
  EXPECT_EQ(ParseError(yaml),
            "exp.yaml:3:3: the sweep makes more than 1000 trials; split the experiment or sweep "
            "fewer values");
}

// Issue 37: sweeps were capped at 1,000 trials, a plain list was not (5,000 were accepted).
TEST(ParseExperimentTest, ListsOfMoreTrialsThanASweepMayMakeAreRefused) {
  auto listing = [](int count) {
    std::string yaml = "data: {path: t.jsonl}\ntrials:\n";
    for (int i = 0; i < count; ++i) yaml += "  - name: t" + std::to_string(i) + "\n";
    return yaml;
  };
  EXPECT_EQ(MustParse(listing(1000)).trials.size(), 1000u);
  EXPECT_EQ(ParseError(listing(5000)),
            "exp.yaml:2:1: trials: the list has 5000 trials, more than 1000; split the experiment");
  // With a sweep, listed x swept counts, as before.
  EXPECT_NE(ParseError(listing(500) + "sweep:\n  seed: [1, 2, 3]\n")
                .find("the sweep makes more than 1000 trials"),
            std::string::npos);
}

// Issue 37: `llmctl estimate` died of SIGFPE on this file (micro x devices x nodes wrapped to 0).
TEST(ParseExperimentTest, CountsPastTheirBoundAreRefusedAtTheirValue) {
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\ndevices: 4294967296\ntrain: {micro_batch_size: "
                       "4294967296, global_batch_size: 4294967296}\n"),
            "exp.yaml:2:10: devices: 4294967296 is more than 4096, the most llmctl takes");
}

TEST(ParseExperimentTest, NullClearsAKeyWithoutDefault) {
  const Experiment experiment = MustParse(R"(
data: {path: t.jsonl}
device_memory: 1GiB
trials:
  - name: unlimited
    set: {device_memory: null}
  - name: limited
)");
  EXPECT_FALSE(experiment.trials[0].config.GetByteSize("device_memory").has_value());
  EXPECT_EQ(experiment.trials[1].config.GetByteSize("device_memory"), uint64_t{1} << 30);
}

TEST(ParseExperimentTest, QuotedNumbersAreAccepted) {
  const Experiment experiment = MustParse("data: {path: t.jsonl}\ntrain.micro_batch_size: \"2\"\n");
  EXPECT_EQ(experiment.trials[0].config.GetInt("train.micro_batch_size"), 2);
}

TEST(ParseExperimentTest, ErrorsUseFileLineColumn) {
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\ntrain:\n  micro_batch_size: abc\n", "lab.yaml"),
            "lab.yaml:3:21: train.micro_batch_size: expected an integer, got 'abc'");
}

// Submitted through llmctl, a trial writes only inside its run's output/ on the node: output_dir
// is a relative path below it, refused at its line otherwise, and never resolved beside the file.
TEST(ParseExperimentTest, SubmittedOutputDirStaysInsideTheRunsOutput) {
  const ExperimentParseOptions in_run{.resolve_local_paths = true, .output_dir_in_run = true};
  const fs::path beside = FixtureDir() / "good" / "model_directory.yaml";  // its data/ exists
  StatusOr<Experiment> kept = LoadExperimentFile(beside.string(), in_run);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(kept->trials[0].config.GetString("output_dir"), "data");
  const std::string rule =
      ": a trial writes inside its run's output/ directory, so output_dir is a relative path "
      "below it (e.g. out), or unset for output/ itself";
  auto refused = [&](std::string_view yaml) {
    StatusOr<Experiment> experiment = ParseExperiment(yaml, "lab.yaml", in_run);
    return experiment.ok() ? std::string("parsed") : experiment.status().message();
  };
  EXPECT_EQ(refused("data: {path: t.jsonl}\noutput_dir: /root/.ssh\n"),
            "lab.yaml:2:13: output_dir: '/root/.ssh' is an absolute path" + rule);
  EXPECT_EQ(refused("data: {path: t.jsonl}\ntrials:\n  - name: up\n    set: {output_dir: "
                    "out/../..}\n"),
            "lab.yaml:4:23: output_dir: 'out/../..' climbs out of output/ with '..'" + rule);
  EXPECT_EQ(refused("data: {path: t.jsonl}\nsweep:\n  output_dir: [a, node:/scratch]\n"),
            "lab.yaml:3:19: output_dir: 'node:/scratch' is a node path" + rule);
  EXPECT_EQ(refused("data: {path: t.jsonl}\noutput_dir: ./out/\n"), "parsed");
  // llm-train alone writes where it is told.
  EXPECT_TRUE(ParseExperiment("data: {path: t.jsonl}\noutput_dir: /tmp/out\n", "lab.yaml").ok());
}

TEST(ParseExperimentTest, TrialProblemsNameTheTrialAndPointIntoItsSet) {
  const std::string yaml = R"(data: {path: t.jsonl}
train: {micro_batch_size: 16, global_batch_size: 16}
trials:
  - name: fine
  - name: baseline
    set:
      seed: 1
      train.micro_batch_size: 64
)";
  EXPECT_EQ(ParseError(yaml),
            "exp.yaml:8:7: trial 'baseline': train.global_batch_size (16) must be a multiple of "
            "train.micro_batch_size (64): each optimizer step accumulates whole micro-batches");
}

TEST(ParseExperimentTest, NodesWithoutADataParallelStrategyPointAtTheNodesKey) {
  const std::string yaml = R"(data: {path: t.jsonl}
train: {micro_batch_size: 1, global_batch_size: 4}
devices: 2
trials:
  - name: one-node
  - name: two-nodes
    set:
      nodes: 2
)";
  EXPECT_EQ(ParseError(yaml),
            "exp.yaml:8:7: trial 'two-nodes': nodes: 2 runs 2 x devices ranks, which only strategy "
            "ddp or fsdp starts, but strategy is auto; use strategy: ddp or fsdp, or nodes: 1");
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\nnodes: 0\n"),
            "exp.yaml:2:1: nodes must be at least 1, got 0");
  EXPECT_TRUE(ParseExperiment("data: {path: t.jsonl}\ntrain: {global_batch_size: 4}\nstrategy: "
                              "fsdp\ndevices: 2\nnodes: 2\n",
                              "exp.yaml")
                  .ok());
}

TEST(ParseExperimentTest, BaseProblemsPointAtTheBaseKey) {
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\ntrain.lr: -1\n"),
            "exp.yaml:2:1: train.lr must not be negative, got -1");
}

TEST(ParseExperimentTest, ProfileProblemsPointAtTheProfileKey) {
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\nprofile: {steps: 2, first_step: -1}\n"),
            "exp.yaml:2:21: profile.first_step must not be negative, got -1");
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\nprofile:\n  steps: two\n"),
            "exp.yaml:3:10: profile.steps: expected an integer, got 'two'");
}

TEST(ParseExperimentTest, DefaultCausedProblemPointsAtTheTrialsSet) {
  const std::string message = ParseError(R"(trials:
  - name: a
    set: {seed: 1}
)");
  EXPECT_EQ(message.rfind("exp.yaml:3:5: trial 'a': data.path is required", 0), 0u) << message;
}

TEST(ParseExperimentTest, UnknownKeysListWhatIsValidInTheirGroup) {
  const std::string message = ParseError("data: {path: t.jsonl}\ntrain: {zzzzzzzz: 1}\n");
  EXPECT_EQ(message.rfind(
                "exp.yaml:2:9: unknown key 'train.zzzzzzzz'; keys under train: micro_batch_size, "
                "global_batch_size, lr,",
                0),
            0u)
      << message;
}

TEST(ParseExperimentTest, ModelDirectoryIsResolvedBesideTheFile) {
  const fs::path file = FixtureDir() / "good" / "model_directory.yaml";
  StatusOr<Experiment> experiment = LoadExperimentFile(file.string());
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  const TrialConfig& config = experiment->trials[0].config;
  EXPECT_EQ(config.GetString("model"),
            (FixtureDir() / "models" / "tiny-qwen2").lexically_normal().string());
  EXPECT_EQ(config.GetString("data.path"),
            (FixtureDir() / "good" / "data" / "train.jsonl").string());
  EXPECT_EQ(config.GetString("output_dir"), (FixtureDir() / "good" / "data").string());
  EXPECT_EQ(config.GetString("tokenizer"),
            "no/such/tokenizer.json");  // not beside the file: as written
}

TEST(ParseExperimentTest, ModelDirectoryShapeIsChecked) {
  const fs::path file = FixtureDir() / "good" / "x.yaml";  // only its directory matters
  StatusOr<Experiment> experiment = ParseExperiment(
      "model: ../models/tiny-qwen2\ndata: {path: t.jsonl, max_seq_length: 512}\n", file.string());
  ASSERT_FALSE(experiment.ok());
  EXPECT_EQ(
      experiment.status().message(),
      file.string() +
          ":2:23: data.max_seq_length (512) exceeds the model's max_position_embeddings (256)");
}

TEST(ParseExperimentTest, WithoutLocalPathsModelsAreTakenOnTrust) {
  ExperimentParseOptions remote;
  remote.resolve_local_paths = false;
  const fs::path file = FixtureDir() / "good" / "model_directory.yaml";
  StatusOr<Experiment> experiment = ParseExperiment(ReadFile(file), file.string(), remote);
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  EXPECT_EQ(experiment->trials[0].config.GetString("model"), "../models/tiny-qwen2");
  EXPECT_EQ(experiment->trials[0].config.GetString("data.path"), "data/train.jsonl");

  experiment = ParseExperiment(
      "model: /nowhere/model\ndata: {path: t.jsonl, max_seq_length: 100000}\n", "exp.yaml", remote);
  EXPECT_TRUE(experiment.ok()) << experiment.status().message();
  // Presets are still checked.
  experiment = ParseExperiment(
      "model: tinyllama-1.1b\ndata: {path: t.jsonl, max_seq_length: 100000}\n", "exp.yaml", remote);
  EXPECT_FALSE(experiment.ok());
}

TEST(ParseExperimentTest, HubModelsAreAcceptedInBothModesAndCheckedForForm) {
  ExperimentParseOptions remote;
  remote.resolve_local_paths = false;
  for (const ExperimentParseOptions& options : {ExperimentParseOptions{}, remote}) {
    StatusOr<Experiment> experiment = ParseExperiment(
        "model: hf:TinyLlama/TinyLlama_v1.1@v1.0\ninit: pretrained\ndata: {path: t.jsonl}\n",
        (FixtureDir() / "x.yaml").string(), options);
    ASSERT_TRUE(experiment.ok()) << experiment.status().message();
    // Never resolved as a path beside the file.
    EXPECT_EQ(experiment->trials[0].config.GetString("model"), "hf:TinyLlama/TinyLlama_v1.1@v1.0");

    experiment = ParseExperiment("model: hf:no-org\ndata: {path: t.jsonl}\n", "exp.yaml", options);
    ASSERT_FALSE(experiment.ok());
    EXPECT_EQ(
        experiment.status().message().rfind("exp.yaml:1:1: model hf:no-org: 'no-org' is not a "
                                            "Hugging Face repository id",
                                            0),
        0u)
        << experiment.status().message();
  }
}

TEST(ParseExperimentTest, PresetNamesWinOverDirectories) {
  // A preset never becomes a path, even when a directory of that name might exist beside the file.
  const Experiment experiment = MustParse("model: open_llama_3b\ndata: {path: t.jsonl}\n",
                                          (FixtureDir() / "x.yaml").string());
  EXPECT_EQ(experiment.trials[0].config.GetString("model"), "open_llama_3b");
}

TEST(ParseExperimentTest, NeverThrowsOnOddInput) {
  const std::string_view inputs[] = {
      "{",
      "]",
      "a: [",
      "? [a, b]\n: c\n",
      "&a [*a]",
      "!!binary x",
      "- - - -",
      "data: ~",
      "trials: ~",
      "sweep: ~",
      "sweep: []",
      "target: {a: [1]}",
      "\xff\xfe",
      "name: ''",
      "trials:\n  - ~\n",
      "trials:\n  - name: [a]\n",
      "data: {path: t.jsonl}\nsweep: {seed: [~]}\n",
      "data: {path: t.jsonl}\ntrials: [{name: a, set: ~}]\n",
      std::string_view("data:\0x", 7),
  };
  for (std::string_view input : inputs) {
    StatusOr<Experiment> experiment = ParseExperiment(input, "odd.yaml");
    if (!experiment.ok()) {
      EXPECT_EQ(experiment.status().message().rfind("odd.yaml:", 0), 0u)
          << experiment.status().message();
    }
  }
}

TEST(ParseExperimentTest, DocumentBoundaries) {
  EXPECT_EQ(ParseError(""),
            "exp.yaml:1:1: the experiment file is empty; it needs at least the "
            "training data, e.g. `data: {path: train.jsonl}`");
  EXPECT_EQ(
      ParseError("# nothing yet\n---\n").rfind("exp.yaml:1:1: the experiment file is empty", 0),
      0u);
  EXPECT_EQ(ParseError("~\n").rfind("exp.yaml:1:1: expected a map of keys at the top level", 0),
            0u);
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\n---\nseed: 1\n"),
            "exp.yaml:2:1: expected one YAML document, found another after '---'; put each "
            "experiment in its own file");
  MustParse("---\ndata: {path: t.jsonl}\n...\n");
  MustParse("data: {path: t.jsonl}\n---\n");  // a trailing marker alone is harmless
}

TEST(ParseExperimentTest, InputThatHangsYamlCppLoadAllIsAnError) {
  // yaml-cpp 0.7's LoadAll never returns on these (jbeder/yaml-cpp#1040).
  EXPECT_EQ(ParseError(","), "exp.yaml:1:1: YAML syntax error: unexpected ','");
  EXPECT_EQ(ParseError(",a: 1\n"), "exp.yaml:1:1: YAML syntax error: unexpected ','");
}

std::string Repeated(std::string_view text, int times) {
  std::string repeated;
  for (int i = 0; i < times; ++i) repeated += text;
  return repeated;
}

// yaml-cpp refuses lists and maps nested 500 deep with the message "bad file".
TEST(ParseExperimentTest, DeepNestingIsNamed) {
  for (const std::string& text :
       {"x: " + std::string(100000, '[') + std::string(100000, ']') + "\n",
        "x: " + Repeated("{a: ", 600) + "1" + std::string(600, '}') + "\n"}) {
    const std::string error = ParseError(text);
    EXPECT_EQ(error.rfind("exp.yaml:1:", 0), 0u) << error;
    EXPECT_NE(
        error.find(": lists and maps nested 500 levels deep, more than the YAML reader takes"),
        std::string::npos)
        << error;
  }
}

// A 4 MB list of numbers took 900 MB of yaml-cpp's nodes before its key was found unknown.
TEST(ParseExperimentTest, MoreThanTheValuesAFileHoldsIsAnError) {
  const std::string error =
      ParseError("data: {path: t.jsonl}\nx: [" + Repeated("1,", 100'000) + "1]\n");
  EXPECT_EQ(error.rfind("exp.yaml:2:", 0), 0u) << error;
  EXPECT_NE(error.find(": more than 100000 values (scalars, lists and maps) in one file"),
            std::string::npos)
      << error;
}

// Found by tests/fuzz/experiment_fuzz.cc: a value that is not UTF-8 was accepted, and writing the
// trial's config as JSON (checkpoints) then threw; yaml-cpp's messages quoted such bytes raw.
TEST(ParseExperimentTest, TextMustBeUtf8) {
  EXPECT_EQ(ParseError("data: {path: t\xff\xfe.jsonl}\n"),
            "exp.yaml:1:14: text that is not valid UTF-8; experiment files must be UTF-8 text");
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\ntrials:\n  - name: a\n    description: \xc3\x28\n"),
            "exp.yaml:4:18: text that is not valid UTF-8; experiment files must be UTF-8 text");
  EXPECT_EQ(ParseError("data: {path: t.jsonl}\n\xed\xa0\x80: 1\n"),  // a UTF-8 surrogate
            "exp.yaml:2:1: text that is not valid UTF-8; experiment files must be UTF-8 text");
  EXPECT_EQ(ParseError(std::string_view("data: {path: t.jsonl}\ntrain.\0\xfa\n", 31)),
            "exp.yaml:2:9: YAML syntax error: unknown escape character: \\xFA");
  const Experiment experiment =
      MustParse("data: {path: \"caf\xc3\xa9 \\U0001F642.jsonl\"}\ndescription: \xe2\x98\x83\n");
  EXPECT_EQ(experiment.trials[0].config.GetString("data.path"),
            "caf\xc3\xa9 \xf0\x9f\x99\x82.jsonl");
  EXPECT_NO_THROW((void)experiment.trials[0].config.ToJson().dump());
}

TEST(LoadExperimentFileTest, MissingFileIsNotFound) {
  StatusOr<Experiment> experiment = LoadExperimentFile("/no/such/experiment.yaml");
  ASSERT_FALSE(experiment.ok());
  EXPECT_EQ(experiment.status().code(), StatusCode::kNotFound);
  EXPECT_NE(experiment.status().message().find("/no/such/experiment.yaml"), std::string::npos);
}

TEST(LoadExperimentFileTest, GoodFixturesParse) {
  StatusOr<Experiment> experiment =
      LoadExperimentFile((FixtureDir() / "good" / "single_gpu_lab.yaml").string());
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  EXPECT_EQ(experiment->name, "single-gpu-lab");
  EXPECT_EQ(experiment->target.at("flavor"), "g1.h100.pci.1");
  EXPECT_EQ(TrialNames(*experiment),
            (std::vector<std::string>{
                "baseline/data.max_seq_length=256", "baseline/data.max_seq_length=512",
                "reduced-batch/data.max_seq_length=256", "reduced-batch/data.max_seq_length=512",
                "bf16/data.max_seq_length=256", "bf16/data.max_seq_length=512"}));
  const TrialConfig& baseline = experiment->trials[1].config;
  EXPECT_EQ(baseline.GetInt("train.micro_batch_size"), 32);
  EXPECT_EQ(baseline.GetInt("train.global_batch_size"), 32);
  EXPECT_EQ(baseline.GetInt("data.max_seq_length"), 512);
  EXPECT_EQ(baseline.GetString("init"), "pretrained");
  EXPECT_EQ(baseline.GetString("data.path"),
            (FixtureDir() / "good" / "data" / "train.jsonl").string());
  EXPECT_EQ(experiment->trials[4].config.GetString("precision"), "bf16-true");
  EXPECT_EQ(experiment->trials[0].expect, "oom");
}

// Every broken fixture fails with its .expected text, located in that file: "FILE:LINE:COLUMN:
// ...".
TEST(BrokenExperimentCorpusTest, EachFileFailsWithItsExpectedMessage) {
  const fs::path dir = FixtureDir() / "broken";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 40u);
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.filename().string());
    fs::path expected_file = file;
    expected_file.replace_extension(".expected");
    ASSERT_TRUE(fs::exists(expected_file))
        << "add " << expected_file.filename() << " beside the fixture";
    const std::string expected = TrimNewlines(ReadFile(expected_file));
    ASSERT_FALSE(expected.empty());
    StatusOr<Experiment> experiment = LoadExperimentFile(file.string());
    ASSERT_FALSE(experiment.ok()) << "parsed, but should fail with: " << expected;
    const std::string& message = experiment.status().message();
    EXPECT_EQ(experiment.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(message.rfind(file.string() + ":", 0), 0u) << message;
    EXPECT_NE(message.find(expected), std::string::npos)
        << "message: " << message << "\nexpected: " << expected;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

TEST(LocalPathsTest, InputPathsAndWhereTheyResolve) {
  const KeySpec& model = *FindTrialKey("model");
  EXPECT_FALSE(IsPathValue(model, "tinyllama-1.1b"));     // a preset
  EXPECT_FALSE(IsPathValue(model, "blip2-flan-t5-xxl"));  // a BLIP-2 preset
  EXPECT_TRUE(IsPathValue(model, "models/cpu-lab-small"));
  EXPECT_TRUE(IsInputPathValue(*FindTrialKey("data.path"), "x.jsonl"));
  EXPECT_TRUE(IsPathValue(*FindTrialKey("output_dir"), "out"));
  EXPECT_FALSE(IsInputPathValue(*FindTrialKey("output_dir"), "out"));  // written, not read
  EXPECT_FALSE(IsPathValue(*FindTrialKey("precision"), "bf16-true"));

  const std::string demo = (SourceDir() / "experiments" / "demo.yaml").string();
  EXPECT_EQ(ResolveLocalPath(demo, "data/alpaca-demo.jsonl"),
            (SourceDir() / "experiments" / "data" / "alpaca-demo.jsonl").string());
  EXPECT_EQ(ResolveLocalPath(demo, "data/absent.jsonl"), "data/absent.jsonl");
  EXPECT_EQ(ResolveLocalPath(demo, "/abs/path"), "/abs/path");
  EXPECT_EQ(ResolveLocalPath("demo.yaml", "data/x.jsonl"), "data/x.jsonl");  // no folder to try
}

TEST(LocalPathsTest, NodePathsStayAsWrittenAndMustBeAbsolute) {
  EXPECT_FALSE(IsInputPathValue(*FindTrialKey("data.path"), "node:/data/x.jsonl"));
  EXPECT_FALSE(IsInputPathValue(*FindTrialKey("model"), "node:/models/llama"));
  // Never resolved beside the file, in either mode; a model only the node has is taken on trust.
  for (const bool resolve : {true, false}) {
    StatusOr<Experiment> experiment = ParseExperiment(
        "model: node:/models/llama\ninit: pretrained\ndata: {path: node:/data/x.jsonl}\n",
        (SourceDir() / "experiments" / "demo.yaml").string(), {.resolve_local_paths = resolve});
    ASSERT_TRUE(experiment.ok()) << experiment.status().message();
    EXPECT_EQ(experiment->trials[0].config.GetString("model"), "node:/models/llama");
    EXPECT_EQ(experiment->trials[0].config.GetString("data.path"), "node:/data/x.jsonl");
  }
  StatusOr<Experiment> relative =
      ParseExperiment("model: llmctl-demo\ndata: {path: node:x.jsonl}\n", "exp.yaml");
  ASSERT_FALSE(relative.ok());
  EXPECT_EQ(relative.status().message(),
            "exp.yaml:2:14: data.path: 'node:x.jsonl': a node path must be absolute "
            "(node:/data/train.jsonl)");
}

TEST(ParseExperimentTest, AnchorsAliasesAndTagsAreRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {"model: &m llmctl-demo\ndata: {path: x.jsonl}\n", "exp.yaml:1:8: YAML anchor (&name)"},
      {"a: &a [1]\nmodel: *a\n", "exp.yaml:1:4: YAML anchor (&name)"},
      {"model: !!python/object/apply:os.system [ls]\n",
       "exp.yaml:1:8: YAML tag '!!python/object/apply:os.system'"},
      {"data: {path: !!binary aGVsbG8=}\nmodel: llmctl-demo\n",
       "exp.yaml:1:14: YAML tag '!!binary'"},
      {"model: !custom llmctl-demo\n", "exp.yaml:1:8: YAML tag '!custom'"},
  };
  for (const auto& [yaml, expected] : cases) {
    StatusOr<Experiment> experiment = ParseExperiment(yaml, "exp.yaml");
    ASSERT_FALSE(experiment.ok()) << yaml;
    EXPECT_EQ(experiment.status().message().rfind(expected, 0), 0u)
        << experiment.status().message();
  }
  // Quoted and plain scalars carry yaml-cpp's non-specific tags, which are fine.
  EXPECT_TRUE(
      ParseExperiment("model: 'llmctl-demo'\ndata: {path: \"x.jsonl\"}\n", "exp.yaml").ok());
}

TEST(LoadExperimentFileTest, NonRegularFilesAreRefusedAtOnce) {
  for (const char* path : {"/dev/zero", "/dev/null", "/"}) {
    StatusOr<Experiment> experiment = LoadExperimentFile(path);
    ASSERT_FALSE(experiment.ok()) << path;
    EXPECT_EQ(experiment.status().code(), StatusCode::kInvalidArgument) << path;
    EXPECT_NE(experiment.status().message().find("not a regular file"), std::string::npos)
        << experiment.status().message();
  }
}

TEST(NameFromTest, RunsOfWhatANameMayNotHoldBecomeOneDash) {
  EXPECT_EQ(NameFrom("my model: 'q' #1"), "my-model-q-1");
  EXPECT_EQ(NameFrom("exp\u00e9riences/"), "exp-riences");
  EXPECT_EQ(NameFrom("-lead_x.y"), "-lead_x.y");
  EXPECT_EQ(NameFrom(" #: "), "");
  EXPECT_EQ(NameFrom(std::string(150, 'a')), std::string(100, 'a'));
}

}  // namespace
}  // namespace llmctl
