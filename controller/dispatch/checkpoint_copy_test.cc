// Checkpoint copies: a lease stop's checkpoint copied and its trial resumed on another node with
// the tree shipped; a copy that fails leaves the trial to its node; ResultCheckpointOf and
// DescribeStopCheckpoint.
#include "controller/dispatch/checkpoint_copy.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/text.h"
#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

namespace fs = std::filesystem;

// The fake agent of a second node, n2.
struct OtherAgent {
  FakeAgentState state;
  std::unique_ptr<FakeAgent> service;
  std::unique_ptr<grpc::Server> server;
  ~OtherAgent() {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
  }
};

class CheckpointCopyTest : public DispatcherTest {
 protected:
  // Registers node n2 and serves its fake agent with the credentials it was issued.
  std::unique_ptr<OtherAgent> StartOtherAgent() {
    const std::string address =
        "unix:" + testing::TempDir() + "/dispatcher_test_n2_" + std::to_string(getpid()) + ".sock";
    auto agent = std::make_unique<OtherAgent>();
    agent->service = std::make_unique<FakeAgent>(agent->state);
    agent->server = ServeAgent(*agent->service, address, RegisterNodeAt("n2", address));
    EXPECT_NE(agent->server, nullptr);
    return agent;
  }
};

// A lease stop's checkpoint, as the worker's result names it and the fake agent serves it.
constexpr std::string_view kCheckpoint = "/agent/runs/1/one/1/output/checkpoints/step-3";
const std::map<std::string, std::string> kCheckpointFiles = {
    {"model.safetensors", "model weights"},
    {"optimizer.safetensors", "moments"},
    {"rng.safetensors", ""},
    {"trainer_state.json", R"({"next_step": 3})"}};

TEST_F(CheckpointCopyTest, ALeaseStopsCheckpointIsCopiedAndItsTrialResumesOnAnotherNode) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  agent_state_.checkpoint_files = kCheckpointFiles;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","train_seconds":1.5,"tokens_per_second":128.0,)"
      R"("peak_bytes":2000,"error":"cancelled at step 3","checkpoint":{"step":2,"path":")" +
      std::string(kCheckpoint) + R"("}})"};
  const int64_t experiment = SubmitOne();
  const int64_t trial = OnlyTrial(experiment).id;
  Tick();
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial, 1) == 3; }));

  // 9 minutes before the lease ends: stopped with a checkpoint, which the controller copies.
  ASSERT_TRUE(SetLease("n1", clock_.Now() + std::chrono::minutes(9)).ok());
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  ASSERT_TRUE(Eventually([&] { return CheckpointCopied(); }));
  std::vector<digest::TreeFile> files;
  for (const auto& [path, content] : kCheckpointFiles) {
    files.push_back({path, digest::Sha256Hex(content), static_cast<int64_t>(content.size())});
  }
  const std::string tree = digest::TreeDigest(files);
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.fetched_paths, std::vector<std::string>{std::string(kCheckpoint)});
  }
  for (const digest::TreeFile& file : files) {
    EXPECT_TRUE(fs::is_regular_file(config_.data_dir + "/blobs/" + file.sha256)) << file.path;
  }

  // The node goes with its lease (`llmctl node down`); another node continues the trial.
  std::unique_ptr<OtherAgent> n2 = StartOtherAgent();
  ASSERT_TRUE(daemon_->dispatcher().RemoveNode("n1").ok());
  StopAgent();
  StatusOr<store::TrialResume> resumed = daemon_->dispatcher().Resume(experiment, "one");
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->node, "n1");
  EXPECT_EQ(resumed->tree, tree);
  n2->state.script = {StepLine(3), StepLine(4), kResultLine};
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  {
    std::lock_guard lock(n2->state.mutex);
    const v1::RunTrialRequest& request =
        n2->state.runs.at(std::to_string(experiment) + "/one#2").request;
    ASSERT_TRUE(request.has_resume_from());
    EXPECT_EQ(request.resume_from().tree().digest(), tree);
    EXPECT_FALSE(request.resume_from().tree().is_file());
    EXPECT_EQ(request.resume_from().tree().files_size(), 4);
    // Every file of the checkpoint was sent to the node before RunTrial.
    for (const digest::TreeFile& file : files) {
      EXPECT_TRUE(n2->state.blobs.contains(file.sha256)) << file.path;
    }
  }
  StatusOr<std::vector<store::TrialStep>> steps = daemon_->store().RunSteps(experiment);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  std::vector<std::string> run;
  for (const store::TrialStep& step : *steps) {
    run.push_back(std::to_string(step.attempt) + ":" + std::to_string(step.step));
  }
  EXPECT_EQ(run, (std::vector<std::string>{"1:0", "1:1", "1:2", "2:3", "2:4"}));
}

