#include "controller/submission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/digest/digest.h"

namespace llmctl::controller {
namespace {

constexpr std::string_view kExperiment = R"(name: tiny
model: llmctl-demo
tokenizer: tokenizers/demo/tokenizer.json
data: {path: data/train.jsonl, max_seq_length: 64}
train: {micro_batch_size: 2, max_steps: 2}
device: cpu
trials:
  - name: a
  - name: b
    description: two devices
    set: {devices: 2, train.global_batch_size: 4}
    expect: oom
)";

class SubmissionTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir() + "/submission_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    blobs_ = std::move(*BlobStore::Open(root_));
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A one-file tree whose blob is uploaded when `upload` says so.
  digest::InputTree FileTree(std::string_view name, std::string_view content, bool upload) {
    digest::InputTree tree{.digest = "",
                           .files = {{std::string(name), digest::Sha256Hex(content),
                                      static_cast<int64_t>(content.size())}},
                           .is_file = true};
    tree.digest = digest::TreeDigest(tree.files);
    if (upload) {
      auto writer = *blobs_->BeginWrite(tree.files[0].sha256, tree.files[0].size);
      EXPECT_TRUE(writer->Append(content).ok());
      EXPECT_TRUE(writer->Commit(tree.files[0].sha256).ok());
    }
    return tree;
  }

  std::string root_;
  std::unique_ptr<BlobStore> blobs_;
};

TEST_F(SubmissionTest, ExpandsTrialsWithTheirDevicesAndInputs) {
  const digest::InputTree data = FileTree("train.jsonl", "{\"text\": \"hi\"}\n", true);
  auto experiment =
      PrepareSubmission(kExperiment, "tiny.yaml", {{"data/train.jsonl", data}}, *blobs_);
  ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
  EXPECT_EQ(experiment->name, "tiny");
  EXPECT_EQ(experiment->filename, "tiny.yaml");
  EXPECT_EQ(experiment->yaml_text, kExperiment);
  EXPECT_EQ(experiment->inputs,
            (std::map<std::string, std::string>{{"data/train.jsonl", data.digest}}));
  ASSERT_EQ(experiment->trials.size(), 2u);
  EXPECT_EQ(experiment->trials[0].name, "a");
  EXPECT_EQ(experiment->trials[0].device_type, "cpu");
  EXPECT_EQ(experiment->trials[0].device_count, 1);
  EXPECT_FALSE(experiment->trials[0].expect.has_value());
  // devices: 2 on cpu: two ranks sharing the node's one cpu device.
  EXPECT_EQ(experiment->trials[1].device_count, 1);
  EXPECT_EQ(experiment->trials[1].expect, "oom");
  EXPECT_EQ(experiment->trials[1].description, "two devices");

  auto config = TrialConfig::FromJson(nlohmann::json::parse(experiment->trials[1].config_json));
  ASSERT_TRUE(config.ok());
  // Paths stay as written: the controller has no copy of the user's directory.
  EXPECT_EQ(config->GetString("data.path"), "data/train.jsonl");
  EXPECT_EQ(config->GetInt("devices"), 2);
}

