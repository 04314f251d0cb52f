// Checkpoints: a resumed run continues the uninterrupted one exactly, a stop writes its last
// complete step, and a checkpoint that may come from another node is checked before it is used
// and read only as far as the model needs. On the demo model, each test in its own process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <streambuf>
#include <utility>

#include "common/files.h"
#include "common/rank_files.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/checkpoints.h"
#include "trainer/train/trainer.h"

namespace llmctl::trainer {
namespace {

using testing::DemoConfig;
using testing::RunAndRecord;
using testing::TrialRecord;

TEST(CheckpointResumeTest, ResumedRunReproducesTheUninterruptedLossesExactly) {
  const std::string out = testing::FreshTempDir("resume");
  TrialRecord whole = RunAndRecord(
      DemoConfig({{"train.max_steps", "6"}, {"checkpoint_every", "3"}, {"output_dir", out}}));
  ASSERT_EQ(whole.result.outcome, Outcome::kOk) << whole.result.error;
  ASSERT_EQ(whole.OfType("checkpoint").size(), 2u);
  const std::string checkpoint = out + "/checkpoints/step-3";
  ASSERT_TRUE(std::filesystem::exists(checkpoint + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(checkpoint + ".tmp"));

  TrialRecord resumed = RunAndRecord(DemoConfig({{"train.max_steps", "6"}}), checkpoint);
  ASSERT_EQ(resumed.result.outcome, Outcome::kOk) << resumed.result.error;
  EXPECT_EQ(resumed.events.front()["first_step"], 3);
  const std::vector<double> all = whole.Losses();
  const std::vector<double> rest = resumed.Losses();
  ASSERT_EQ(all.size(), 6u);
  ASSERT_EQ(rest.size(), 3u);
  for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], all[i + 3]) << "step " << i + 3;
  std::filesystem::remove_all(out);
}

// Raises `cancel` once the trainer has printed the line of step `after_step`, so the stop arrives
// while the next step runs, as llm-train's SIGTERM handler would raise it.
class CancelAfterStep : public std::streambuf {
 public:
  CancelAfterStep(int after_step, std::atomic<bool>* cancel)
      : marker_("[step " + std::to_string(after_step) + "/"), cancel_(cancel) {}

 protected:
  int overflow(int c) override {
    if (c != traits_type::eof()) Append(std::string(1, static_cast<char>(c)));
    return c;
  }
  std::streamsize xsputn(const char* text, std::streamsize count) override {
    Append(std::string(text, static_cast<size_t>(count)));
    return count;
  }

 private:
  void Append(const std::string& text) {
    printed_ += text;
    if (printed_.find(marker_) != std::string::npos) cancel_->store(true);
  }
  const std::string marker_;
  std::atomic<bool>* cancel_;
  std::string printed_;
};

// Runs `config` and stops it while the step after `after_step` runs: as llm-train's SIGTERM would,
// or, with `checkpoint`, as its SIGUSR1 would (a checkpoint first). `free_disk_bytes` stands in for
// statvfs when given.
TrialRecord RunAndStopAfterStep(
    const TrialConfig& config, int after_step, bool checkpoint,
    std::function<StatusOr<uint64_t>(const std::string&)> free_disk_bytes = nullptr) {
  std::atomic<bool> cancel{false};
  const std::atomic<bool> checkpoint_on_cancel{checkpoint};
  CancelAfterStep stop(after_step, &cancel);
  std::ostream human(&stop);
  RunOptions options;
  options.human = &human;
  options.cancel = &cancel;
  options.checkpoint_on_cancel = &checkpoint_on_cancel;
  options.free_disk_bytes = std::move(free_disk_bytes);
  return RunAndRecord(config, std::move(options));
}

// Resuming from `checkpoint`, written after `completed_steps` steps, gives exactly the losses of
// the rest of the uninterrupted run `whole`.
void ExpectResumeContinues(const std::string& checkpoint, const TrialRecord& whole,
                           size_t completed_steps) {
  const std::vector<double> all = whole.Losses();
  TrialRecord resumed =
      RunAndRecord(DemoConfig({{"train.max_steps", std::to_string(all.size())}}), checkpoint);
  ASSERT_EQ(resumed.result.outcome, Outcome::kOk) << resumed.result.error;
  const std::vector<double> rest = resumed.Losses();
  ASSERT_EQ(rest.size(), all.size() - completed_steps);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i], all[i + completed_steps]) << "step " << i + completed_steps;
  }
}

