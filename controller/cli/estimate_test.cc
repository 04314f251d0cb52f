// `llmctl estimate`: experiment files in, each trial's model state out, with no controller.
#include "controller/cli/estimate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "controller/cli/commands.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

// The repository's experiments/ (tests run from the source directory).
std::string Experiments() {
  const char* dir = std::getenv("LLMCTL_SOURCE_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/experiments/";
}

class EstimateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("llmctl-estimate-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }

  // Runs `llmctl estimate ARGS...` in-process; the exit code, with out_ and err_ holding the
  // output.
  int Llmctl(std::vector<std::string> args) {
    args.insert(args.begin(), {"llmctl", "estimate"});
    out_.str("");
    err_.str("");
    // No controller is asked: estimate never connects, so none is configured.
    CliContext context{
        .env = [](std::string_view) { return std::optional<std::string>(); },
        .out = out_,
        .err = err_,
        .out_is_tty = false,
        .self = dir_ / "llmctl",
        .daemon_ready_timeout = std::chrono::milliseconds(100),
        .watch_retry_interval = std::chrono::milliseconds(1),
    };
    return RunLlmctl(args, context);
  }

  fs::path dir_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(EstimateTest, JsonHasEachTrialsExactBytesAndSaysActivationsAreNotPredicted) {
  ASSERT_EQ(Llmctl({Experiments() + "demo.yaml", "--format", "json"}), kExitOk) << err_.str();
  const nlohmann::json out = nlohmann::json::parse(out_.str());
  EXPECT_EQ(out["activations_predicted"], false);
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
}

TEST_F(EstimateTest, TableListsEveryTrialInMiBWithCommForDataParallelTrials) {
  ASSERT_EQ(Llmctl({Experiments() + "multi.yaml"}), kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_NE(out.find("ranks    params     grads     optim      comm  model state"),
            std::string::npos)
      << out;
  // open_llama_7b: 6,738,415,616 fp32 parameters are 25,705.0 MiB of AdamW moments on one device.
  EXPECT_NE(out.find("one-device    open_llama_7b       1  12,852.5  12,852.5  25,705.0         –"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("activations (and the loss' logits"), std::string::npos) << out;
  EXPECT_NE(out.find("not a fits / out-of-memory verdict"), std::string::npos) << out;
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
}

}  // namespace
}  // namespace llmctl::cli
