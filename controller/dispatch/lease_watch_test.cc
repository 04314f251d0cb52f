// Lease ends: a warning, then the node's trials stopped with a checkpoint and no new ones; a stop
// whose checkpoint did not fit says why.
#include "controller/dispatch/lease_watch.h"

#include <gtest/gtest.h>

#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

using LeaseWatchTest = DispatcherTest;

TEST_F(LeaseWatchTest, BeforeItsLeaseEndsANodeWarnsThenStopsItsTrialsAndTakesNoNewOnes) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  const std::string checkpoint = "/agent/runs/1/one/1/output/checkpoints/step-3";
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","steps":3,"error":"cancelled at step 3",)"
      R"("checkpoint":{"step":2,"path":")" +
      checkpoint + R"("}})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  const store::Time ends = clock_.Now() + std::chrono::minutes(45);
  ASSERT_TRUE(SetLease("n1", ends).ok());
  EXPECT_EQ(SetLease("nobody", ends).error_code(), grpc::StatusCode::NOT_FOUND);

  Tick();  // 45 min left: nothing to say yet
  EXPECT_EQ(StatusOf(experiment).trials(0).notice(), "");

  clock_.Advance(std::chrono::minutes(20));  // 25 min left: the warning
  Tick();
  const std::string notice = StatusOf(experiment).trials(0).notice();
  // In UTC to the minute: the test's clock starts at 2023-11-14 22:13:20 UTC.
  EXPECT_NE(notice.find("node n1's lease lab-lease ends at 2023-11-14 22:58 UTC; its trials are "
                        "stopped at 2023-11-14 22:"),
            std::string::npos)
      << notice;
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kRunning);
  const int64_t later = SubmitOne();
  Tick();
  EXPECT_EQ(OnlyTrial(later).state, store::TrialState::kQueued) << "no new trial on that node";

  clock_.Advance(std::chrono::minutes(16));  // 9 min left: checkpointed and stopped
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  const v1::ExperimentStatus status = StatusOf(experiment);
  const std::string error = status.trials(0).error();
  EXPECT_NE(error.find("lease lab-lease ends at"), std::string::npos) << error;
  EXPECT_NE(error.find("stopped before it does; checkpoint after step 3 in " + checkpoint +
                       " on the node (llmctl resume " + std::to_string(experiment) + " 'one'"),
            std::string::npos)
      << error;
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.cancelled,
              std::vector<std::string>{std::to_string(experiment) + "/one#1"});
    // The worker gets what is left of the lease (9 min) less the 2 min reserve to write it.
    ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
    EXPECT_TRUE(agent_state_.cancel_requests[0].checkpoint());
    EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(),
              std::chrono::duration_cast<milliseconds>(std::chrono::minutes(7)).count());
    agent_state_.cancel_lines.clear();
  }
  EXPECT_EQ(OnlyTrial(later).state, store::TrialState::kQueued);

  // The lease was extended: the node takes trials again.
  ASSERT_TRUE(SetLease("n1", clock_.Now() + std::chrono::hours(3)).ok());
  agent_state_.script = {StepLine(0), kResultLine};
  agent_state_.script_ends = true;
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(later).state == store::TrialState::kOk; }));
}

TEST_F(LeaseWatchTest, ALeaseStopWhoseCheckpointDidNotFitSaysWhy) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","steps":1,"error":"cancelled at step 1; )"
      R"(checkpoint skipped: needs 12.00 GiB, 3.50 GiB free in /agent/out"})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  ASSERT_TRUE(SetLease("n1", clock_.Now() + std::chrono::minutes(5)).ok());
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  const std::string error = StatusOf(experiment).trials(0).error();
  EXPECT_NE(error.find("stopped before it does; no checkpoint (cancelled at step 1; checkpoint "
                       "skipped: needs 12.00 GiB, 3.50 GiB free in /agent/out)"),
            std::string::npos)
      << error;
  std::lock_guard lock(agent_state_.mutex);
  ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
  EXPECT_TRUE(agent_state_.cancel_requests[0].checkpoint());
  EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(),
            std::chrono::duration_cast<milliseconds>(std::chrono::minutes(3)).count());
}

using TwoNodeLeaseWatchTest = TwoNodeDispatcherTest;

// Two nodes whose leases end together: their trials are stopped side by side, each CancelRun here
// waiting, until just before its call deadline, for the other's to arrive. One after the other, as
// before, on the round's thread, the first waited out its deadline (10 s here; a checkpoint being
// written or a silent agent, the call deadline) before the second was asked.
TEST_F(TwoNodeLeaseWatchTest, TheTrialsOfNodesWhoseLeasesEndTogetherAreStoppedSideBySide) {
  for (FakeAgentState* state : {&agent_state_, &second_state_}) state->script_ends = false;
  const int64_t first = SubmitOne();
  const int64_t second = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 2; }));
  for (FakeAgentState* state : {&agent_state_, &second_state_}) state->cancel_gate = &gate_;
  const store::Time ends = clock_.Now() + std::chrono::minutes(5);
  ASSERT_TRUE(SetLease("n1", ends).ok());
  ASSERT_TRUE(SetLease("n2", ends).ok());
  Tick();
  {
    std::lock_guard lock(gate_.mutex);
    EXPECT_EQ(gate_.most_in_flight, 2);
  }
  for (const int64_t experiment : {first, second}) {
    ASSERT_TRUE(
        Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  }
  for (FakeAgentState* state : {&agent_state_, &second_state_}) {
    std::lock_guard lock(state->mutex);
    ASSERT_EQ(state->cancel_requests.size(), 1u) << state->node;
    EXPECT_TRUE(state->cancel_requests[0].checkpoint()) << state->node;
    EXPECT_EQ(state->cancel_requests[0].checkpoint_grace_ms(),
              std::chrono::duration_cast<milliseconds>(std::chrono::minutes(3)).count());
  }
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
