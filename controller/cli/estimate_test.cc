// `llmctl estimate`: experiment files in, each trial's model state out, with no controller.
#include "controller/cli/estimate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "controller/cli/commands.h"
#include "controller/cli/offline_cli_test.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

// The repository's experiments/.
std::string Experiments() { return (llmctl::testing::SourceDir() / "experiments/").string(); }

class EstimateTest : public testing::OfflineCliTest {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }

  // Runs `llmctl estimate ARGS...` in-process.
  int Llmctl(std::vector<std::string> args) { return RunOffline("estimate", std::move(args)); }
};

TEST_F(EstimateTest, JsonHasEachTrialsExactModelStateActivationsAndPeak) {
  ASSERT_EQ(Llmctl({Experiments() + "demo.yaml", "--format", "json"}), kExitOk) << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  ASSERT_EQ(out["trials"].size(), 1u);
  const nlohmann::json& demo = out["trials"][0];
  EXPECT_EQ(demo["name"], "demo");
  EXPECT_EQ(demo["estimated"], true);
  // llmctl-demo's 1,000,576 fp32 parameters with AdamW: 4 + 4 + 8 bytes each, and the step count.
  EXPECT_EQ(demo["params_bytes"], 4002304);
  EXPECT_EQ(demo["grads_bytes"], 4002304);
  EXPECT_EQ(demo["optim_device_bytes"], 8004612);
  EXPECT_EQ(demo["optim_host_bytes"], 0);
  EXPECT_EQ(demo["comm_bytes"], 0);
  EXPECT_EQ(demo["model_state_bytes"], 16009220);
  // The demo's micro-batch 4 at the longest micro-batch its 20 steps draw with seed 42 (109 of
  // data.max_seq_length 128 tokens: the trainer pads to the longest row); its peak is the model
  // state (the optimizer's state held from the second step) plus the activations and the loss'
  // gradients, which the chunked loss (loss: auto under kernels: fused) forms in forward.
  EXPECT_EQ(demo["tokens"], 4 * 109);
  EXPECT_NE(demo["note"].get<std::string>().find(
                "the peak at the longest micro-batch after the first step, the time at the mean "
                "after it (what the report measures): peak at 109 tokens, time at "),
            std::string::npos)
      << demo["note"];
  EXPECT_GT(demo["activation_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(demo["peak_bytes"].get<uint64_t>(),
            12006916 + demo["activation_bytes"].get<uint64_t>());
  EXPECT_EQ(demo["peak_phase"], "forward");
  // A CPU trial without device_memory has no device limit, so no verdict.
  EXPECT_TRUE(demo["verdict"].is_null());
  EXPECT_FALSE(demo.contains("fit"));
}

// The labs' table in miniature: the estimate says which rows fit the 216 MiB device and which
// run out of memory, as each row's `expect:` says they do when run.
// The notes quote LLMCTL_HOME, the user's environment's text: an escape in it (\e]0;...\a
// retitles the window) reaches the terminal as a space.
TEST_F(EstimateTest, NotesQuoteTheDataDirectoryWithoutItsEscapes) {
  env_["LLMCTL_HOME"] = "relative\x1b]0;T\a";
  ASSERT_EQ(Llmctl({Experiments() + "demo.yaml"}), kExitOk) << err_.str();
  EXPECT_NE(err_.str().find("note: LLMCTL_HOME='relative ]0;T ' is not an absolute path"),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(err_.str().find('\x1b'), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find('\a'), std::string::npos) << err_.str();
}

TEST_F(EstimateTest, CpuLabVerdictsAreEachRowsExpectation) {
  ASSERT_EQ(Llmctl({Experiments() + "cpu-lab.yaml", "--format", "json"}), kExitOk) << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  const std::set<std::string> oom = {"baseline", "even-larger", "smallest-batch"};
  ASSERT_EQ(out["trials"].size(), 14u);
  for (const nlohmann::json& trial : out["trials"]) {
    SCOPED_TRACE(trial["name"].get<std::string>());
    EXPECT_EQ(trial["device_memory_bytes"], 216u << 20);
    EXPECT_EQ(trial["device_source"], "device_memory 216MiB");
    EXPECT_EQ(trial["verdict"], oom.contains(trial["name"]) ? "oom" : "fits");
  }
  ASSERT_EQ(Llmctl({Experiments() + "cpu-lab.yaml"}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("model state  activations   peak  device  verdict"), std::string::npos)
      << out_.str();
  EXPECT_NE(out_.str().find("device: device_memory 216MiB"), std::string::npos) << out_.str();
  // The lengths under the table: how they were chosen once for the trials that chose alike, then
  // each trial's figures; cpu-offload runs 2 steps where the rest run 6.
  const std::string six_steps =
      "lengths: sequences as the run draws them with seed 42 over 6 steps";
  EXPECT_NE(out_.str().find(six_steps + ", data.max_seq_length 128: the peak at"),
            std::string::npos)
      << out_.str();
  EXPECT_EQ(out_.str().find(six_steps, out_.str().find(six_steps) + 1), std::string::npos);
  EXPECT_NE(out_.str().find("\n  baseline: peak at 109 tokens, time at "), std::string::npos);
  EXPECT_LT(out_.str().find("over 2 steps"), out_.str().find("\n  cpu-offload: peak at "));
  EXPECT_GT(out_.str().find("over 2 steps"), out_.str().find("\n  qlora: peak at "));
}

// The LitGPT lab's own rows (shared/reference/lab-experiments.md: TinyLlama, OpenLLaMA 3B and 7B
// at 512 tokens on an A100 80GB, its peaks printed as max_memory_allocated() / 1e9 "GB"): the
// estimate of each, for the A100 the target names, is within 10% of what the lab measured on the
// GPU with LitGPT's own trainer.
TEST_F(EstimateTest, TheLitGptLabsMeasuredA100PeaksAreWithinTenPercent) {
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--format", "json"}), kExitOk)
      << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  const std::map<std::string, double> lab_gb = {
      {"reduced-batch", 30.41}, {"grad-accumulation", 34.82}, {"bf16-true", 20.10},
      {"bf16-mixed", 31.32},    {"larger-model-3b", 46.89},   {"larger-model", 69.71}};
  int compared = 0;
  for (const nlohmann::json& trial : out["trials"]) {
    EXPECT_EQ(trial["device_source"], "target node_type compute_gigaio: NVIDIA A100 80GB");
    EXPECT_EQ(trial["device_memory_bytes"], uint64_t{81920} << 20);
    auto lab = lab_gb.find(trial["name"]);
    if (lab == lab_gb.end()) continue;
    SCOPED_TRACE(lab->first);
    const double predicted = trial["peak_bytes"].get<double>();
    EXPECT_NEAR(predicted / (lab->second * 1e9), 1.0, 0.10) << predicted;
    EXPECT_EQ(trial["verdict"], "fits");
    ++compared;
  }
  EXPECT_EQ(compared, 6);
}

// llm-train's own peaks on a GPU: deploy/gpu-check's lab stage ran single-llama-a100.yaml on an
// H200 under device_memory 79.2GiB (docs/gpu-runs/2026-11-26-h200/lab.jsonl, the CUDA caching
// allocator's max_memory_allocated). Each row that ended ok is predicted within issue 28's bound,
// as the CPU peak tests hold it (common/estimate/trainer_runs.h's PeakBound): at most 2% under
// (an estimate under the peak says "fits" for a run that does not) and at most 3% over. Measured:
// -0.61% to -0.22%, all under, by cuBLAS' workspaces and the CUDA context's allocations, which the
// estimate leaves out; a test that required "under" would fail an estimate that modelled them. The
// two float32 TinyLlama rows ran before llama.cc repeated keys and values for the
// memory-efficient kernel and are not compared.
TEST_F(EstimateTest, LlmTrainsPeaksMeasuredOnAnH200AreWithinTwoPercentUnderAndThreeOver) {
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--format", "json"}), kExitOk)
      << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  std::map<std::string, double> predicted;
  for (const nlohmann::json& trial : out["trials"]) {
    predicted[trial["name"]] = trial["peak_bytes"].get<double>();
  }
  std::ifstream measured(Experiments() + "../docs/gpu-runs/2026-11-26-h200/lab.jsonl");
  ASSERT_TRUE(measured.good());
  const std::set<std::string> before_the_change = {"reduced-batch", "grad-accumulation"};
  int compared = 0;
  for (std::string line; std::getline(measured, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row["observed"] != "ok" || before_the_change.contains(row["trial"])) continue;
    SCOPED_TRACE(row["trial"].get<std::string>());
    const double peak = row["peak_bytes"].get<double>();
    const double error = (predicted.at(row["trial"]) - peak) / peak;
    EXPECT_GE(error, -0.02) << "predicted " << predicted.at(row["trial"]) << " B, measured "
                            << peak;
    EXPECT_LE(error, 0.03) << "predicted " << predicted.at(row["trial"]) << " B, measured " << peak;
    std::printf("%s: predicted %.0f B, measured %.0f B, error %+.2f%%\n",
                row["trial"].get<std::string>().c_str(), predicted.at(row["trial"]), peak,
                100 * error);
    ++compared;
  }
  EXPECT_EQ(compared, 7);  // bf16-true, bf16-mixed, 3B, 7B, sgd, lora, qlora
}

TEST_F(EstimateTest, DeviceMemoryOptionTakesASizeOrAGpu) {
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "larger-model",
                    "--device-memory", "a100-40gb", "--format", "json"}),
            kExitOk)
      << err_.str();
  nlohmann::json trial = nlohmann::json::parse(out_.str())["trials"][0];
  EXPECT_EQ(trial["device_source"], "--device-memory a100-40gb (NVIDIA A100 40GB)");
  EXPECT_EQ(trial["verdict"], "oom");  // OpenLLaMA 7B in bf16 with AdamW: 51 GB of model state
  ASSERT_EQ(Llmctl({Experiments() + "demo.yaml", "--device-memory", "1GiB", "--format", "json"}),
            kExitOk)
      << err_.str();
  trial = nlohmann::json::parse(out_.str())["trials"][0];
  EXPECT_EQ(trial["device_memory_bytes"], 1u << 30);
  EXPECT_EQ(trial["verdict"], "fits");

  EXPECT_EQ(Llmctl({Experiments() + "demo.yaml", "--device-memory", "a100"}), kExitInvalidInput);
  EXPECT_EQ(out_.str(), "");
  EXPECT_NE(err_.str().find("--device-memory: expected a size such as 80GiB or a GPU (h100-94gb, "
                            "h100-80gb, a100-80gb"),
            std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("got 'a100'"), std::string::npos) << err_.str();
}

