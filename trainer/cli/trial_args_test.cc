// The rules for llm-train's --trial, --set and --input-name values (trial_args.h): each test fails
// when the rule it names is removed.
#include "trainer/cli/trial_args.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/experiment.h"
#include "common/text.h"
#include "common/trial_settings.h"

namespace llmctl::llm_train {
namespace {

// `yaml`, parsed as the experiment file lab.yaml.
Experiment Parse(std::string_view yaml) {
  StatusOr<Experiment> experiment = ParseExperiment(yaml, "lab.yaml");
  EXPECT_TRUE(experiment.ok()) << experiment.status().message();
  return experiment.ok() ? *experiment : Experiment{};
}

constexpr std::string_view kOneTrial = "data: {path: train.jsonl}\n";
constexpr std::string_view kTwoTrials =
    "data: {path: train.jsonl}\n"
    "trials:\n"
    "  - name: a\n"
    "  - name: b\n"
    "    set: {precision: bf16-true}\n";

TEST(PickTrialTest, AFileOfOneTrialNeedsNoName) {
  const Experiment experiment = Parse(kOneTrial);
  StatusOr<const Trial*> trial = PickTrial(experiment, "lab.yaml", "");
  ASSERT_TRUE(trial.ok()) << trial.status().message();
  EXPECT_EQ(*trial, &experiment.trials.front());
}

TEST(PickTrialTest, AFileOfSeveralTrialsNeedsTrialAndNamesThem) {
  const Experiment experiment = Parse(kTwoTrials);
  StatusOr<const Trial*> trial = PickTrial(experiment, "lab.yaml", "");
  ASSERT_FALSE(trial.ok());
  EXPECT_EQ(trial.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(trial.status().message(), "lab.yaml has 2 trials; choose one with --trial (a, b)");
}

TEST(PickTrialTest, TrialPicksTheOneOfThatName) {
  const Experiment experiment = Parse(kTwoTrials);
  StatusOr<const Trial*> trial = PickTrial(experiment, "lab.yaml", "b");
  ASSERT_TRUE(trial.ok()) << trial.status().message();
  EXPECT_EQ((*trial)->name, "b");
  EXPECT_EQ((*trial)->config.settings().memory.precision, trial::Precision::kBf16True);
}

TEST(PickTrialTest, ANameTheFileLacksIsRefused) {
  const Experiment experiment = Parse(kTwoTrials);
  StatusOr<const Trial*> trial = PickTrial(experiment, "lab.yaml", "c");
  ASSERT_FALSE(trial.ok());
  EXPECT_EQ(trial.status().message(), "lab.yaml: no trial named 'c'");
}

TrialConfig OneTrialConfig() { return Parse(kOneTrial).trials.front().config; }

TEST(ApplyOverridesTest, EachAssignmentSetsItsKeyTheLastWinning) {
  TrialConfig config = OneTrialConfig();
  ASSERT_TRUE(
      ApplyOverrides({"train.max_steps=3", "train.micro_batch_size=2", "train.max_steps=5"}, config)
          .ok());
  EXPECT_EQ(config.settings().train.max_steps, 5);
  EXPECT_EQ(config.settings().train.micro_batch_size, 2);
}

TEST(ApplyOverridesTest, AnAssignmentWithoutEqualsIsRefused) {
  TrialConfig config = OneTrialConfig();
  const Status status = ApplyOverrides({"train.max_steps"}, config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "--set expects key=value, got 'train.max_steps'");
}

TEST(ApplyOverridesTest, OnlyTheFirstEqualsEndsTheKey) {
  TrialConfig config = OneTrialConfig();
  ASSERT_TRUE(ApplyOverrides({"output_dir=/tmp/a=b"}, config).ok());
  EXPECT_EQ(config.settings().output.dir, "/tmp/a=b");
}

TEST(ApplyOverridesTest, ARefusedValueNamesItsAssignment) {
  TrialConfig config = OneTrialConfig();
  const Status status = ApplyOverrides({"nope=1"}, config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(status.message().starts_with("--set nope=1: ")) << status.message();
}

// The user's text is quoted on one line and cut short: no newline of theirs breaks the message.
TEST(ApplyOverridesTest, AnAssignmentIsQuotedOnOneLineAndShort) {
  TrialConfig config = OneTrialConfig();
  const std::string assignment = "no\nequals" + std::string(1000, 'x');
  const Status status = ApplyOverrides({assignment}, config);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message().find('\n'), std::string::npos) << status.message();
  EXPECT_LT(status.message().size(), 300u) << status.message();
  EXPECT_NE(status.message().find(OnOneLine(assignment, 200)), std::string::npos);
}

TEST(ApplyOverridesTest, NodePathsBecomeLocal) {
  TrialConfig config = OneTrialConfig();
  ASSERT_TRUE(ApplyOverrides({"data.path=node:/data/train.jsonl"}, config).ok());
  EXPECT_EQ(config.settings().data.path, "/data/train.jsonl");
}

TEST(ApplyOverridesTest, TheLabsSpellingsBecomeLlmctls) {
  TrialConfig config = OneTrialConfig();
  ASSERT_TRUE(ApplyOverrides({"optimizer=adam_8bit"}, config).ok());
  EXPECT_EQ(config.settings().train.optimizer, trial::Optimizer::kAdamw8bit);
}

TEST(ParseInputNamesTest, EachEntryMapsItsPathToItsName) {
  StatusOr<std::map<std::string, std::string>> names = ParseInputNames(
      {InputNameArgument("/cache/a=b", "data/train.jsonl"), "/cache/t.json=tokenizer.json"});
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, (std::map<std::string, std::string>{{"/cache/a=b", "data/train.jsonl"},
                                                        {"/cache/t.json", "tokenizer.json"}}));
}

TEST(ParseInputNamesTest, AnEntryWithoutPathOrNameIsRefused) {
  for (const std::string entry : {"/cache/a", "=name", "/cache/a=", "/cache/\\a=name"}) {
    SCOPED_TRACE(entry);
    StatusOr<std::map<std::string, std::string>> names = ParseInputNames({entry});
    ASSERT_FALSE(names.ok());
    EXPECT_EQ(names.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(names.status().message().starts_with("--input-name expects PATH=NAME"));
    EXPECT_TRUE(names.status().message().ends_with("got '" + entry + "'"));
  }
}

TEST(ParseInputNamesTest, APathGivenTwoNamesIsRefusedAndTheSameEntryTwiceIsTaken) {
  StatusOr<std::map<std::string, std::string>> names =
      ParseInputNames({"/cache/t.json=tokenizer.json", "/cache/d=data/train.jsonl",
                       "/cache/t.json=other/tokenizer.json"});
  ASSERT_FALSE(names.ok());
  EXPECT_EQ(names.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(names.status().message(),
            "--input-name names '/cache/t.json' twice: 'tokenizer.json' and "
            "'other/tokenizer.json'");
  names = ParseInputNames({"/cache/t.json=tokenizer.json", "/cache/t.json=tokenizer.json"});
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, (std::map<std::string, std::string>{{"/cache/t.json", "tokenizer.json"}}));
}

}  // namespace
}  // namespace llmctl::llm_train
