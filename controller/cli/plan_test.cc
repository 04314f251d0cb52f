// `llmctl plan`: the search's answer, its errors, and the experiment file --write emits, run
// through the real llm-train under the plan's device budget.
#include "controller/cli/plan.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/byte_size.h"
#include "common/estimate/gpus.h"
#include "common/estimate/memory_verdict.h"
#include "common/experiment.h"
#include "common/files.h"
#include "controller/cli/commands.h"
#include "controller/cli/inputs.h"
#include "controller/cli/offline_cli_test.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Source() { return llmctl::testing::SourceDir().string(); }

class PlanTest : public testing::OfflineCliTest {
 protected:
  // Runs `llmctl plan ARGS...` in-process.
  int Llmctl(std::vector<std::string> args) { return RunOffline("plan", std::move(args)); }

  // The CPU lab's large stand-in under the lab's device budget: full fine-tuning fits only in
  // bf16-true with 8-bit AdamW, the rest only with adapters.
  std::vector<std::string> CpuLabLarge() {
    return {Source() + "/experiments/models/cpu-lab-large",
            "--device",
            "cpu",
            "--device-memory",
            "216MiB",
            "--seq",
            "128",
            "--global-batch",
            "8",
            "--steps",
            "3"};
  }
};

TEST_F(PlanTest, RanksWhatFitsFastestFirstAndSaysWhyTheRestWereDropped) {
  std::vector<std::string> args = CpuLabLarge();
  args.insert(args.end(), {"--format", "json"});
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  const json plan = json::parse(out_.str());
  EXPECT_EQ(plan["searched"], 3 * 2 * 3 * 2 * 2);  // precision, optimizer, peft, ckpt, offload
  ASSERT_FALSE(plan["fits"].empty());
  EXPECT_EQ(plan["fits"].size() + plan["dropped"].size(), plan["searched"].get<size_t>());
  double previous = 0;
  for (const json& row : plan["fits"]) {
    EXPECT_LE(row["peak_bytes"].get<uint64_t>(), uint64_t{216} << 20) << row.dump();
    // Fastest first (ties within 0.5% are ordered by peak).
    EXPECT_GE(row["trial_seconds"].get<double>(), previous * 0.995) << row.dump();
    previous = row["trial_seconds"].get<double>();
  }
  // fp32 full fine-tuning with AdamW cannot fit: its weights, gradients and moments alone take
  // 16 B x 31.4M parameters.
  bool fp32_adamw_dropped = false;
  for (const json& drop : plan["dropped"]) {
    if (drop["name"] == "32-true-adamw") {
      fp32_adamw_dropped = true;
      EXPECT_NE(drop["reason"].get<std::string>().find("out of memory at micro-batch 1"),
                std::string::npos);
    }
  }
  EXPECT_TRUE(fp32_adamw_dropped) << out_.str();

  // The table says the same, with the dropped configurations grouped by reason.
  ASSERT_EQ(Llmctl(CpuLabLarge()), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("searched 72 configurations"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("32-true-adamw ("), std::string::npos) << out_.str();
}

TEST_F(PlanTest, BadFlagsAreNamed) {
  auto expect_error = [&](std::vector<std::string> args, const std::string& message) {
    EXPECT_EQ(Llmctl(args), kExitInvalidInput) << out_.str();
    EXPECT_NE(err_.str().find(message), std::string::npos) << err_.str();
    EXPECT_EQ(out_.str(), "");
  };
  std::vector<std::string> args = CpuLabLarge();
  args[2] = "a100";
  expect_error(args, "--device: expected a GPU (h100-94gb, ");
  // The list ends at its last GPU, where it ended ", )".
  EXPECT_EQ(err_.str().find(", )"), std::string::npos) << err_.str();
  args = CpuLabLarge();
  args[args.size() - 1] = "-5";
  expect_error(args, "--steps: expected 1 or more");
  args = CpuLabLarge();
  args.resize(args.size() - 2);
  args.insert(args.end(), {"--tokens", "-5"});
  expect_error(args, "--tokens: expected 1 or more");
  // 2^62 sequences of 128 tokens wrapped to 0 tokens a step: SIGFPE dividing --tokens by it.
  args = CpuLabLarge();
  args[args.size() - 3] = "4611686018427387904";
  args.resize(args.size() - 2);
  args.insert(args.end(), {"--tokens", "5"});
  expect_error(args, "train.global_batch_size: 4611686018427387904 is more than 1073741824");
  args = CpuLabLarge();
  args.insert(args.end(), {"--tokens", "1000"});
  expect_error(args, "give the run's length as one of --steps N or --tokens N");
  args = CpuLabLarge();
  args.insert(args.end(), {"--precisions", "fp8"});
  expect_error(args, "--precisions: ");
  args = CpuLabLarge();
  args.insert(args.end(), {"--write", (dir_ / "plan.yaml").string()});
  expect_error(args, "--write needs --data PATH");
  args = CpuLabLarge();
  args[0] = "hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0";
  expect_error(args, "is on the Hugging Face hub");
  args = CpuLabLarge();
  args.insert(args.end(), {"--set", "train.lr"});
  expect_error(args, "--set: expected KEY=VALUE");
  // A base no searched combination mends is refused once, not as each configuration's reason.
  args = CpuLabLarge();
  args.insert(args.end(), {"--set", "data.path="});
  expect_error(args, "llmctl: plan: no configuration is valid: data.path is required: ");
}

// plan takes BLIP-2 by its hub name, which the help's MODEL said nothing of.
TEST_F(PlanTest, HelpNamesEveryFormOfModel) {
  EXPECT_EQ(Llmctl({"--help"}), kExitOk);
  EXPECT_NE(out_.str().find("hf:Salesforce/blip2-opt-2.7b"), std::string::npos) << out_.str();
}

// A 100,000-character value was echoed twice, a 200 KB message; each quote is now at most 200
// bytes.
TEST_F(PlanTest, ALongSetValueIsQuotedShort) {
  for (const std::string& set :
       {"train.lr=" + std::string(100'000, 'x'), "peft.targets=[" + std::string(100'000, 'x'),
        "train.lr" + std::string(100'000, 'x') + "=1", "train.lr" + std::string(100'000, 'x')}) {
    std::vector<std::string> args = CpuLabLarge();
    args.insert(args.end(), {"--set", set});
    EXPECT_EQ(Llmctl(args), kExitInvalidInput) << out_.str();
    const std::string key = set.substr(0, set.find_first_of("=x"));
    EXPECT_NE(err_.str().find(key), std::string::npos) << err_.str().substr(0, 1000);
    EXPECT_LT(err_.str().size(), 1000u) << err_.str().substr(0, 1000);
    err_.str("");
  }
}

TEST_F(PlanTest, GpuPlanCountsGpuHoursAndServiceUnits) {
  ASSERT_EQ(Llmctl({"tinyllama-1.1b", "--device", "h100-94gb", "--seq", "512", "--global-batch",
                    "32", "--tokens", "10000000", "--su-per-node-hour", "2", "--peft", "none",
                    "--format", "json"}),
            kExitOk)
      << err_.str();
  const json plan = json::parse(out_.str());
  EXPECT_EQ(plan["steps"], 611);  // ceil(10M / (32 x 512))
  ASSERT_FALSE(plan["fits"].empty());
  const json& top = plan["fits"][0];
  EXPECT_EQ(top["peft"], "none");
  EXPECT_NEAR(top["gpu_hours"].get<double>(), top["trial_seconds"].get<double>() / 3600, 1e-9);
  EXPECT_NEAR(top["service_units"].get<double>(), 2 * top["gpu_hours"].get<double>(), 1e-9);
}

// A GPU plan searches under the card less its context and slack (memory_verdict.h), and says how
// in the words `llmctl estimate` says it; a CPU plan, whose budget is exact, says nothing of it.
TEST_F(PlanTest, GpuPlanSaysWhatIsUsableAsTheEstimateDoes) {
  ASSERT_EQ(Llmctl({"tinyllama-1.1b", "--device", "h100-94gb", "--seq", "512", "--global-batch",
                    "32", "--steps", "10"}),
            kExitOk)
      << err_.str();
  const estimate::MemoryLimit limit =
      estimate::CudaCardLimit(estimate::GpuNamed("h100-94gb")->memory_bytes);
  EXPECT_NE(out_.str().find(FormatBytes(limit.safe_bytes) + " of its "), std::string::npos)
      << out_.str();
  EXPECT_NE(out_.str().find("\nusable: " + estimate::CudaLimitRule() + "\n"), std::string::npos)
      << out_.str();
  out_.str("");
  ASSERT_EQ(Llmctl({"experiments/models/cpu-lab-small", "--device", "cpu", "--device-memory",
                    "216MiB", "--seq", "64", "--global-batch", "4", "--steps", "2"}),
            kExitOk)
      << err_.str();
  EXPECT_EQ(out_.str().find("usable:"), std::string::npos) << out_.str();
}

// --rates: the plan's time at the probe of the device it plans for, which it names.
TEST_F(PlanTest, RatesFileTimesThePlanAtItsRates) {
  const fs::path probe = dir_ / "h200.json";
  std::ofstream(probe) << testing::H200Probe(1).ToJson().dump();
  const std::vector<std::string> args = {
      "tinyllama-1.1b", "--device", "h200-141gb", "--seq", "512",
      "--global-batch", "32",       "--steps",    "100",   "--peft",
      "none",           "--format", "json"};
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  const json sheet = json::parse(out_.str());
  std::vector<std::string> with_rates = args;
  with_rates.insert(with_rates.end(), {"--rates", probe.string()});
  ASSERT_EQ(Llmctl(with_rates), kExitOk) << err_.str();
  const json probed = json::parse(out_.str());
  EXPECT_FALSE(sheet.contains("rates"));
  EXPECT_TRUE(probed["rates"].get<std::string>().starts_with("the probe in " + probe.string() +
                                                             " (--rates): cuda "))
      << probed["rates"];
  ASSERT_FALSE(probed["fits"].empty());
  EXPECT_NE(probed["fits"][0]["trial_seconds"], sheet["fits"][0]["trial_seconds"]);
}

// BLIP-2 is planned by its own estimates; adapters go on the language model's own projections
// (Flan-T5's q and v), and the written file reads images and captions.
TEST_F(PlanTest, Blip2IsPlannedWithItsLanguageModelsAdapterNames) {
  const fs::path file = dir_ / "plan.yaml";
  ASSERT_EQ(Llmctl({Source() + "/experiments/models/cpu-lab-blip2-t5",
                    "--device",
                    "cpu",
                    "--device-memory",
                    "280MiB",
                    "--seq",
                    "24",
                    "--global-batch",
                    "4",
                    "--steps",
                    "2",
                    "--peft",
                    "lora",
                    "--top",
                    "2",
                    "--write",
                    file.string(),
                    "--data",
                    Source() + "/experiments/data/captions",
                    "--tokenizer",
                    Source() + "/experiments/tokenizers/captions-t5",
                    "--format",
                    "json"}),
            kExitOk)
      << err_.str();
  const json plan = json::parse(out_.str());
  ASSERT_FALSE(plan["fits"].empty()) << plan.dump(2);
  for (const json& row : plan["fits"]) {
    EXPECT_EQ(row["peft"], "lora");
    EXPECT_LE(row["peak_bytes"].get<uint64_t>(), uint64_t{280} << 20);
  }
  StatusOr<Experiment> written = LoadExperimentFile(file.string());
  ASSERT_TRUE(written.ok()) << written.status().message();
  for (const Trial& trial : written->trials) {
    EXPECT_EQ(trial.config.GetString("data.format"), "imagefolder");
    EXPECT_EQ(trial.config.GetStringList("peft.targets"), (std::vector<std::string>{"q", "v"}));
  }
}

// Issue 39: cpu-lab-small's directory holds no tokenizer.json, so a file naming none is one
// `llmctl submit` refuses. plan refuses to write it and names --tokenizer; with --tokenizer the
// file names it and passes submit's own checks of its inputs.
TEST_F(PlanTest, WritesOnlyWhatSubmitAccepts) {
  const fs::path file = dir_ / "plan.yaml";
  std::vector<std::string> args = CpuLabLarge();
  args[0] = Source() + "/experiments/models/cpu-lab-small";
  args.insert(args.end(), {"--top", "2", "--write", file.string(), "--data",
                           Source() + "/experiments/data/alpaca-demo.jsonl"});
  ASSERT_FALSE(fs::exists(fs::path(args[0]) / "tokenizer.json"));
  EXPECT_EQ(Llmctl(args), kExitInvalidInput) << out_.str();
  EXPECT_NE(err_.str().find("`llmctl submit` would refuse it"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("--tokenizer PATH"), std::string::npos) << err_.str();
  EXPECT_EQ(out_.str(), "");
  EXPECT_FALSE(fs::exists(file));

  const std::string tokenizer = Source() + "/experiments/tokenizers/demo/tokenizer.json";
  args.insert(args.end(), {"--tokenizer", tokenizer});
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  StatusOr<Experiment> checked = LoadExperimentFile(file.string());
  ASSERT_TRUE(checked.ok()) << checked.status().message();
  StatusOr<Experiment> as_written =
      ParseExperiment(*ReadFileToString(file.string(), kMaxExperimentFileBytes), file.string(),
                      {.resolve_local_paths = false, .output_dir_in_run = true});
  ASSERT_TRUE(as_written.ok()) << as_written.status().message();
  ASSERT_EQ(checked->trials.size(), 2u);
  for (const Trial& trial : checked->trials) {
    EXPECT_EQ(fs::canonical(trial.config.settings().model.tokenizer), fs::canonical(tokenizer));
    // A row's tokens/s is the plan's, at full sequences: submit predicts the run's own again.
    EXPECT_NE(trial.description.find(" tokens/s at full sequences, "), std::string::npos)
        << trial.description;
  }
  EXPECT_NE(ReadFileToString(file.string(), kMaxExperimentFileBytes)
                ->find("# The descriptions' tokens/s are at full sequences; `llmctl submit`"),
            std::string::npos);
  EXPECT_TRUE(CollectInputs(*as_written, file.string()).ok());
  const Status accepted = CheckLocalInputs(*checked, file.string());
  EXPECT_TRUE(accepted.ok()) << accepted.message();
}

// An experiment file that cannot be written (here a missing directory; a full disk says "No space
// left on device" alike) fails with the file's error and exit 1: it exited 2, as bad input.
TEST_F(PlanTest, AWriteThatCannotBeWrittenIsNotBadInput) {
  const std::string file = (dir_ / "missing" / "plan.yaml").string();
  std::vector<std::string> args = CpuLabLarge();
  args[0] = Source() + "/experiments/models/cpu-lab-small";
  args.insert(args.end(), {"--top", "1", "--write", file, "--data",
                           Source() + "/experiments/data/alpaca-demo.jsonl", "--tokenizer",
                           Source() + "/experiments/tokenizers/demo/tokenizer.json"});
  EXPECT_EQ(Llmctl(args), kExitFailed) << err_.str();
  EXPECT_NE(err_.str().find("--write " + file + ": cannot create " + file), std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("No such file or directory"), std::string::npos) << err_.str();
}

// What a plan killed mid-write (Ctrl-C, kill -9) left beside its --write file (plan.yaml.tmp.PID.N)
// stayed for good: the next --write of that file removes it, and leaves a running writer's alone.
TEST_F(PlanTest, AWriteRemovesWhatAnEndedWriteLeftBesideIt) {
  const fs::path file = dir_ / "plan.yaml";
  const fs::path ended =
      dir_ / ("plan.yaml.tmp." + std::to_string(testing::PidOfAnEndedProcess()) + ".0");
  const fs::path running = dir_ / ("plan.yaml.tmp." + std::to_string(::getpid()) + ".9999");
  std::ofstream(ended) << "half a plan";
  std::ofstream(running) << "a plan being written";
  std::vector<std::string> args = CpuLabLarge();
  args[0] = Source() + "/experiments/models/cpu-lab-small";
  args.insert(args.end(), {"--top", "1", "--write", file.string(), "--data",
                           Source() + "/experiments/data/alpaca-demo.jsonl", "--tokenizer",
                           Source() + "/experiments/tokenizers/demo/tokenizer.json"});
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  EXPECT_FALSE(fs::exists(ended));
  EXPECT_TRUE(fs::exists(running));
  EXPECT_TRUE(fs::exists(file));
}

// A --set value is written as the value it set: a path that YAML would read as a map ('a: b'), as
// an unclosed list ('[x') or with a comment (' #c') is one quoted string. Through YAML::Load the
// first wrote a map the file's check refused, the second was an internal error, the third lost
// ' #c' from the written output_dir without a word.
TEST_F(PlanTest, SetValuesAreWrittenAsTheyWereSet) {
  const fs::path file = dir_ / "plan.yaml";
  const std::string output_dir = "runs/[x a: b #c";
  std::vector<std::string> args = CpuLabLarge();
  args[0] = Source() + "/experiments/models/cpu-lab-small";
  args.insert(args.end(), {"--top", "1", "--write", file.string(), "--data",
                           Source() + "/experiments/data/alpaca-demo.jsonl", "--tokenizer",
                           Source() + "/experiments/tokenizers/demo/tokenizer.json", "--set",
                           "output_dir=" + output_dir, "--set", "train.lr=3e-4"});
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  const std::string written = *ReadFileToString(file.string(), kMaxExperimentFileBytes);
  const YAML::Node root = YAML::Load(written);
  EXPECT_EQ(root["output_dir"].as<std::string>(), output_dir) << written;
  EXPECT_EQ(root["train"]["lr"].as<double>(), 3e-4) << written;
  StatusOr<Experiment> parsed = ParseExperiment(
      written, file.string(), {.resolve_local_paths = false, .output_dir_in_run = true});
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(parsed->trials.size(), 1u);
  EXPECT_EQ(parsed->trials[0].config.GetString("output_dir"), output_dir);
  EXPECT_EQ(parsed->trials[0].config.GetFloat("train.lr"), 3e-4);
}

// The written file's first line names the command that wrote it, MODEL's path among its words: a
// path with a newline wrote a key of its own after the comment (`output_dir: injected/pm`), which
// the file's check let through. Each word is now shell-quoted on the comment's line, and the
// table's title shows the path without its controls.
TEST_F(PlanTest, AModelPathCannotWriteAKeyOfItsOwn) {
  const fs::path model = dir_ / "evil\x1b]0;T\x07 it's\noutput_dir: injected/pm";
  fs::create_directories(model);
  fs::copy_file(Source() + "/experiments/models/cpu-lab-small/config.json", model / "config.json");
  const fs::path file = dir_ / "plan.yaml";
  std::vector<std::string> args = CpuLabLarge();
  args[0] = model.string();
  args.insert(args.end(), {"--top", "1", "--write", file.string(), "--data",
                           Source() + "/experiments/data/alpaca-demo.jsonl", "--tokenizer",
                           Source() + "/experiments/tokenizers/demo/tokenizer.json"});
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  const std::string written = *ReadFileToString(file.string(), kMaxExperimentFileBytes);
  const YAML::Node root = YAML::Load(written);
  EXPECT_FALSE(root["output_dir"].IsDefined()) << written;
  // The path itself, newline and all, is the emitter's quoted scalar.
  EXPECT_NE(root["model"].as<std::string>().find("evil\x1b]0;T\x07 it's\noutput_dir: injected/pm"),
            std::string::npos)
      << written;
  const std::string first_line = written.substr(0, written.find('\n'));
  EXPECT_EQ(first_line, "# Written by llmctl plan '" + dir_.string() +
                            "/evil ]0;T  it'\\''s output_dir: injected/pm' --device cpu "
                            "--device-memory 216MiB --seq 128 --global-batch 8 --steps 3");
  StatusOr<Experiment> parsed = LoadExperimentFile(file.string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->trials.size(), 1u);

  args.resize(args.size() - 8);
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  EXPECT_EQ(out_.str().rfind(
                "plan for " + dir_.string() + "/evil ]0;T  it's output_dir: injected/pm on ", 0),
            0u)
      << out_.str();
  EXPECT_EQ(out_.str().find('\x1b'), std::string::npos);
}

// A model directory and a written file named as users name theirs: the experiment's name is made
// of the directory's name, where "plan-My Model: 'v2' #1 \u00e9" was refused by the file's own
// check and nothing was written; the paths go into the file as they are.
TEST_F(PlanTest, AModelDirectoryOfAnyNameIsWrittenUnderANameSubmitTakes) {
  const fs::path model = dir_ / "models" / "My Model: 'v2' #1 \u00e9";
  fs::create_directories(model);
  fs::copy_file(Source() + "/experiments/models/cpu-lab-small/config.json", model / "config.json");
  const fs::path out = dir_ / "My Drive #2: -x";
  fs::create_directories(out);
  const fs::path file = out / "* plan: #1.yaml";
  std::vector<std::string> args = CpuLabLarge();
  args[0] = model.string();
  args.insert(args.end(), {"--top", "1", "--write", file.string(), "--data",
                           Source() + "/experiments/data/alpaca-demo.jsonl", "--tokenizer",
                           Source() + "/experiments/tokenizers/demo/tokenizer.json"});
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  StatusOr<Experiment> parsed = LoadExperimentFile(file.string());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->name, "plan-My-Model-v2-1");
  EXPECT_EQ(parsed->trials.at(0).config.GetString("model"), model.string());
}

// Issue 28's check of a plan: every configuration it says fits does fit, run by the real
// llm-train under the plan's device budget from the experiment file --write emits, unchanged but
// for its length: two steps, the second of which holds the optimizer's state through the step and
// so reaches the run's peak (as the estimate tests' PeakRunSets), its 16-bit rows too (on a CPU
// without LibTorch's 16-bit GEMM the trainer forms them in fp32 blocks: seconds a row).
TEST_F(PlanTest, WrittenTopRowsRunAndFitUnderTheBudget) {
  const fs::path file = dir_ / "plan.yaml";
  std::vector<std::string> args = CpuLabLarge();
  args.insert(args.end(),
              {"--top", "4", "--write", file.string(), "--data",
               Source() + "/experiments/data/alpaca-packed.jsonl", "--set", "data.format=text",
               "--set", "tokenizer=" + Source() + "/experiments/tokenizers/demo/tokenizer.json"});
  ASSERT_EQ(Llmctl(args), kExitOk) << err_.str();
  StatusOr<Experiment> written = LoadExperimentFile(file.string());
  ASSERT_TRUE(written.ok()) << written.status().message();
  ASSERT_EQ(written->trials.size(), 4u);
  for (const Trial& trial : written->trials) {
    EXPECT_EQ(trial.expect, "ok");
    const fs::path events = dir_ / (trial.name + ".jsonl");
    const llmctl::testing::CommandResult run = llmctl::testing::RunShellCommand(
        (llmctl::testing::BuildDir() / "trainer/llm-train").string() + " --config " +
        file.string() + " --trial " + trial.name + " --events " + events.string() +
        " --set train.max_steps=2");
    EXPECT_EQ(run.exit_code, 0) << trial.name << ":\n" << run.out;
    std::ifstream in(events);
    bool ended = false;
    for (std::string line; std::getline(in, line);) {
      const json event = json::parse(line);
      if (event["type"] != "result") continue;
      ended = true;
      EXPECT_LE(event["peak_bytes"].get<uint64_t>(), uint64_t{216} << 20) << trial.name;
    }
    EXPECT_TRUE(ended) << trial.name;
  }
}

}  // namespace
}  // namespace llmctl::cli