TEST(CheckpointResumeTest, AStoppedRunCheckpointsItsLastCompleteStepAndResumesExactly) {
  const std::string out = testing::FreshTempDir("stopped");
  TrialRecord whole = RunAndRecord(DemoConfig({{"train.max_steps", "6"}}));
  ASSERT_EQ(whole.result.outcome, Outcome::kOk) << whole.result.error;

  // checkpoint_every 4 would first write after step 4; the stop during step 3 writes step-2.
  const TrialRecord stopped = RunAndStopAfterStep(
      DemoConfig({{"train.max_steps", "6"}, {"checkpoint_every", "4"}, {"output_dir", out}}), 2,
      /*checkpoint=*/false);
  ASSERT_EQ(stopped.result.outcome, Outcome::kCancelled) << stopped.result.error;
  const std::string checkpoint = out + "/checkpoints/step-2";
  ASSERT_TRUE(std::filesystem::exists(checkpoint + "/model.safetensors"));

  ExpectResumeContinues(checkpoint, whole, 2);
  std::filesystem::remove_all(out);
}

TEST(CheckpointResumeTest, AStopAskingForACheckpointWritesOneWithoutCheckpointEvery) {
  const std::string out = testing::FreshTempDir("requested");
  TrialRecord whole = RunAndRecord(DemoConfig({{"train.max_steps", "6"}}));
  ASSERT_EQ(whole.result.outcome, Outcome::kOk) << whole.result.error;
  const TrialConfig config = DemoConfig({{"train.max_steps", "6"}, {"output_dir", out}});

  // A plain stop of a trial without checkpoint_every keeps nothing.
  const TrialRecord plain = RunAndStopAfterStep(config, 2, /*checkpoint=*/false);
  ASSERT_EQ(plain.result.outcome, Outcome::kCancelled) << plain.result.error;
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoints"));
  ASSERT_EQ(plain.OfType("result").size(), 1u);
  EXPECT_FALSE(plain.OfType("result").front().contains("checkpoint"));

  const TrialRecord stopped = RunAndStopAfterStep(config, 2, /*checkpoint=*/true);
  ASSERT_EQ(stopped.result.outcome, Outcome::kCancelled) << stopped.result.error;
  EXPECT_EQ(stopped.result.error, "cancelled at step 2");
  const std::string checkpoint = out + "/checkpoints/step-2";
  ASSERT_TRUE(std::filesystem::exists(checkpoint + "/model.safetensors"));
  ASSERT_EQ(stopped.OfType("result").size(), 1u);
  const nlohmann::json result = stopped.OfType("result").front();
  EXPECT_EQ(result["checkpoint"], (nlohmann::json{{"step", 1}, {"path", checkpoint}}))
      << result.dump();

  ExpectResumeContinues(checkpoint, whole, 2);
  std::filesystem::remove_all(out);
}

TEST(CheckpointResumeTest, AStopCheckpointThatDoesNotFitOnTheDiskIsSkippedAndSaysWhy) {
  const std::string out = testing::FreshTempDir("full");
  std::string asked;
  const TrialRecord stopped =
      RunAndStopAfterStep(DemoConfig({{"train.max_steps", "6"}, {"output_dir", out}}), 2,
                          /*checkpoint=*/true, [&](const std::string& path) -> StatusOr<uint64_t> {
                            asked = path;
                            return uint64_t{4096};
                          });
  ASSERT_EQ(stopped.result.outcome, Outcome::kCancelled) << stopped.result.error;
  EXPECT_EQ(asked, out);
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoints"));
  EXPECT_TRUE(stopped.result.error.starts_with("cancelled at step 2; checkpoint skipped: needs "))
      << stopped.result.error;
  EXPECT_TRUE(stopped.result.error.ends_with(", 4.00 KiB free in " + out)) << stopped.result.error;
  ASSERT_EQ(stopped.OfType("result").size(), 1u);
  EXPECT_FALSE(stopped.OfType("result").front().contains("checkpoint"));
  std::filesystem::remove_all(out);
}