// Issue 37: this file killed `llmctl estimate` with SIGFPE (exit 136): micro x devices x nodes
// wrapped to 0 before the multiple-of check divided by it.
TEST_F(EstimateTest, CountsThatOverflowTheirProductAreRefusedWithExitTwo) {
  const std::string file =
      Write("huge.yaml",
            "data: {path: t.jsonl}\ndevices: 4294967296\n"
            "train: {micro_batch_size: 4294967296, global_batch_size: 4294967296}\n");
  EXPECT_EQ(Llmctl({file}), kExitInvalidInput);
  EXPECT_EQ(out_.str(), "");
  EXPECT_NE(err_.str().find("huge.yaml:2:10: devices: 4294967296 is more than 4096, the most "
                            "llmctl takes"),
            std::string::npos)
      << err_.str();
}

TEST_F(EstimateTest, FitFindsTheLargestMicroBatchAndTheGlobalBatchItImplies) {
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "reduced-batch", "--fit",
                    "--format", "json"}),
            kExitOk)
      << err_.str();
  const nlohmann::json trial = nlohmann::json::parse(out_.str())["trials"][0];
  const nlohmann::json& fit = trial["fit"];
  // On a GPU what fits keeps the CUDA context and the caching allocator's slack free: the A100's
  // 80 GiB less 1 GiB and 4 GiB (memory_verdict.h).
  const uint64_t device = trial["device_memory_bytes"];
  const uint64_t safe = trial["safe_limit_bytes"];
  EXPECT_EQ(trial["limit_bytes"].get<uint64_t>(), device - (uint64_t{1} << 30));
  EXPECT_EQ(safe, device - (uint64_t{5} << 30));
  ASSERT_GT(fit["micro_batch_size"].get<int64_t>(), 8);  // the lab's micro-batch 8 fits
  EXPECT_LE(fit["peak_bytes"].get<uint64_t>(), safe);
  EXPECT_GT(fit["next_peak_bytes"].get<uint64_t>(), safe);
  // The trial's global batch of 8 fits in one micro-batch.
  EXPECT_EQ(fit["global_micro_batch_size"], 8);
  EXPECT_EQ(fit["accumulation"], 1);

  ASSERT_EQ(Llmctl({Experiments() + "cpu-lab.yaml", "--trial", "smallest-batch", "--fit"}), kExitOk)
      << err_.str();
  EXPECT_NE(out_.str().find("max micro-batch  global as"), std::string::npos) << out_.str();
  // Its model state alone exceeds the device: not even one example fits.
  EXPECT_NE(out_.str().find("OOM             none"), std::string::npos) << out_.str();
}

