#include "common/inputs/trial_inputs.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/experiment.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

// ctest runs in the source directory; the fixtures are scripts/fixtures/make_broken_inputs.py's.
const fs::path kInputs = "tests/fixtures/broken_inputs/inputs";

TrialConfig Demo(const std::string& data, const std::string& model = "llmctl-demo",
                 const std::string& init = "random") {
  TrialConfig config;
  EXPECT_TRUE(config.Set("model", model).ok());
  EXPECT_TRUE(config.Set("init", init).ok());
  EXPECT_TRUE(config.Set("tokenizer", (kInputs / "tokenizer.json").string()).ok());
  EXPECT_TRUE(config.Set("data.path", data).ok());
  EXPECT_TRUE(config.Set("train.micro_batch_size", int64_t{2}).ok());
  return config;
}

TEST(TrialInputsTest, GoodInputsAreCountedWithoutReadingWeights) {
  const ModelConfig* demo = FindPreset("llmctl-demo");
  TrialInputsChecker checker;
  StatusOr<TrialInputsSummary> summary =
      checker.Check(Demo((kInputs / "good.jsonl").string()), demo);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->records, 8);
  EXPECT_EQ(summary->tokenizer_vocab, 2048);
  EXPECT_EQ(summary->checkpoint_tensors, 0);  // init: random reads no checkpoint
}

TEST(TrialInputsTest, ErrorsNameTheKeyTheFileAndTheLine) {
  TrialInputsChecker checker;
  StatusOr<TrialInputsSummary> summary =
      checker.Check(Demo((kInputs / "broken_line.jsonl").string()), FindPreset("llmctl-demo"));
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().message().rfind(
                "data.path: " + (kInputs / "broken_line.jsonl").string() + ":2: ", 0),
            0u)
      << summary.status().message();
}

TEST(TrialInputsTest, NodePathsAreLeftToTheNode) {
  TrialConfig config = Demo("node:/data/train.jsonl");
  ASSERT_TRUE(config.Set("tokenizer", std::string("node:/models/tokenizer.json")).ok());
  StatusOr<TrialInputsSummary> summary =
      TrialInputsChecker().Check(config, FindPreset("llmctl-demo"));
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->records, 0);
  EXPECT_EQ(summary->tokenizer_path, "");
  // On the node, the prefix goes and the path is an ordinary one.
  LocalizeNodePaths(config);
  EXPECT_EQ(config.GetString("data.path"), "/data/train.jsonl");
  EXPECT_EQ(config.GetString("tokenizer"), "/models/tokenizer.json");
}

// A config.json may claim any number of layers: the count is compared before any list is made.
TEST(TrialInputsTest, AClaimOfBillionsOfLayersIsCountedNotListed) {
  ModelConfig model = *FindPreset("llmctl-demo");
  model.num_hidden_layers = int64_t{1} << 40;
  EXPECT_GT(CheckpointTensorCount(model), int64_t{1} << 42);
  auto checkpoint =
      safetensors::ShardedCheckpoint::Open((kInputs / "models" / "missing_tensor").string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  const Status status = CheckCheckpointTensors(**checkpoint, model, "dir");
  EXPECT_NE(status.message().find("config.json describes"), std::string::npos) << status.message();
}

// The same dataset in several trials is read once; a changed micro-batch is still compared.
TEST(TrialInputsTest, SharedFilesAreCheckedOnce) {
  const fs::path dir = fs::temp_directory_path() / "llmctl-trial-inputs-test";
  fs::create_directories(dir);
  const fs::path data = dir / "four.jsonl";
  {
    std::ofstream out(data);
    for (int i = 0; i < 4; ++i)
      out << R"({"instruction": "a", "output": "b"})"
          << "\n";
  }
  TrialInputsChecker checker;
  ASSERT_TRUE(checker.Check(Demo(data.string()), FindPreset("llmctl-demo")).ok());
  fs::remove(data);  // a second read would fail now
  TrialConfig bigger = Demo(data.string());
  ASSERT_TRUE(bigger.Set("train.micro_batch_size", int64_t{8}).ok());
  ASSERT_TRUE(bigger.Set("train.global_batch_size", int64_t{8}).ok());
  StatusOr<TrialInputsSummary> summary = checker.Check(bigger, FindPreset("llmctl-demo"));
  ASSERT_FALSE(summary.ok());
  EXPECT_NE(summary.status().message().find("has 4 records, fewer than one micro-batch of 8"),
            std::string::npos)
      << summary.status().message();
  fs::remove_all(dir);
}

// The bytes this process has mapped (/proc/self/statm's first field), which RLIMIT_AS caps.
uint64_t MappedBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

// The check reads a dataset a line at a time: 80 MiB of records pass in a process allowed 32 MiB
// more than it holds (it was read whole into one string first, which cannot be allocated then).
TEST(TrialInputsTest, ADatasetLargerThanTheMemoryAllowedIsCheckedALineAtATime) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer maps terabytes of shadow and its own allocator's space, which "
                  "RLIMIT_AS counts";
#endif
  const fs::path dir = fs::temp_directory_path() / "llmctl-trial-inputs-large-test";
  fs::create_directories(dir);
  const fs::path data = dir / "large.jsonl";
  constexpr int kRecords = 20'480;  // of 4 KiB: 80 MiB
  {
    std::ofstream out(data, std::ios::binary);
    const std::string output(4096 - 41, 'x');
    for (int i = 0; i < kRecords; ++i) {
      out << R"({"instruction": "Say it.", "output": ")" << output << "\"}\n";
    }
  }
  ASSERT_GE(fs::file_size(data), uint64_t{80} << 20);
  TrialInputsChecker checker;
  // The tokenizer is read (and kept) before the limit: only the dataset's reading is measured.
  ASSERT_TRUE(
      checker.Check(Demo((kInputs / "good.jsonl").string()), FindPreset("llmctl-demo")).ok());
  const auto check_within_limit = [&] {
    const rlimit limit{MappedBytes() + (uint64_t{32} << 20), RLIM_INFINITY};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(2);
    StatusOr<TrialInputsSummary> summary =
        checker.Check(Demo(data.string()), FindPreset("llmctl-demo"));
    std::_Exit(summary.ok() && summary->records == kRecords ? 0 : 1);
  };
  EXPECT_EXIT(check_within_limit(), ::testing::ExitedWithCode(0), "");
  fs::remove_all(dir);
}