TEST(CheckpointResumeTest, CheckpointBytesCoverWhatSaveCheckpointWrites) {
  const std::string out = testing::FreshTempDir("size");
  const NamedTensors model = {{"embed", torch::randn({64, 32})},
                              {"norm", torch::ones({32}, torch::kBFloat16)}};
  const NamedTensors optimizer = {{"embed.exp_avg", torch::zeros({64, 32})},
                                  {"step", torch::zeros({}, torch::kFloat32)}};
  TrainingState state;
  state.config = DemoConfig({}).ToJson();
  ASSERT_TRUE(SaveCheckpoint(out + "/step-1", model, optimizer, state).ok());
  uint64_t written = 0;
  for (const auto& file : std::filesystem::directory_iterator(out + "/step-1")) {
    written += file.file_size();
  }
  const uint64_t tensor_bytes = 2 * 64 * 32 * 4 + 32 * 2 + 4;
  EXPECT_GT(written, tensor_bytes);
  EXPECT_GE(CheckpointBytes(model, optimizer), written);
  // An allowance, not a multiple: a large model's estimate stays close to its tensors' bytes.
  EXPECT_LT(CheckpointBytes(model, optimizer), tensor_bytes + 128 * 1024);
  std::filesystem::remove_all(out);
}

// A checkpoint cut short (RLIMIT_FSIZE here, a full disk elsewhere) leaves neither its staging
// directory, which would keep the disk full, nor a checkpoint.
TEST(CheckpointResumeTest, AFailedCheckpointLeavesNoStagingDirectory) {
  const std::string out = testing::FreshTempDir("cut-short");
  const NamedTensors model = {{"embed", torch::ones({256, 256})}};  // 256 KiB
  const NamedTensors optimizer = {{"step", torch::zeros({}, torch::kFloat32)}};
  TrainingState state;
  state.config = DemoConfig({}).ToJson();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Writes past 64 KiB fail with EFBIG (not the signal).
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(2);
    std::_Exit(SaveCheckpoint(out + "/step-1", model, optimizer, state).ok() ? 3 : 0);
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status)) << wait_status;
  ASSERT_EQ(WEXITSTATUS(wait_status), 0);
  EXPECT_FALSE(std::filesystem::exists(out + "/step-1.tmp"));
  EXPECT_FALSE(std::filesystem::exists(out + "/step-1"));
  std::filesystem::remove_all(out);
}

// What a run killed while writing a checkpoint left is cleared when the next run starts; complete
// checkpoints stay.
TEST(CheckpointResumeTest, ARunRemovesTheStagingDirectoriesOfKilledRuns) {
  const std::string out = testing::FreshTempDir("killed");
  const std::string checkpoints = out + "/checkpoints";
  std::filesystem::create_directories(checkpoints + "/step-7.tmp");
  std::ofstream(checkpoints + "/step-7.tmp/model.safetensors") << "partial";
  std::filesystem::create_directories(checkpoints + "/step-3");
  std::ofstream(checkpoints + "/step-3/model.safetensors") << "kept";
  const TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "1"}, {"output_dir", out}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  EXPECT_FALSE(std::filesystem::exists(checkpoints + "/step-7.tmp"));
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/step-3/model.safetensors"));
  std::filesystem::remove_all(out);
}