TEST_F(EstimateTest, ExplainShowsEachTermsFormulaWithItsNumbers) {
  ASSERT_EQ(
      Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "reduced-batch", "--explain"}),
      kExitOk)
      << err_.str();
  const std::string out = out_.str();
  for (const char* line :
       {"params", "1,100,048,384 values x 4 B", "AdamW: 2 moments x 1,100,048,384 x 4 B + 4 B",
        "activations: layers", "22 x ", "for 4,096 tokens (8 x 512)",
        "log-softmax (4,096 x 32,000 x 4 B)", "peak", "device",
        "target node_type compute_gigaio: NVIDIA A100 80GB: 35.4% of it",
        "what the run may allocate there (less the CUDA context)", "79.00 GiB",
        "the limit less the caching allocator's slack", "75.00 GiB", "verdict", "fits"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
}

// A peak under a GPU's memory but within its caching allocator's slack of what a run may
// allocate there is tight, not fits: the A100 lab's 13B row with 8-bit AdamW predicts 79,817.8 MiB
// of the card's 81,920 (the 11-26 H200 run, before the chunked 8-bit step, hit a 79.2 GiB budget at
// 78.9 GiB allocated with 0.07 GiB more reserved).
TEST_F(EstimateTest, APeakInTheAllocatorsSlackOfAGpuIsTight) {
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "adam-8bit", "--format",
                    "json"}),
            kExitOk)
      << err_.str();
  const nlohmann::json trial = nlohmann::json::parse(out_.str())["trials"][0];
  const uint64_t peak = trial["peak_bytes"];
  EXPECT_LT(peak, trial["limit_bytes"].get<uint64_t>());
  EXPECT_GT(peak, trial["safe_limit_bytes"].get<uint64_t>());
  EXPECT_EQ(trial["verdict"], "tight");

  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "adam-8bit"}), kExitOk);
  EXPECT_NE(out_.str().find("81,920.0    tight"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find(
                "verdict on a GPU: a GPU's limit is its memory less 1.00 GiB for the CUDA context"),
            std::string::npos)
      << out_.str();

  // The same size as a CPU trial's budget is exact: the counting allocator holds no more than it
  // allocates.
  ASSERT_EQ(Llmctl({Experiments() + "cpu-lab.yaml", "--trial", "adam-8bit", "--format", "json"}),
            kExitOk);
  const nlohmann::json cpu = nlohmann::json::parse(out_.str())["trials"][0];
  EXPECT_EQ(cpu["limit_bytes"], cpu["device_memory_bytes"]);
  EXPECT_EQ(cpu["safe_limit_bytes"], cpu["device_memory_bytes"]);
  EXPECT_EQ(cpu["verdict"], "fits");
}

