// The rules for a --runs file (series.h), the user's own JSON lines: each test fails when the rule
// it names is removed.
#include "trainer/cli/series.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/experiment.h"
#include "common/trial_settings.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::llm_train {
namespace {

namespace fs = std::filesystem;

// Trials `a` and `b` of the built-in demo model, which resolves without files.
Experiment Lab() {
  StatusOr<Experiment> experiment = ParseExperiment(
      "model: llmctl-demo\n"
      "init: random\n"
      "tokenizer: tokenizer.json\n"
      "data: {path: train.jsonl}\n"
      "train: {micro_batch_size: 2, max_steps: 10}\n"
      "trials:\n"
      "  - name: a\n"
      "  - name: b\n"
      "    set: {precision: bf16-true}\n",
      "lab.yaml");
  EXPECT_TRUE(experiment.ok()) << experiment.status().message();
  return experiment.ok() ? *experiment : Experiment{};
}

// --config lab.yaml --trial a --set train.max_steps=3, as a --runs line finds them.
TrialArgs Args() {
  TrialArgs args;
  args.config_path = "lab.yaml";
  args.trial_name = "a";
  args.overrides = {"train.max_steps=3"};
  return args;
}

// Why `line` is refused ("" when it is not).
std::string Refusal(const std::string& line, const TrialArgs& args = Args()) {
  StatusOr<SeriesRun> run = ParseSeriesLine(line, Lab(), args);
  if (run.ok()) return "";
  EXPECT_EQ(run.status().code(), StatusCode::kInvalidArgument);
  return run.status().message();
}

TEST(ParseSeriesLineTest, ALineRunsTheFlagsTrialWithTheFlagsSetsThenItsOwn) {
  StatusOr<SeriesRun> run = ParseSeriesLine(
      R"({"events": "e.jsonl", "set": ["train.micro_batch_size=1"]})", Lab(), Args());
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(run->events_path, "e.jsonl");
  EXPECT_EQ(run->config.settings().memory.precision, trial::Precision::k32True);
  EXPECT_EQ(run->config.settings().train.max_steps, 3);
  EXPECT_EQ(run->config.settings().train.micro_batch_size, 1);
}

TEST(ParseSeriesLineTest, ALinesTrialAndSetComeAfterTheFlags) {
  StatusOr<SeriesRun> run = ParseSeriesLine(
      R"({"events": "e.jsonl", "trial": "b", "set": ["train.max_steps=5"]})", Lab(), Args());
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(run->config.settings().memory.precision, trial::Precision::kBf16True);
  EXPECT_EQ(run->config.settings().train.max_steps, 5);
}

TEST(ParseSeriesLineTest, ALineIsAJsonObject) {
  for (const std::string line : {"[]", "\"events\"", "{\"events\": ", "events=e.jsonl"}) {
    SCOPED_TRACE(line);
    EXPECT_TRUE(Refusal(line).starts_with("expected a JSON object {\"events\": FILE"));
  }
}

TEST(ParseSeriesLineTest, AnUnknownKeyIsRefused) {
  EXPECT_EQ(Refusal(R"({"events": "e.jsonl", "sets": []})"),
            "unknown key \"sets\" (events, trial, set)");
}

TEST(ParseSeriesLineTest, EventsMustNameAFile) {
  for (const std::string line : {R"({"set": []})", R"({"events": ""})", R"({"events": 1})"}) {
    SCOPED_TRACE(line);
    EXPECT_EQ(Refusal(line), "\"events\" must name the run's events file");
  }
}

TEST(ParseSeriesLineTest, TrialMustBeAName) {
  EXPECT_EQ(Refusal(R"({"events": "e.jsonl", "trial": ["b"]})"), "\"trial\" is not a name");
  EXPECT_EQ(Refusal(R"({"events": "e.jsonl", "trial": "c"})"), "lab.yaml: no trial named 'c'");
}

TEST(ParseSeriesLineTest, SetMustBeAListOfStrings) {
  for (const std::string line : {R"({"events": "e.jsonl", "set": "train.max_steps=1"})",
                                 R"({"events": "e.jsonl", "set": ["train.max_steps=1", 2]})"}) {
    SCOPED_TRACE(line);
    EXPECT_EQ(Refusal(line), "\"set\" must be a list of \"key=value\" strings");
  }
}

TEST(ParseSeriesLineTest, ASetIsCheckedAsSetIs) {
  EXPECT_TRUE(Refusal(R"({"events": "e.jsonl", "set": ["nope=1"]})").starts_with("--set nope=1: "));
}

// The trial after its sets, as llm-train would validate a trial of its own.
TEST(ParseSeriesLineTest, TheRunsTrialIsValidated) {
  EXPECT_TRUE(Refusal(R"({"events": "e.jsonl", "set": ["train.global_batch_size=3"]})")
                  .starts_with("train.global_batch_size (3) must be a multiple of "
                               "train.micro_batch_size (2)"));
}

TEST(ParseSeriesLineTest, ADataParallelTrialIsRefused) {
  EXPECT_EQ(
      Refusal(
          R"({"events": "e.jsonl", "set": ["strategy=ddp", "devices=2", "train.global_batch_size=4"]})"),
      "a data-parallel trial's ranks each need a process: run it on its own with --nproc");
}

fs::path WriteRuns(const std::string& name, const std::string& text) {
  const fs::path path = fs::path(trainer::testing::FreshTempDir("series-" + name)) / "runs.jsonl";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(ReadSeriesTest, EveryLineIsARunBlankLinesAside) {
  TrialArgs args = Args();
  args.runs_path = WriteRuns("ok",
                             "{\"events\": \"1.jsonl\"}\n \t\r\n\n{\"events\": \"2.jsonl\", "
                             "\"trial\": \"b\"}\n")
                       .string();
  StatusOr<std::vector<SeriesRun>> runs = ReadSeries(Lab(), args);
  ASSERT_TRUE(runs.ok()) << runs.status().message();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].events_path, "1.jsonl");
  EXPECT_EQ((*runs)[1].events_path, "2.jsonl");
}

// The file is refused whole, naming the first bad line by its number in the file.
TEST(ReadSeriesTest, TheFirstBadLineRefusesTheFile) {
  TrialArgs args = Args();
  args.runs_path =
      WriteRuns("bad", "{\"events\": \"1.jsonl\"}\n\n{\"events\": 2}\n{\"nope\": 1}\n").string();
  StatusOr<std::vector<SeriesRun>> runs = ReadSeries(Lab(), args);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runs.status().message(),
            "--runs " + args.runs_path + ":3: \"events\" must name the run's events file");
}

TEST(ReadSeriesTest, AFileOfNoRunsIsRefused) {
  TrialArgs args = Args();
  args.runs_path = WriteRuns("empty", "\n  \n").string();
  StatusOr<std::vector<SeriesRun>> runs = ReadSeries(Lab(), args);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().message(), "--runs " + args.runs_path + ": no runs");
}

TEST(ReadSeriesTest, AFileThatCannotBeReadIsRefused) {
  TrialArgs args = Args();
  args.runs_path =
      (fs::path(trainer::testing::FreshTempDir("series-missing")) / "runs.jsonl").string();
  StatusOr<std::vector<SeriesRun>> runs = ReadSeries(Lab(), args);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().message(), "--runs " + args.runs_path + ": cannot read it");
}

}  // namespace
}  // namespace llmctl::llm_train
