// The dispatcher as coordinator: a removed node's trial is requeued at once and the node is no
// longer dialled.
#include "controller/dispatcher.h"

#include <gtest/gtest.h>

#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

using DispatcherNodeRemovalTest = DispatcherTest;

TEST_F(DispatcherNodeRemovalTest, ARemovedNodesTrialIsRequeuedAtOnceAndTheNodeIsNoLongerDialled) {
  const int64_t experiment = SubmitOneThatKeepsRunning();
  const store::TrialRecord trial = OnlyTrial(experiment);
  ASSERT_EQ(daemon_->dispatcher().ActiveStreams(), 1);

  // `llmctl node down n1`, the agent still up and the clock standing still.
  grpc::ClientContext context;
  v1::DeregisterNodeRequest request;
  request.set_name("n1");
  v1::DeregisterNodeResponse removed;
  ASSERT_TRUE(controller_->DeregisterNode(&context, request, &removed).ok());
  ASSERT_EQ(removed.requeued_size(), 1);
  // Requeued now, not requeue_after (60 s) later; its stream reader already gone.
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 1);
  EXPECT_EQ(daemon_->dispatcher().ActiveStreams(), 0);

  auto node_info_calls = [&] {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.node_info_calls;
  };
  const int calls = node_info_calls();
  for (int round = 0; round < 3; ++round) {
    clock_.Advance(config_.health_interval);
    Tick();
  }
  EXPECT_EQ(node_info_calls(), calls) << "a removed node is dialled no more";
  EXPECT_EQ(RunsStarted(), 1u) << "no trial goes to a removed node";
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);

  // `node up` again under the same name: fresh credentials, and the trial runs as attempt 2.
  StopAgent();
  const std::string old_token = credentials_.token();
  RegisterNode();
  ASSERT_NE(credentials_.token(), old_token);
  agent_state_.script = {StepLine(0), kResultLine};
  agent_state_.script_ends = true;
  StartAgent();
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
  EXPECT_EQ(StoredEvents(trial.id, 2), 2);
  EXPECT_EQ(StoredEvents(trial.id, 1), 1);
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