// A checkpoint may come from another node: its numbers are checked before they are used, each
// refusal naming what is wrong (invalid input, exit 2), not a LibTorch failure mid-run or a run
// that says ok without training.
TEST(CheckpointResumeTest, ACheckpointsNumbersAreCheckedBeforeTheyAreUsed) {
  const std::string out = testing::FreshTempDir("hostile");
  const std::vector<std::pair<std::string, std::string>> keys = {{"train.max_steps", "4"},
                                                                 {"optimizer", "sgd"},
                                                                 {"train.momentum", "0.9"},
                                                                 {"precision", "16-mixed"}};
  std::vector<std::pair<std::string, std::string>> writing = keys;
  writing.insert(writing.end(), {{"checkpoint_every", "2"}, {"output_dir", out}});
  ASSERT_EQ(RunAndRecord(DemoConfig(writing)).result.outcome, Outcome::kOk);
  const std::string good = out + "/checkpoints/step-2";
  ASSERT_EQ(RunAndRecord(DemoConfig(keys), good).result.outcome, Outcome::kOk);

  // Each case: a copy of the good checkpoint, changed by `spoil`; the error it must name.
  const auto refused = [&](const std::function<void(const std::string&)>& spoil) {
    const std::string dir = out + "/spoilt";
    std::filesystem::remove_all(dir);
    std::filesystem::copy(good, dir);
    spoil(dir);
    const TrialRecord run = RunAndRecord(DemoConfig(keys), dir);
    EXPECT_TRUE(run.result.invalid_input) << run.result.error;
    return run.result.error;
  };
  const auto edit_state = [](const std::string& dir, const char* key, const nlohmann::json& value) {
    const std::string path = dir + "/" + kCheckpointStateFile;
    nlohmann::json state = nlohmann::json::parse(*ReadFileToString(path));
    state[key] = value;
    std::ofstream(path) << state.dump();
  };
  EXPECT_THAT(refused([&](const std::string& dir) { edit_state(dir, "next_step", 1000); }),
              ::testing::HasSubstr("next_step 1000 is past the trial's 4 steps"));
  EXPECT_THAT(refused([&](const std::string& dir) { edit_state(dir, "loss_scale", 0); }),
              ::testing::HasSubstr("loss_scale 0.000000 is not a scale a 16-mixed run can use"));
  EXPECT_THAT(refused([&](const std::string& dir) {
                ASSERT_TRUE(WriteTensors(dir + "/rng.safetensors",
                                         {{"cpu", torch::zeros({16}, torch::kUInt8)}})
                                .ok());
              }),
              ::testing::HasSubstr("generator state 'cpu' is not a CPU generator's"));
  const std::string optimizer_file = RankOptimizerFile(0);
  EXPECT_THAT(
      refused([&](const std::string& dir) {
        ASSERT_TRUE(
            WriteTensors(dir + "/" + optimizer_file, {{"x.momentum", torch::zeros({1})}}).ok());
      }),
      ::testing::HasSubstr("optimizer state 'x.momentum' is not a parameter's momentum"));
  EXPECT_THAT(
      refused([&](const std::string& dir) {
        ASSERT_TRUE(
            WriteTensors(dir + "/" + optimizer_file, {{"0.momentum", torch::zeros({1})}}).ok());
      }),
      ::testing::HasSubstr("optimizer state '0.momentum' has the wrong shape or dtype"));
  std::filesystem::remove_all(out);
}

// Adds a tensor of `bytes` zero bytes, named `name`, at the end of the safetensors file `path`,
// as a sparse file: no disk and no memory until read.
void AppendSparseTensor(const std::string& path, const std::string& name, uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_length = 0;
  in.read(reinterpret_cast<char*>(&header_length), 8);
  std::string header(header_length, ' ');
  in.read(header.data(), static_cast<std::streamsize>(header_length));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json json = nlohmann::ordered_json::parse(header);
  json[name] = {
      {"dtype", "U8"}, {"shape", {bytes}}, {"data_offsets", {data.size(), data.size() + bytes}}};
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << text << data;
  }
  std::filesystem::resize_file(path, 8 + length + data.size() + bytes);
}

// A checkpoint may come from another node: a tensor the model has no use for, however large,
// costs no memory (reading every tensor before checking any took a 1 TiB one whole).
TEST(CheckpointResumeTest, ATensorTheModelDoesNotUseIsNeverRead) {
  const std::string out = testing::FreshTempDir("sparse");
  const TrialRecord whole = RunAndRecord(
      DemoConfig({{"train.max_steps", "4"}, {"checkpoint_every", "2"}, {"output_dir", out}}));
  ASSERT_EQ(whole.result.outcome, Outcome::kOk) << whole.result.error;
  const std::string checkpoint = out + "/checkpoints/step-2";
  AppendSparseTensor(checkpoint + "/model.safetensors", "zzz.unused", uint64_t{1} << 40);
  ExpectResumeContinues(checkpoint, whole, 2);
  std::filesystem::remove_all(out);
}

TEST(CheckpointResumeTest, MissingCheckpointIsInvalidInput) {
  TrialRecord run = RunAndRecord(DemoConfig({{"train.max_steps", "2"}}), "/nonexistent/step-3");
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("/nonexistent/step-3"), std::string::npos) << run.result.error;
}

}  // namespace
}  // namespace llmctl::trainer