TEST_F(CheckpointCopyTest, ACheckpointThatCannotBeCopiedIsResumedOnlyOnItsNode) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","checkpoint":{"step":0,"path":"/ckpt/step-1"}})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  std::unique_ptr<OtherAgent> n2 = StartOtherAgent();
  ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "one", /*checkpoint=*/true).ok());
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  // The agent does not have the directory (NOT_FOUND): no copy.
  ASSERT_TRUE(Eventually([&] { return CheckpointCopied(); }));
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.fetched_paths, std::vector<std::string>{"/ckpt/step-1"});
  }
  StatusOr<store::TrialResume> resumed = daemon_->dispatcher().Resume(experiment, "one");
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->tree, "");

  // Its node is away: n2 is connected and free, but does not get the trial.
  StopAgent();
  clock_.Advance(seconds(6));
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_NE(StatusOf(experiment)
                .trials(0)
                .notice()
                .find("it resumes from a checkpoint on node n1, which is not connected"),
            std::string::npos)
      << StatusOf(experiment).trials(0).notice();
  {
    std::lock_guard lock(n2->state.mutex);
    EXPECT_TRUE(n2->state.runs.empty());
  }
  // Back again, n1 continues it from its own disk.
  agent_state_.script = {StepLine(1), kResultLine};
  agent_state_.script_ends = true;
  StartAgent();
  clock_.Advance(seconds(6));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  std::lock_guard lock(agent_state_.mutex);
  const v1::RunTrialRequest& request =
      agent_state_.runs.at(std::to_string(experiment) + "/one#2").request;
  EXPECT_FALSE(request.resume_from().has_tree());
  EXPECT_EQ(request.resume_from().checkpoint(), "/ckpt/step-1");
}

// Each copy has a thread: once the copy is done and its trial has ended, the round joins it, so a
// controller that copies checkpoints for months does not keep a finished thread for each.
TEST_F(CheckpointCopyTest, TheRoundForgetsCopiesThatAreDoneOnceTheirTrialsHaveEnded) {
  agent_state_.checkpoint_files = kCheckpointFiles;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","checkpoint":{"step":0,"path":")" +
      std::string(kCheckpoint) + R"("}})"};
  constexpr size_t kCopies = 3;
  for (size_t copy = 1; copy <= kCopies; ++copy) {
    const int64_t experiment = SubmitOneThatKeepsRunning();
    ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "one", /*checkpoint=*/true).ok());
    ASSERT_TRUE(
        Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
    ASSERT_TRUE(Eventually([&] {
      std::lock_guard lock(agent_state_.mutex);
      return agent_state_.fetched_paths.size() == copy;
    }));
    ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().CheckpointCopiesInFlight() == 0; }));
  }
  EXPECT_GE(daemon_->dispatcher().CheckpointCopiesHeld(), 1);
  Tick();
  EXPECT_EQ(daemon_->dispatcher().CheckpointCopiesHeld(), 0);
}