// A model directory holding `model`'s tensors (F32) and one transformers ignores on load, of
// `ignored_bytes` U8, last in the file; the data is a hole past the header, so the file takes no
// room however large it claims to be.
void WriteSparseCheckpoint(const fs::path& dir, const ModelConfig& model, uint64_t ignored_bytes) {
  fs::create_directories(dir);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const CheckpointTensor& tensor : CheckpointTensors(model)) {
    uint64_t bytes = 4;
    for (int64_t dim : tensor.shape) bytes *= static_cast<uint64_t>(dim);
    header[tensor.name] = {
        {"dtype", "F32"}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["model.rotary_emb.inv_freq"] = {{"dtype", "U8"},
                                         {"shape", {ignored_bytes}},
                                         {"data_offsets", {offset, offset + ignored_bytes}}};
  offset += ignored_bytes;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();
  const fs::path file = dir / "model.safetensors";
  {
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << text;
  }
  fs::resize_file(file, 8 + length + offset);
}

// The check reads a checkpoint's headers with pread and maps none of it: in llmctl a mapping was
// a SIGBUS waiting for the user's model directory to be written over meanwhile. 4 GiB of weights
// pass in a process allowed 256 MiB more than it holds (mapping them cannot, then).
TEST(TrialInputsTest, ACheckpointsHeadersAreReadWithoutMappingItsWeights) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer maps terabytes of shadow and its own allocator's space, which "
                  "RLIMIT_AS counts";
#endif
  const fs::path dir = fs::temp_directory_path() / "llmctl-trial-inputs-unmapped-test";
  fs::remove_all(dir);
  const ModelConfig* demo = FindPreset("llmctl-demo");
  WriteSparseCheckpoint(dir, *demo, uint64_t{4} << 30);
  TrialInputsChecker checker;
  // The tokenizer and the dataset are read (and kept) before the limit.
  ASSERT_TRUE(checker.Check(Demo((kInputs / "good.jsonl").string()), demo).ok());
  const auto check_within_limit = [&] {
    const rlimit limit{MappedBytes() + (uint64_t{256} << 20), RLIM_INFINITY};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(2);
    StatusOr<TrialInputsSummary> summary =
        checker.Check(Demo((kInputs / "good.jsonl").string(), dir.string(), "pretrained"), demo);
    if (!summary.ok()) std::cerr << summary.status().message() << "\n";
    std::_Exit(summary.ok() && summary->checkpoint_tensors == CheckpointTensorCount(*demo) + 1 ? 0
                                                                                               : 1);
  };
  EXPECT_EXIT(check_within_limit(), ::testing::ExitedWithCode(0), "");
  fs::remove_all(dir);
}

// Every shipped experiment's inputs pass the check `llmctl submit` runs, so a user submitting one
// of them is never refused.
TEST(TrialInputsTest, ShippedExperimentsPass) {
  TrialInputsChecker checker;
  int trials = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator("experiments")) {
    if (entry.path().extension() != ".yaml") continue;
    StatusOr<Experiment> experiment = LoadExperimentFile(entry.path().string());
    ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
    for (const Trial& trial : experiment->trials) {
      const std::string model_name = trial.config.GetString("model");
      StatusOr<ModelConfig> model = ResolveModel(model_name);
      StatusOr<TrialInputsSummary> summary =
          checker.Check(trial.config, model.ok() ? &*model : nullptr);
      EXPECT_TRUE(summary.ok()) << entry.path() << " trial " << trial.name << ": "
                                << summary.status().ToString();
      ++trials;
    }
  }
  EXPECT_GT(trials, 30);
}

}  // namespace
}  // namespace llmctl
