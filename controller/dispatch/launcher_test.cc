// Launching a placed trial: its inputs' missing blobs sent (with time for their size), RunTrial,
// then every event stored; a multi-node attempt withdrawn when node rank 0 starts nothing, lost
// once it has; ToProto.
#include "controller/dispatch/launcher.h"

#include <gtest/gtest.h>

#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

using LauncherTest = DispatcherTest;

TEST_F(LauncherTest, RunsATrialWithItsInputsAndStoresEveryEvent) {
  // The data file goes to the controller first, then to the agent with the trial.
  const std::string content = "{\"text\": \"hello\"}\n";
  const std::string sha = digest::Sha256Hex(content);
  const auto [experiment_id, tree] = SubmitWithDataFile(*controller_, content);
  ASSERT_NE(experiment_id, 0);
  v1::SubmitResponse submitted;
  submitted.set_experiment_id(experiment_id);

  Tick();
  const store::TrialRecord trial = OnlyTrial(submitted.experiment_id());
  {
    std::lock_guard lock(agent_state_.mutex);
    ASSERT_EQ(agent_state_.runs.size(), 1u);
    const v1::RunTrialRequest& run = agent_state_.runs.begin()->second.request;
    EXPECT_EQ(run.key().attempt(), 1);
    EXPECT_EQ(run.key().trial(), "one");
    ASSERT_TRUE(run.inputs().contains("data.path"));
    EXPECT_EQ(run.inputs().at("data.path").digest(), tree.digest());
    EXPECT_TRUE(run.inputs().at("data.path").is_file());
    EXPECT_EQ(std::vector<int32_t>(run.device_indices().begin(), run.device_indices().end()),
              std::vector<int32_t>{0});
    EXPECT_TRUE(agent_state_.blobs.contains(sha));
  }
  ASSERT_TRUE(Eventually(
      [&] { return OnlyTrial(submitted.experiment_id()).state == store::TrialState::kOk; }));
  EXPECT_EQ(StoredEvents(trial.id, 1), 3);

  grpc::ClientContext report_context;
  v1::GetExperimentRequest which;
  which.set_experiment_id(submitted.experiment_id());
  v1::ReportResponse report;
  ASSERT_TRUE(controller_->Report(&report_context, which, &report).ok());
  ASSERT_EQ(report.trials_size(), 1);
  EXPECT_EQ(report.trials(0).outcome(), "ok");
  EXPECT_EQ(report.trials(0).node(), "n1");
  EXPECT_DOUBLE_EQ(report.trials(0).final_loss(), 2.25);
  EXPECT_DOUBLE_EQ(report.trials(0).tokens_per_second(), 128.0);

  grpc::ClientContext nodes_context;
  v1::ListNodesResponse nodes;
  ASSERT_TRUE(controller_->ListNodes(&nodes_context, {}, &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_EQ(nodes.nodes(0).state(), "connected");
  ASSERT_EQ(nodes.nodes(0).devices_size(), 1);
  EXPECT_EQ(nodes.nodes(0).devices(0).type(), "cpu");

  grpc::ClientContext fetch_context;
  v1::FetchTrialArtifactsRequest fetch;
  fetch.set_experiment_id(submitted.experiment_id());
  fetch.set_trial("one");
  auto reader = controller_->FetchArtifacts(&fetch_context, fetch);
  v1::ArtifactChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  EXPECT_EQ(chunk.path(), "output/adapter/" + std::to_string(submitted.experiment_id()) + "/one#1");
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(LauncherTest, AnUploadToTheAgentGetsTimeForItsSizeAtTheMinimumRate) {
  // At 1 byte/s a 593-byte blob may take almost 10 minutes on top of the 10 s call deadline: far
  // beyond the fixed deadline that made large model directories impossible to upload.
  daemon_.reset();
  config_.min_transfer_bytes_per_second = 1;
  StartController();
  const std::string content = "{\"text\": \"" + std::string(580, 'x') + "\"}\n";
  ASSERT_EQ(content.size(), 593u);
  ASSERT_NE(SubmitWithDataFile(*controller_, content).first, 0);
  Tick();
  std::lock_guard lock(agent_state_.mutex);
  ASSERT_TRUE(agent_state_.upload_time_left.contains(digest::Sha256Hex(content)));
  // 10 s + 593 s; the margin only absorbs the time between the call's start and its arrival.
  EXPECT_GT(agent_state_.upload_time_left.at(digest::Sha256Hex(content)), seconds(500));
}

TEST_F(LauncherTest, ARunTrialAnsweredPastItsDeadlineIsTakenAsStartedThere) {
  // The agent starts the run but answers after the controller stopped waiting: the attempt is
  // recorded on that node and followed, not placed again elsewhere while it runs here unknown.
  daemon_.reset();
  config_.agent_call_deadline = milliseconds(300);
  StartController();
  agent_state_.run_trial_delay = milliseconds(1500);
  const int64_t experiment = SubmitOne();
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.runs.size(), 1u);
  EXPECT_TRUE(agent_state_.cancelled.empty());
}

class MultiNodeLauncherTest : public TwoNodeDispatcherTest {
 protected:
  static std::vector<int> NodeRanksRun(FakeAgentState& state) {
    std::lock_guard lock(state.mutex);
    std::vector<int> ranks;
    for (const auto& [name, run] : state.runs) {
      ranks.push_back(run.request.node_group().node_rank());
    }
    return ranks;
  }
};

// A trial whose hub model one node has goes there rather than to a node first by name, which
// would download the model again.
TEST_F(MultiNodeLauncherTest, AHubModelTrialGoesToTheNodeThatHasTheModel) {
  const auto runs_on = [](FakeAgentState& state) {
    std::lock_guard lock(state.mutex);
    return state.runs.size();
  };
  const auto prepared_on = [](FakeAgentState& state) {
    std::lock_guard lock(state.mutex);
    return state.prepared.size();
  };
  // n1 is busy, so the first experiment's model goes to n2.
  const int64_t busy = SubmitOneThatKeepsRunning();
  ASSERT_EQ(runs_on(agent_state_), 1u);
  const int64_t first = SubmitOne("hf:org/tiny");
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return OnlyTrial(first).state == store::TrialState::kOk;
  }));
  ASSERT_EQ(prepared_on(second_state_), 1u);
  ASSERT_EQ(runs_on(second_state_), 1u);
  agent_state_.AddLinesAndEnd(std::to_string(busy) + "/" + OnlyTrial(busy).name + "#1",
                              {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(busy).state == store::TrialState::kOk; }));

  // Both nodes are free: n2 has the model.
  const int64_t second = SubmitOne("hf:org/tiny@main");
  EXPECT_TRUE(Eventually([&] {
    Tick();
    return OnlyTrial(second).state == store::TrialState::kOk;
  }));
  EXPECT_EQ(runs_on(second_state_), 2u);
  EXPECT_EQ(runs_on(agent_state_), 1u);
  EXPECT_EQ(prepared_on(agent_state_), 0u) << "downloaded again on n1";
  EXPECT_EQ(prepared_on(second_state_), 1u);
}