// A 2-node fsdp checkpoint of 2 ranks a node: node rank 0's whole directory and node rank 1's
// ranks' shards make one tree; a node's stray file, or a rank's missing shard, is named.
TEST(MergeNodeCheckpointsTest, TakesEachNodesOwnRanksShards) {
  const auto file = [](const std::string& path) {
    return digest::TreeFile{path, digest::Sha256Hex(path), 1};
  };
  const std::vector<digest::TreeFile> zero = {
      file("trainer_state.json"), file("model.safetensors"), file("optimizer.safetensors"),
      file("optimizer.rank1.safetensors"), file("rng.safetensors")};
  const std::vector<digest::TreeFile> one = {file("optimizer.rank3.safetensors"),
                                             file("optimizer.rank2.safetensors")};
  auto merged = dispatch::MergeNodeCheckpoints({zero, one}, 2);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  std::vector<std::string> paths;
  for (const digest::TreeFile& f : *merged) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"model.safetensors", "optimizer.rank1.safetensors",
                                             "optimizer.rank2.safetensors",
                                             "optimizer.rank3.safetensors", "optimizer.safetensors",
                                             "rng.safetensors", "trainer_state.json"}));

  auto stray = dispatch::MergeNodeCheckpoints(
      {zero,
       {file("optimizer.rank2.safetensors"), file("optimizer.rank3.safetensors"),
        file("model.safetensors")}},
      2);
  ASSERT_FALSE(stray.ok());
  EXPECT_NE(stray.status().message().find("node rank 1 sent 'model.safetensors'"),
            std::string::npos)
      << stray.status().ToString();
  auto other_nodes_rank =
      dispatch::MergeNodeCheckpoints({zero, {file("optimizer.rank1.safetensors")}}, 2);
  ASSERT_FALSE(other_nodes_rank.ok());
  auto missing = dispatch::MergeNodeCheckpoints({zero, {file("optimizer.rank2.safetensors")}}, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no optimizer.rank3.safetensors from node rank 1"),
            std::string::npos)
      << missing.status().ToString();
}

TEST(ResultCheckpointOfTest, ReadsThePathAndStepOfAResultsCheckpoint) {
  auto checkpoint = dispatch::ResultCheckpointOf(
      R"({"type":"result","outcome":"cancelled","checkpoint":{"step":2,"path":"/out/step-3"}})");
  ASSERT_TRUE(checkpoint.has_value());
  EXPECT_EQ(checkpoint->path, "/out/step-3");
  EXPECT_EQ(checkpoint->step, 2);
  EXPECT_FALSE(dispatch::ResultCheckpointOf("").has_value());
  EXPECT_FALSE(dispatch::ResultCheckpointOf("not json").has_value());
  EXPECT_FALSE(dispatch::ResultCheckpointOf(R"({"type":"result"})").has_value());
  EXPECT_FALSE(
      dispatch::ResultCheckpointOf(R"({"checkpoint":{"step":"2","path":"/out"}})").has_value());
  EXPECT_FALSE(dispatch::ResultCheckpointOf(R"({"checkpoint":{"step":2}})").has_value());
  // What `llmctl resume` would refuse is no checkpoint to copy either (common/result_event.h).
  EXPECT_FALSE(
      dispatch::ResultCheckpointOf(R"({"checkpoint":{"step":-1,"path":"/out"}})").has_value());
  EXPECT_FALSE(dispatch::ResultCheckpointOf(R"({"checkpoint":{"step":2,"path":""}})").has_value());
}

TEST(DescribeStopCheckpointTest, NamesTheCheckpointOrWhyThereIsNone) {
  EXPECT_EQ(dispatch::DescribeStopCheckpoint(R"({"checkpoint":{"step":2,"path":"/out/step-3"}})", 4,
                                             "one"),
            "checkpoint after step 3 in /out/step-3 on the node (llmctl resume 4 'one' continues "
            "from it there; llmctl fetch 4 'one' copies the run's output while the node is up)");
  EXPECT_EQ(dispatch::DescribeStopCheckpoint(R"({"error":"the disk is full"})", 4, "one"),
            "no checkpoint (the disk is full)");
  // The result's error is the trainer's: quoted on one line and cut, as the agent quotes it.
  const std::string long_error =
      "{\"error\":\"\\u001b[2Jbad\\nline " + std::string(100'000, 'x') + "\"}";
  const std::string quoted = dispatch::DescribeStopCheckpoint(long_error, 4, "one");
  EXPECT_TRUE(quoted.starts_with("no checkpoint ( [2Jbad line xxx")) << quoted;
  EXPECT_LE(quoted.size(), std::string("no checkpoint ()").size() + kQuotedLineBytes);
  EXPECT_EQ(dispatch::DescribeStopCheckpoint(R"({"outcome":"cancelled"})", 4, "one"),
            "no checkpoint");
  EXPECT_EQ(dispatch::DescribeStopCheckpoint("", 4, "one"),
            "no checkpoint: the worker ended without a result (killed when its grace ran out?)");
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