TEST_F(EstimateTest, TimeIsPredictedOnTheTrialsDeviceAndExplained) {
  // A cuda trial on its target's GPU (the A100 of compute_gigaio), at the built-in calibration.
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "bf16-true", "--format",
                    "json"}),
            kExitOk)
      << err_.str();
  nlohmann::json trial = nlohmann::json::parse(out_.str())["trials"][0];
  ASSERT_TRUE(trial["time"].is_object()) << trial.dump(2);
  EXPECT_EQ(trial["time"]["device"], "a100-80gb");
  EXPECT_EQ(trial["time"]["work"]["matmul_class"], "bf16");
  EXPECT_EQ(trial["time"]["steps"], 20);
  const double step = trial["time"]["step_seconds"].get<double>();
  EXPECT_GT(step, 0);
  EXPECT_NEAR(trial["time"]["tokens_per_second"].get<double>() * step, 4 * 8 * 512, 1e-6);
  EXPECT_NEAR(trial["time"]["trial_seconds"].get<double>(),
              trial["time"]["startup_seconds"].get<double>() + 20 * step, 1e-6);
  // The same trial on an H200 (--device-memory names the GPU) is predicted faster.
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "bf16-true",
                    "--device-memory", "h200-141gb", "--format", "json"}),
            kExitOk);
  trial = nlohmann::json::parse(out_.str())["trials"][0];
  EXPECT_EQ(trial["time"]["device"], "h200-141gb");
  EXPECT_LT(trial["time"]["step_seconds"].get<double>(), step);
  // A cuda trial without a GPU to time it on has no time, and says why.
  ASSERT_EQ(Llmctl({Experiments() + "single-llama-a100.yaml", "--trial", "bf16-true",
                    "--device-memory", "80GiB", "--format", "json"}),
            kExitOk);
  trial = nlohmann::json::parse(out_.str())["trials"][0];
  EXPECT_EQ(trial["time"]["device"], "a100-80gb");  // the target's GPU still times it
  // --explain lists the step's terms with the calibration.
  ASSERT_EQ(Llmctl({Experiments() + "cpu-lab.yaml", "--trial", "reduced-batch", "--explain"}),
            kExitOk);
  EXPECT_NE(out_.str().find("time on cpu (built-in: the CPU lab"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("  matmuls"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("  start-up"), std::string::npos) << out_.str();
}

TEST_F(EstimateTest, OneTrialByName) {
  ASSERT_EQ(Llmctl({Experiments() + "cpu-lab.yaml", "--trial", "qlora", "--format", "json"}),
            kExitOk)
      << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  ASSERT_EQ(out["trials"].size(), 1u);
  EXPECT_EQ(out["trials"][0]["name"], "qlora");
}

TEST_F(EstimateTest, AHubModelIsListedAsNotEstimatedOffline) {
  const std::string file = Write("hub.yaml",
                                 "model: hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0\n"
                                 "data: {path: train.jsonl}\n"
                                 "trials:\n"
                                 "  - name: hub\n"
                                 "  - name: local\n"
                                 "    set: {model: llmctl-demo}\n");
  ASSERT_EQ(Llmctl({file}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("hub: not estimated: its model hf:TinyLlama/TinyLlama-1.1B-Chat-v1.0 "
                            "is on the Hugging Face hub"),
            std::string::npos)
      << out_.str();
  ASSERT_EQ(Llmctl({file, "--format", "json"}), kExitOk) << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  EXPECT_EQ(out["trials"][0]["estimated"], false);
  EXPECT_EQ(out["trials"][1]["estimated"], true);
}

TEST_F(EstimateTest, ALocalModelDirectorysConfigJsonIsRead) {
  Write("tiny/config.json",
        R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "tie_word_embeddings": true})");
  const std::string file = Write("local.yaml", "model: tiny\ndata: {path: train.jsonl}\n");
  ASSERT_EQ(Llmctl({file, "--format", "json"}), kExitOk) << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  // 256 x 64 embeddings, 2 layers of 4 x 64 x 64 attention, 3 x 64 x 128 MLP, two norms; the norm.
  const int64_t parameters = 256 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64;
  EXPECT_EQ(out["trials"][0]["parameters_total"], parameters);
  EXPECT_EQ(out["trials"][0]["params_bytes"], 4 * parameters);
}

// A model's name is the user's path to it, its config another party's: neither reaches the
// terminal with a control character or a bidirectional control, nor forges a line.
TEST_F(EstimateTest, ModelNamesAndConfigErrorsArePrintedWithoutTheirControls) {
  const std::string config =
      R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "tie_word_embeddings": true})";
  Write("ti\u202eny\x1b]0;T\x07/config.json", config);
  const std::string file =
      Write("local.yaml", "model: \"ti\\u202eny\\e]0;T\\a\"\ndata: {path: train.jsonl}\n");
  ASSERT_EQ(Llmctl({file}), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("ti ny ]0;T "), std::string::npos) << out_.str();
  ASSERT_EQ(Llmctl({file, "--explain"}), kExitOk) << err_.str();
  for (const char* control : {"\x1b", "\x07", "\u202e"}) {
    EXPECT_EQ(out_.str().find(control), std::string::npos) << out_.str();
  }
  // JSON keeps the name whole, every character past ASCII (U+202E too) written as an escape.
  ASSERT_EQ(Llmctl({file, "--format", "json"}), kExitOk) << err_.str();
  EXPECT_EQ(out_.str().find("\u202e"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("ti\\u202eny\\u001b]0;T\\u0007"), std::string::npos) << out_.str();
  const std::string model = nlohmann::json::parse(out_.str())["trials"][0]["model"];
  EXPECT_TRUE(model.ends_with("/ti\u202eny\x1b]0;T\x07")) << model;

  Write("forged/config.json",
        R"({"model_type": "llama\u001b]0;T\u0007\r\nllmctl: FORGED", "vocab_size": 256,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4})");
  EXPECT_EQ(Llmctl({Write("forged.yaml", "model: forged\ndata: {path: train.jsonl}\n")}),
            kExitInvalidInput);
  EXPECT_NE(err_.str().find("'llama ]0;T   llmctl: FORGED'"), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find("\nllmctl: FORGED"), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find('\x1b'), std::string::npos) << err_.str();
}