TEST_F(MultiNodeLauncherTest, AnAttemptNodeRankZeroTurnsAwayIsWithdrawnNotLost) {
  // n1, node rank 0, is measuring its rates when the trial comes: it starts nothing, n2 is never
  // asked, and the trial waits for its first attempt, which then runs on both.
  agent_state_.run_trial_results = {
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "RunTrial: the node is measuring its rates")};
  const int64_t experiment = SubmitTwoNodeTrial();
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 0);
  EXPECT_TRUE(NodeRanksRun(agent_state_).empty());
  EXPECT_TRUE(NodeRanksRun(second_state_).empty());
  auto running = daemon_->store().ListRunningAttempts();
  ASSERT_TRUE(running.ok());
  EXPECT_TRUE(running->empty());

  Tick();
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);
  EXPECT_EQ(NodeRanksRun(agent_state_), std::vector<int>{0});
  EXPECT_EQ(NodeRanksRun(second_state_), std::vector<int>{1});
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);
}

TEST_F(MultiNodeLauncherTest, AnAttemptTurnedAwayAfterNodeRankZeroStartedIsLostAndItsRunStopped) {
  // Node rank 0 runs by then: the attempt happened, so it is lost and the next one is attempt 2.
  second_state_.run_trial_results = {
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "RunTrial: the node is measuring its rates")};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitTwoNodeTrial();
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);
  {
    std::lock_guard lock(agent_state_.mutex);
    ASSERT_EQ(agent_state_.cancelled.size(), 1u);
  }
  EXPECT_TRUE(NodeRanksRun(second_state_).empty());
}

