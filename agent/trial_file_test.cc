// What a trial becomes on the node: the one-trial experiment file llm-train runs (the stored
// config, the node's input paths, output_dir kept inside the run's output/), and the check of its
// ranks against one node's.
#include "agent/trial_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include "agent/agent_test_support.h"
#include "agent/run_checks.h"
#include "agent/runs.h"
#include "common/experiment.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
using test_support::FreshTestDir;

TEST(RunChecksTest, OneNodeRunsAtMostMaxRanksRanks) {
  TrialFile trial_file;
  trial_file.device = "cpu";
  trial_file.ranks = kMaxRanks;
  EXPECT_TRUE(CheckTrialPlacement(RunRequest{}, trial_file).ok());
  trial_file.ranks = kMaxRanks + 1;
  EXPECT_EQ(CheckTrialPlacement(RunRequest{}, trial_file).message(),
            "the trial's 1025 ranks are more than 1024 on one node");
}

TEST(TrialFileTest, InputsReplaceValuesUnsetKeysAreLeftOutAndLlmTrainParsesIt) {
  const fs::path dir = FreshTestDir("trial_file");
  auto experiment = LoadExperimentFile("experiments/demo.yaml");
  ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
  TrialConfig config = experiment->trials.front().config;
  ASSERT_TRUE(config.Set("train.max_steps", int64_t{2}).ok());
  const std::string data = (dir / "data.jsonl").string();
  auto file = MakeTrialFile(config.ToJson().dump(), {{"data.path", data}}, (dir / "out").string());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->device, "cpu");
  // Messages about the copy name what the experiment wrote (llm-train --input-name).
  const std::map<std::string, std::string> names = {{data, config.GetString("data.path")}};
  EXPECT_EQ(file->input_names, names);
  EXPECT_EQ(file->yaml.find("null"), std::string::npos) << file->yaml;
  EXPECT_EQ(file->yaml.find("device_memory"), std::string::npos)
      << "keys the experiment did not set are left out";
  std::ofstream(dir / "trial.yaml") << file->yaml;
  // What llm-train does with --config: parse the file as an experiment.
  auto parsed = LoadExperimentFile((dir / "trial.yaml").string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << file->yaml;
  ASSERT_EQ(parsed->trials.size(), 1u);
  const TrialConfig& trial = parsed->trials.front().config;
  EXPECT_EQ(trial.GetString("data.path"), data);
  EXPECT_EQ(trial.GetString("output_dir"), (dir / "out").string());
  EXPECT_EQ(trial.GetInt("train.max_steps"), 2);
  EXPECT_EQ(trial.GetFloat("train.lr"), config.GetFloat("train.lr"));
  EXPECT_EQ(trial.GetFloatList("train.betas"), config.GetFloatList("train.betas"));
  EXPECT_EQ(trial.GetString("tokenizer"), config.GetString("tokenizer"));
  fs::remove_all(dir);
}

TEST(TrialFileTest, TheFileSetsExactlyTheKeysTheExperimentSet) {
  const fs::path dir = FreshTestDir("trial_file_keys");
  TrialConfig config;
  for (const auto& [key, value] : {std::pair{"model", "llmctl-demo"},
                                   {"peft.method", "lora"},
                                   {"peft.r", "4"},
                                   {"precision", "32-true"},  // its default, written explicitly
                                   {"device_memory", ""}}) {  // cleared
    ASSERT_TRUE(config.SetFromText(key, value).ok()) << key;
  }
  const std::string data = (dir / "data.jsonl").string();
  auto file = MakeTrialFile(config.ToJson().dump(), {{"data.path", data}}, (dir / "out").string());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->yaml.find("peft.compute_dtype"), std::string::npos) << file->yaml;
  std::ofstream(dir / "trial.yaml") << file->yaml;
  auto parsed = LoadExperimentFile((dir / "trial.yaml").string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << file->yaml;
  const TrialConfig& trial = parsed->trials.front().config;
  ASSERT_TRUE(config.Set("data.path", data).ok());
  ASSERT_TRUE(config.Set("output_dir", (dir / "out").string()).ok());
  EXPECT_TRUE(trial == config);
  for (const KeySpec& spec : TrialKeys()) {
    EXPECT_EQ(trial.IsSet(spec.name), config.IsSet(spec.name)) << spec.name << "\n" << file->yaml;
  }
  fs::remove_all(dir);
}

