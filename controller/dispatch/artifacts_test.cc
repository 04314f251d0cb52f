// Artifact downloads from a node's agent: streamed into the sink, only the directory asked for,
// Unavailable without a link, Cancelled when the sink says no, DataLoss for a name outside the run.
#include "controller/dispatch/artifacts.h"

#include <gtest/gtest.h>

#include <vector>

#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

using ArtifactsTest = DispatcherTest;

v1::RunKey Key() {
  v1::RunKey key;
  key.set_experiment_id(1);
  key.set_trial("one");
  key.set_attempt(1);
  return key;
}

TEST_F(ArtifactsTest, StreamsARunsArtifactsFromItsNodeIntoTheSink) {
  Tick();  // links n1
  std::vector<v1::ArtifactChunk> chunks;
  const Status fetched =
      daemon_->dispatcher().FetchArtifacts("n1", Key(), [&](const v1::ArtifactChunk& chunk) {
        chunks.push_back(chunk);
        return true;
      });
  ASSERT_TRUE(fetched.ok()) << fetched.ToString();
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].path(), "output/adapter/1/one#1");
  EXPECT_EQ(chunks[0].data(), "weights");
}

// The controller does not pass on what an agent names outside the run's output/ and its own
// top-level files, nor any path that climbs or is absolute.
TEST_F(ArtifactsTest, NamesOutsideTheRunsOutputAreRefusedBeforeTheSinkSeesThem) {
  Tick();
  for (const auto& [name, problem] :
       {std::pair<std::string, std::string>{"input/secret.txt", "outside the run's output/"},
        {"output/../../../etc/passwd", "'..'"},
        {"/root/.ssh/id_rsa", "an absolute path"}}) {
    {
      std::lock_guard lock(agent_state_.mutex);
      agent_state_.artifact_name = name;
    }
    int seen = 0;
    const Status fetched = daemon_->dispatcher().FetchArtifacts(
        "n1", Key(), [&](const v1::ArtifactChunk&) { return ++seen > 0; });
    EXPECT_EQ(fetched.code(), StatusCode::kDataLoss) << name;
    EXPECT_NE(fetched.message().find("node n1 sent artifact '" + name + "': "), std::string::npos)
        << fetched.message();
    EXPECT_NE(fetched.message().find(problem), std::string::npos) << fetched.message();
    EXPECT_EQ(seen, 0) << name;
  }
}

TEST_F(ArtifactsTest, AskingForADirectoryTheRunLacksIsTheAgentsNotFound) {
  Tick();
  const Status fetched = daemon_->dispatcher().FetchArtifacts(
      "n1", Key(), [](const v1::ArtifactChunk&) { return true; }, "output/checkpoints/step-3");
  EXPECT_EQ(fetched.code(), StatusCode::kNotFound) << fetched.ToString();
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.fetched_paths, std::vector<std::string>{"output/checkpoints/step-3"});
}

// A node without a link is FailedPrecondition, naming it: the controller answered, and the CLI
// reads Unavailable as the controller's own absence ("is the controller running?", exit 3, which
// `llmctl fetch` said right after the daemons started, before the agent had answered).
TEST_F(ArtifactsTest, ANodeWithoutALinkIsNotConnectedAndASinkThatSaysNoCancels) {
  auto ignore = [](const v1::ArtifactChunk&) { return true; };
  const Status unlinked =
      daemon_->dispatcher().FetchArtifacts("n1", Key(), ignore);  // no round yet
  EXPECT_EQ(unlinked.code(), StatusCode::kFailedPrecondition) << unlinked.ToString();
  EXPECT_EQ(unlinked.message(),
            "node n1 is not connected: its agent has not answered the controller");
  Tick();
  EXPECT_EQ(daemon_->dispatcher().FetchArtifacts("n9", Key(), ignore).code(),
            StatusCode::kFailedPrecondition);
  const Status abandoned = daemon_->dispatcher().FetchArtifacts(
      "n1", Key(), [](const v1::ArtifactChunk&) { return false; });
  EXPECT_EQ(abandoned.code(), StatusCode::kCancelled) << abandoned.ToString();
  // An agent gone since its last health check: out of reach, which is the node's state too.
  StopAgent();
  const Status gone = daemon_->dispatcher().FetchArtifacts("n1", Key(), ignore);
  EXPECT_EQ(gone.code(), StatusCode::kFailedPrecondition) << gone.ToString();
  EXPECT_EQ(gone.message().find("node n1: "), 0u) << gone.message();
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