TEST_F(SubmissionTest, PredictionsAreAttachedToTheirTrialsAndChecked) {
  const digest::InputTree data = FileTree("train.jsonl", "{\"text\": \"hi\"}\n", true);
  auto experiment =
      PrepareSubmission(kExperiment, "tiny.yaml", {{"data/train.jsonl", data}}, *blobs_);
  ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
  const nlohmann::json prediction = {{"peak_bytes", 2048},        {"activation_bytes", 1024},
                                     {"model_state_bytes", 1000}, {"peak_phase", "backward"},
                                     {"device_memory_bytes", 0},  {"verdict", ""}};
  ASSERT_TRUE(AttachPredictions({{"b", prediction}}, *experiment).ok());
  EXPECT_FALSE(experiment->trials[0].prediction_json.has_value());
  EXPECT_EQ(nlohmann::json::parse(*experiment->trials[1].prediction_json), prediction);

  Status unknown = AttachPredictions({{"c", prediction}}, *experiment);
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "tiny.yaml: prediction of trial 'c': the file has no such trial");
  // A name of the caller's bytes is quoted on one line and cut short: the refusal reaches a
  // terminal.
  Status forged = AttachPredictions({{"x\x1b[2J\nFORGED " + std::string(100'000, 'y'), prediction}},
                                    *experiment);
  EXPECT_THAT(forged.message(),
              ::testing::StartsWith("tiny.yaml: prediction of trial 'x [2J FORGED y"));
  EXPECT_LT(forged.message().size(), 400u);
  nlohmann::json negative = prediction;
  negative["peak_bytes"] = -1;
  EXPECT_EQ(AttachPredictions({{"a", negative}}, *experiment).message(),
            "tiny.yaml: prediction of trial 'a': peak_bytes must be a byte count");
  nlohmann::json verdict = prediction;
  verdict["verdict"] = "maybe";
  EXPECT_EQ(
      AttachPredictions({{"a", verdict}}, *experiment).message(),
      "tiny.yaml: prediction of trial 'a': verdict must be fits, tight or oom, not \"maybe\"");
  verdict["verdict"] = 3;  // another type: refused by name, never thrown
  EXPECT_EQ(AttachPredictions({{"a", verdict}}, *experiment).message(),
            "tiny.yaml: prediction of trial 'a': verdict must be fits, tight or oom, not 3");
  // A hostile verdict is named in a bounded message on one line, its escapes neutralised.
  verdict["verdict"] = "\x1b]0;T\a" + std::string(100'000, 'z');
  const std::string hostile = AttachPredictions({{"a", verdict}}, *experiment).message();
  EXPECT_TRUE(hostile.starts_with(
      "tiny.yaml: prediction of trial 'a': verdict must be fits, tight or oom, not "))
      << hostile;
  EXPECT_LT(hostile.size(), 200u);
  EXPECT_EQ(hostile.find_first_of("\x1b\a\n"), std::string::npos) << hostile;
  verdict["verdict"] = "tight";  // within the caching allocator's slack of a GPU's limit
  EXPECT_TRUE(AttachPredictions({{"a", verdict}}, *experiment).ok());

  // Its texts are printed by `llmctl report` and sent by TimedRuns, up to 2,000 at a time: each
  // printable and at most 4 KiB, and the whole stored prediction at most 16 KiB.
  nlohmann::json text = prediction;
  text["calibration"] = "built-in\x1b[2J";
  EXPECT_EQ(AttachPredictions({{"a", text}}, *experiment).message(),
            "tiny.yaml: prediction of trial 'a': calibration holds a control character");
  text["calibration"] = "built-in\u202e";
  EXPECT_EQ(AttachPredictions({{"a", text}}, *experiment).message(),
            "tiny.yaml: prediction of trial 'a': calibration holds a bidirectional text control");
  text["calibration"] = std::string(4097, 'c');
  EXPECT_EQ(AttachPredictions({{"a", text}}, *experiment).message(),
            "tiny.yaml: prediction of trial 'a': calibration longer than 4096 bytes");
  text["calibration"] = 7;
  EXPECT_EQ(AttachPredictions({{"a", text}}, *experiment).message(),
            "tiny.yaml: prediction of trial 'a': calibration must be text");
  nlohmann::json large = prediction;
  large["padding"] = std::string(16 << 10, 'p');
  const Status refused = AttachPredictions({{"a", large}}, *experiment);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("prediction of trial 'a': "));
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("bytes stored, over the 16384-byte limit"));
}

TEST_F(SubmissionTest, AFileErrorPointsIntoTheFile) {
  auto experiment = PrepareSubmission("model: llmctl-demo\ntrain: {micro_bach_size: 2}\n",
                                      "typo.yaml", {}, *blobs_);
  EXPECT_EQ(experiment.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(experiment.status().message().rfind("typo.yaml:2:", 0), 0u)
      << experiment.status().message();
  EXPECT_NE(experiment.status().message().find("micro_batch_size"), std::string::npos);
}

TEST_F(SubmissionTest, TheFilesNameMustBePrintable) {
  // Stored, logged and printed: a newline would forge a log line, an escape a terminal sequence.
  for (const std::string& filename :
       {std::string("x\n[info] forged.yaml"), std::string("\x1b[31mred.yaml"),
        std::string(kMaxFilenameBytes + 1, 'a')}) {
    auto experiment = PrepareSubmission(kExperiment, filename, {}, *blobs_);
    EXPECT_EQ(experiment.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(experiment.status().message().rfind("submit: the file's name (filename) ", 0), 0u)
        << experiment.status().message();
    EXPECT_EQ(experiment.status().message().find(filename), std::string::npos);
  }
  EXPECT_TRUE(PrepareSubmission(kExperiment, "experiments/my lab ü.yaml", {}, *blobs_).ok());
}

TEST_F(SubmissionTest, InputsMustBeWholeAndUploaded) {
  const digest::InputTree missing = FileTree("train.jsonl", "not uploaded", false);
  auto not_uploaded =
      PrepareSubmission(kExperiment, "tiny.yaml", {{"data/train.jsonl", missing}}, *blobs_);
  EXPECT_EQ(not_uploaded.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(not_uploaded.status().message().find(
                "tiny.yaml: input 'data/train.jsonl': 1 of 1 files are not uploaded"),
            std::string::npos)
      << not_uploaded.status().message();

  digest::InputTree forged = FileTree("train.jsonl", "uploaded", true);
  forged.files[0].size = 999;
  auto bad_digest =
      PrepareSubmission(kExperiment, "tiny.yaml", {{"data/train.jsonl", forged}}, *blobs_);
  EXPECT_EQ(bad_digest.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_digest.status().message().find("does not match its manifest"), std::string::npos);
  // A size that is not the blob's, in a tree whose digest is made again over it: every launch
  // would announce that size to the node, which would refuse the upload.
  forged.digest = digest::TreeDigest(forged.files);
  auto bad_size =
      PrepareSubmission(kExperiment, "tiny.yaml", {{"data/train.jsonl", forged}}, *blobs_);
  EXPECT_EQ(bad_size.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_size.status().message(),
            "tiny.yaml: input 'data/train.jsonl': file 'train.jsonl' claims 999 bytes, its "
            "uploaded blob has 8");

  EXPECT_EQ(PrepareSubmission(kExperiment, "", {}, *blobs_).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TrialInputDigestsTest, MapsPathKeysWhoseValueWasUploaded) {
  TrialConfig config;
  ASSERT_TRUE(config.Set("model", std::string("models/tiny")).ok());
  ASSERT_TRUE(config.Set("tokenizer", std::string("tok/tokenizer.json")).ok());
  ASSERT_TRUE(config.Set("data.path", std::string("data/train.jsonl")).ok());
  ASSERT_TRUE(config.Set("output_dir", std::string("out")).ok());
  const std::map<std::string, std::string> inputs = {
      {"models/tiny", "d-model"}, {"data/train.jsonl", "d-data"}, {"unused/path", "d-unused"}};
  EXPECT_EQ(TrialInputDigests(config, inputs),
            (std::map<std::string, std::string>{{"data.path", "d-data"}, {"model", "d-model"}}));
}

}  // namespace
}  // namespace llmctl::controller