// A multi-node trial is shown on all its nodes ("n1+n2"), and its artifacts are fetched from node
// rank 0's, which writes them; the joined names were taken for one node's and never connected.
TEST_F(MultiNodeLauncherTest, AMultiNodeTrialIsShownOnItsNodesAndFetchedFromNodeRankZero) {
  const int64_t experiment = SubmitTwoNodeTrial();
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(StatusOf(experiment).trials(0).node(), "n1+n2");

  grpc::ClientContext context;
  v1::FetchTrialArtifactsRequest request;
  request.set_experiment_id(experiment);
  request.set_trial(OnlyTrial(experiment).name);
  auto reader = controller_->FetchArtifacts(&context, request);
  std::vector<std::string> paths;
  v1::ArtifactChunk chunk;
  while (reader->Read(&chunk)) paths.push_back(chunk.path());
  const grpc::Status fetched = reader->Finish();
  ASSERT_TRUE(fetched.ok()) << fetched.error_message();
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0].rfind("output/adapter/", 0), 0u) << paths[0];
}

// Two agents that take their time to answer are checked side by side: the round waits for the
// slower, not for their sum (which, for an agent that never answers, is one call deadline each).
TEST_F(MultiNodeLauncherTest, NodesAreHealthCheckedSideBySide) {
  agent_state_.node_info_gate = &gate_;
  second_state_.node_info_gate = &gate_;
  Tick();
  EXPECT_EQ(gate_.most_in_flight, 2);
  auto nodes = daemon_->store().ListNodes();
  ASSERT_TRUE(nodes.ok());
  for (const store::NodeRecord& node : *nodes) EXPECT_EQ(node.state, "connected") << node.name;
}

// n2 went down (its check failed) and is back with an agent that never answers: the round waits
// failing_check_wait for it, not its call deadline, and places the trial on n1 while n2's check
// is still under way; n2's answer, when it comes, is recorded by the check's own thread.
TEST_F(MultiNodeLauncherTest, ANodeThatNeverAnswersDoesNotHoldTheRoundForTheLiveNodes) {
  second_->Shutdown(std::chrono::system_clock::now());
  second_->Wait();
  Tick();  // n1 connected, n2 refuses the connection
  // n2's GetNodeInfo waits for a second call that never comes.
  second_state_.node_info_gate = &gate_;
  second_ = ServeAgent(*second_service_, second_address_, second_credentials_);
  ASSERT_NE(second_, nullptr);
  clock_.Advance(seconds(1));  // n2's backoff; n1 is not due
  const int64_t experiment = SubmitOne();
  std::thread round([&] { Tick(); });
  EXPECT_TRUE(Eventually([&] { return RunsStarted() == 1; }));
  {
    std::lock_guard lock(gate_.mutex);
    EXPECT_EQ(gate_.in_flight, 1) << "n2's check was still under way when the trial was placed";
    gate_.together = 1;
  }
  gate_.arrived.notify_all();
  round.join();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_TRUE(Eventually([&] {
    auto nodes = daemon_->store().ListNodes();
    return nodes.ok() && std::all_of(nodes->begin(), nodes->end(),
                                     [](const auto& node) { return node.state == "connected"; });
  }));
}

TEST(LauncherToProtoTest, CarriesTheTreesDigestKindAndFiles) {
  const digest::InputTree tree{
      .digest = "d1", .files = {{"a.txt", "s1", 3}, {"b/c.bin", "s2", 0}}, .is_file = false};
  const v1::InputTree proto = dispatch::ToProto(tree);
  EXPECT_EQ(proto.digest(), "d1");
  EXPECT_FALSE(proto.is_file());
  ASSERT_EQ(proto.files_size(), 2);
  EXPECT_EQ(proto.files(0).path(), "a.txt");
  EXPECT_EQ(proto.files(0).sha256(), "s1");
  EXPECT_EQ(proto.files(0).size(), 3);
  EXPECT_EQ(proto.files(1).path(), "b/c.bin");
  EXPECT_EQ(proto.files(1).size(), 0);
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