TEST_F(EstimateTest, BadInputIsOneMessageNamingTheFileAndExitsTwo) {
  const std::string file =
      Write("bad.yaml", "model: llmctl-demo\ndata: {path: train.jsonl}\noptimizer: adamm\n");
  EXPECT_EQ(Llmctl({file}), kExitInvalidInput);
  EXPECT_EQ(out_.str(), "");
  EXPECT_NE(err_.str().find(file + ":3:"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("optimizer"), std::string::npos) << err_.str();

  EXPECT_EQ(Llmctl({(dir_ / "missing.yaml").string()}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("missing.yaml"), std::string::npos) << err_.str();

  EXPECT_EQ(Llmctl({Experiments() + "demo.yaml", "--trial", "nope"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("no trial named 'nope' (trials: demo)"), std::string::npos)
      << err_.str();

  EXPECT_EQ(Llmctl({Experiments() + "demo.yaml", "--format", "csv"}), kExitInvalidInput);
  EXPECT_NE(err_.str().find("--format: expected table or json"), std::string::npos) << err_.str();

  const std::string no_config =
      Write("nodir.yaml", "model: " + (dir_ / "nowhere").string() + "\ndata: {path: t.jsonl}\n");
  EXPECT_EQ(Llmctl({no_config}), kExitInvalidInput);
  EXPECT_NE(err_.str().find(no_config + ":1:1: model: unknown model"), std::string::npos)
      << err_.str();

  // A tokenizer written as a file here that is not there, or as a directory without a
  // tokenizer.json, is refused, where both were estimated at full sequences as "not on this
  // machine".
  Write("t.jsonl", R"({"instruction": "a", "input": "", "output": "b"})"
                   "\n");
  for (const std::string& tokenizer : {std::string("missing.json"), dir_.string()}) {
    const std::string no_tokenizer = Write(
        "notok.yaml", "model: llmctl-demo\ntokenizer: " + tokenizer + "\ndata: {path: t.jsonl}\n");
    EXPECT_EQ(Llmctl({no_tokenizer}), kExitInvalidInput) << out_.str();
    EXPECT_EQ(out_.str(), "");
    EXPECT_EQ(err_.str().find("llmctl: " + no_tokenizer + ": trial "), 0u) << err_.str();
    EXPECT_NE(err_.str().find(": tokenizer: "), std::string::npos) << err_.str();
    EXPECT_NE(err_.str().find(": no such file\n"), std::string::npos) << err_.str();
  }

  // A record or a tokenizer the draw cannot read is said with its key, as submit says it.
  const std::string tokenizer = Experiments() + "tokenizers/demo";
  Write("bad.jsonl", R"({"instruction": 3, "output": "b"})"
                     "\n");
  const std::string bad_record =
      Write("badrecord.yaml", "model: llmctl-demo\ntokenizer: " + tokenizer +
                                  "\ndata: {path: bad.jsonl}\ntrials:\n  - {name: a}\n");
  EXPECT_EQ(Llmctl({bad_record}), kExitInvalidInput) << out_.str();
  EXPECT_NE(err_.str().find(bad_record + ": trial 'a': data.path: "), std::string::npos)
      << err_.str();
  Write("tok/tokenizer.json", "{");
  const std::string bad_tokenizer =
      Write("badtok.yaml", "model: llmctl-demo\ntokenizer: " + (dir_ / "tok").string() +
                               "\ndata: {path: t.jsonl}\ntrials:\n  - {name: a}\n");
  EXPECT_EQ(Llmctl({bad_tokenizer}), kExitInvalidInput) << out_.str();
  EXPECT_NE(err_.str().find(bad_tokenizer + ": trial 'a': tokenizer: "), std::string::npos)
      << err_.str();
}

}  // namespace
}  // namespace llmctl::cli

namespace llmctl::cli {
namespace {

// --rates: a probe taken on the node one plans for (issue 39: a GPU's, measured by
// deploy/gpu-check's probe stage) times the trials on its device at its rates, and only those; a
// file that is not a probe is refused by name before anything is estimated.
TEST_F(EstimateTest, RatesFileTimesTheTrialsOnItsDeviceAtItsRates) {
  const std::string slow = Write("h200.json", testing::H200Probe(1).ToJson().dump(2));
  const std::string fast = Write("h200-fast.json", testing::H200Probe(2).ToJson().dump(2));
  const std::vector<std::string> args = {Experiments() + "single-llama-a100.yaml",
                                         "--trial",
                                         "bf16-true",
                                         "--device-memory",
                                         "h200-141gb",
                                         "--format",
                                         "json"};
  const auto time_with = [&](const std::vector<std::string>& more) {
    std::vector<std::string> all = args;
    all.insert(all.end(), more.begin(), more.end());
    EXPECT_EQ(Llmctl(all), kExitOk) << err_.str();
    EXPECT_EQ(err_.str().find("--rates"), std::string::npos) << err_.str();
    return nlohmann::json::parse(out_.str())["trials"][0]["time"];
  };
  const nlohmann::json sheet = time_with({});
  const nlohmann::json at_slow = time_with({"--rates", slow});
  const nlohmann::json at_fast = time_with({"--rates", fast});
  EXPECT_EQ(at_slow["work"], sheet["work"]) << "the rates change the time, not the work";
  EXPECT_TRUE(at_slow["rates"].get<std::string>().starts_with(
      "the probe in " + slow + " (--rates): cuda " + testing::H200Probe(1).device_name))
      << at_slow["rates"];
  EXPECT_NE(at_slow["step_seconds"], sheet["step_seconds"]);
  // Every term of a single GPU's step is work over a rate: twice every rate, half the step.
  EXPECT_NEAR(at_fast["step_seconds"].get<double>(), at_slow["step_seconds"].get<double>() / 2,
              1e-9 * at_slow["step_seconds"].get<double>());

  // A GPU trial whose file names no GPU (as the bench writes one for the machine it runs on) is
  // timed on the probe's.
  Write("tiny/config.json",
        R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4})");
  const std::string bare = Write(
      "bare.yaml", "model: tiny\ndata: {path: train.jsonl}\ndevice: cuda\nprecision: bf16-true\n");
  ASSERT_EQ(Llmctl({bare, "--format", "json"}), kExitOk) << err_.str();
  EXPECT_NE(nlohmann::json::parse(out_.str())["trials"][0]["time_reason"].get<std::string>().find(
                "or --rates with a probe of one"),
            std::string::npos)
      << out_.str();
  ASSERT_EQ(Llmctl({bare, "--format", "json", "--rates", slow}), kExitOk) << err_.str();
  EXPECT_TRUE(nlohmann::json::parse(out_.str())["trials"][0]["time"]["rates"]
                  .get<std::string>()
                  .starts_with("the probe in " + slow))
      << out_.str();

  // The CPU lab's trials are not on the H200: the probe serves none, which is said.
  ASSERT_EQ(Llmctl({Experiments() + "cpu-lab.yaml", "--trial", "bf16-true", "--rates", slow}),
            kExitOk)
      << err_.str();
  EXPECT_NE(err_.str().find("note: --rates " + slow + " served no trial: it is a probe of cuda " +
                            testing::H200Probe(1).device_name),
            std::string::npos)
      << err_.str();
}

TEST_F(EstimateTest, ARatesFileThatIsNotAProbeIsRefusedByName) {
  nlohmann::ordered_json no_rounds = testing::H200Probe(1).ToJson();
  no_rounds.erase("measured_at");
  const std::map<std::string, std::string> refusals = {
      {(dir_ / "missing.json").string(),
       "--rates: cannot open " + (dir_ / "missing.json").string()},
      {Write("torn.json", R"({"version": 5, "matmul": [)"),
       "--rates: " + (dir_ / "torn.json").string() + ": not JSON"},
      {Write("partial.json", no_rounds.dump()),
       "--rates: " + (dir_ / "partial.json").string() + ": rate probe: 'measured_at' is missing"},
  };
  for (const auto& [path, message] : refusals) {
    EXPECT_EQ(Llmctl({Experiments() + "cpu-lab.yaml", "--rates", path}), kExitInvalidInput) << path;
    EXPECT_EQ(out_.str(), "") << path;
    EXPECT_NE(err_.str().find(message), std::string::npos) << err_.str();
  }
}

}  // namespace
}  // namespace llmctl::cli