TEST(TrialFileTest, BadConfigsAndInputsAreNamed) {
  EXPECT_EQ(MakeTrialFile("[1]", {}, "/o").status().code(), StatusCode::kInvalidArgument);
  auto unknown = MakeTrialFile(R"({"train": {"lrr": 1}})", {}, "/o");
  EXPECT_NE(unknown.status().message().find("lrr"), std::string::npos)
      << unknown.status().message();
  auto not_a_path = MakeTrialFile("{}", {{"train.lr", "/x"}}, "/o");
  EXPECT_NE(not_a_path.status().message().find("train.lr"), std::string::npos);
}

// The cache keeps an input once by its content: two keys written differently may land on one path,
// which llm-train's --input-name names one way: both spellings, in the keys' order.
TEST(TrialFileTest, OnePathUnderTwoWrittenNamesIsNamedByBoth) {
  const std::string cached = "/cache/trees/d1/models-x";
  const std::map<std::string, std::string> inputs = {{"model", cached}, {"tokenizer", cached}};
  auto both = MakeTrialFile(R"({"model": "models/x", "tokenizer": "./models/x"})", inputs, "/o");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->input_names,
            (std::map<std::string, std::string>{{cached, "models/x or ./models/x"}}));
  // Each spelling once, however many keys wrote it.
  const std::map<std::string, std::string> three = {
      {"data.path", cached}, {"model", cached}, {"tokenizer", cached}};
  auto twice = MakeTrialFile(
      R"({"data": {"path": "./models/x"}, "model": "models/x", "tokenizer": "./models/x"})", three,
      "/o");
  ASSERT_TRUE(twice.ok()) << twice.status().ToString();
  EXPECT_EQ(twice->input_names,
            (std::map<std::string, std::string>{{cached, "./models/x or models/x"}}));
  auto one = MakeTrialFile(R"({"model": "models/x", "tokenizer": "models/x"})", inputs, "/o");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->input_names, (std::map<std::string, std::string>{{cached, "models/x"}}));
}

// The agent runs trials as root and does not trust the controller's check: output_dir is a path
// inside the run's output/ or the run is refused.
TEST(TrialFileTest, OutputDirStaysInsideTheRunsOutputDirectory) {
  // The trial file's output_dir line (the file holds no other path).
  auto within = [](const std::string& config_json) -> StatusOr<std::string> {
    ASSIGN_OR_RETURN(TrialFile file, MakeTrialFile(config_json, {}, "/r/output"));
    const size_t start = file.yaml.find("output_dir: ");
    if (start == std::string::npos) return InternalError("no output_dir in " + file.yaml);
    return file.yaml.substr(start, file.yaml.find('\n', start) - start);
  };
  EXPECT_EQ(*within(R"({"output_dir": "out"})"), "output_dir: /r/output/out");
  EXPECT_EQ(*within(R"({"output_dir": "./a/../b/"})"), "output_dir: /r/output/b");
  EXPECT_EQ(*within(R"({"output_dir": "."})"), "output_dir: /r/output");
  EXPECT_EQ(*within("{}"), "output_dir: /r/output");
  for (const auto& [output_dir, why] :
       {std::pair<std::string, std::string>{"/elsewhere", "is an absolute path"},
        {"..", "climbs out of output/"},
        {"a/../../checkpoints", "climbs out of output/"},
        {"node:/scratch/out", "is a node path"}}) {
    StatusOr<std::string> refused = within(R"({"output_dir": ")" + output_dir + R"("})");
    ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << output_dir;
    EXPECT_NE(refused.status().message().find("output_dir: '" + output_dir + "' " + why),
              std::string::npos)
        << refused.status().message();
  }
}

}  // namespace
}  // namespace llmctl::agent
