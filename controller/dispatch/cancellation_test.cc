// Cancel and Resume: a running trial stopped on its agent, a cancel with a checkpoint then a resume
// on the same node, a resumed trial waiting for its node and failing when its checkpoint is gone.
#include "controller/dispatch/cancellation.h"

#include <gtest/gtest.h>

#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

class CancellationTest : public DispatcherTest {
 protected:
  // Submits one trial (its id in `experiment`) whose attempt 1 is declared lost while its run goes
  // on there, slow to stop: its agent answers health checks but refuses the attempt's stream for
  // requeue_after. The trial is queued again; the agent's CancelRuns wait (cancel_open unset).
  void LoseAttemptOneWhileItsRunGoesOn(int64_t& experiment) {
    agent_state_.stream_results.assign(
        100, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this agent is llmctl 0.3.9"));
    agent_state_.script_ends = false;  // attempt 1's worker goes on
    agent_state_.cancel_open = false;  // and is slow to stop
    experiment = SubmitOne();
    Tick();
    ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 0; }));
    ASSERT_NO_FATAL_FAILURE(TickWhileTheStreamIsRefusedForRequeueAfter());
    EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);  // lost after 60 s
  }
};

TEST_F(CancellationTest, CancelStopsARunningTrialOnItsAgent) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));

  v1::CancelResponse response;
  ASSERT_TRUE(CancelExperiment(experiment, &response).ok());
  EXPECT_EQ(response.cancelled_size(), 1);
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.cancelled,
            std::vector<std::string>{std::to_string(experiment) + "/one#1"});
  // A user's cancel asks for no checkpoint and keeps the agent's own grace.
  ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
  EXPECT_FALSE(agent_state_.cancel_requests[0].checkpoint());
  EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(), 0);
}

TEST_F(CancellationTest, ACancelWithACheckpointThenResumeRunsTheRestOnTheSameNode) {
  agent_state_.script = {StepLine(0), StepLine(1), StepLine(2)};
  agent_state_.script_ends = false;
  const std::string checkpoint = "/agent/runs/1/one/1/output/checkpoints/step-3";
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","train_seconds":1.5,"tokens_per_second":128.0,)"
      R"("peak_bytes":2000,"error":"cancelled at step 3","checkpoint":{"step":2,"path":")" +
      checkpoint + R"("}})"};
  const int64_t experiment = SubmitOne();
  const int64_t trial = OnlyTrial(experiment).id;
  Tick();
  ASSERT_TRUE(Eventually([&] { return StoredEvents(trial, 1) == 3; }));

  // Resuming a running trial says why not, and changes nothing.
  grpc::ClientContext early_context;
  v1::ResumeRequest resume_request;
  resume_request.set_experiment_id(experiment);
  resume_request.set_trial("one");
  v1::ResumeResponse resumed;
  const grpc::Status early = controller_->Resume(&early_context, resume_request, &resumed);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(early.error_message().find("is running"), std::string::npos) << early.error_message();

  grpc::ClientContext cancel_context;
  v1::CancelRequest cancel;
  cancel.set_experiment_id(experiment);
  cancel.set_trial("one");
  cancel.set_checkpoint(true);
  v1::CancelResponse cancelled;
  ASSERT_TRUE(controller_->Cancel(&cancel_context, cancel, &cancelled).ok());
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
  {
    std::lock_guard lock(agent_state_.mutex);
    ASSERT_EQ(agent_state_.cancel_requests.size(), 1u);
    EXPECT_TRUE(agent_state_.cancel_requests[0].checkpoint());
    EXPECT_EQ(agent_state_.cancel_requests[0].checkpoint_grace_ms(),
              std::chrono::duration_cast<milliseconds>(std::chrono::minutes(10)).count());
  }
  const std::string error = StatusOf(experiment).trials(0).error();
  EXPECT_NE(error.find("cancelled with a checkpoint (llmctl cancel --checkpoint); checkpoint "
                       "after step 3 in " +
                       checkpoint + " on the node (llmctl resume " + std::to_string(experiment) +
                       " 'one' continues from it there"),
            std::string::npos)
      << error;

  // The rest of the run: steps 3 and 4, from the checkpoint, on the node that has it.
  agent_state_.script = {StepLine(3), StepLine(4), kResultLine};
  agent_state_.script_ends = true;
  grpc::ClientContext resume_context;
  ASSERT_TRUE(controller_->Resume(&resume_context, resume_request, &resumed).ok());
  EXPECT_EQ(resumed.resumes_attempt(), 1);
  EXPECT_EQ(resumed.first_step(), 3);
  EXPECT_EQ(resumed.node(), "n1");
  EXPECT_EQ(resumed.checkpoint(), checkpoint);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  {
    std::lock_guard lock(agent_state_.mutex);
    const v1::RunTrialRequest& request =
        agent_state_.runs.at(std::to_string(experiment) + "/one#2").request;
    ASSERT_TRUE(request.has_resume_from());
    EXPECT_EQ(RunName(request.resume_from().run()), std::to_string(experiment) + "/one#1");
    EXPECT_EQ(request.resume_from().checkpoint(), checkpoint);
  }

  grpc::ClientContext report_context;
  v1::GetExperimentRequest report_request;
  report_request.set_experiment_id(experiment);
  v1::ReportResponse report;
  ASSERT_TRUE(controller_->Report(&report_context, report_request, &report).ok());
  const v1::TrialReport& row = report.trials(0);
  EXPECT_EQ(row.outcome(), "ok");
  EXPECT_EQ(row.attempt(), 2);
  EXPECT_EQ(std::vector<int32_t>(row.run_attempts().begin(), row.run_attempts().end()),
            (std::vector<int32_t>{1, 2}));
  std::vector<std::string> steps;
  for (const v1::TrialStep& step : row.steps()) {
    steps.push_back(std::to_string(step.attempt()) + ":" + std::to_string(step.step()));
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"1:0", "1:1", "1:2", "2:3", "2:4"}));
  EXPECT_EQ(row.train_seconds(), 3.0);  // both attempts' 1.5 s
  EXPECT_EQ(row.tokens_per_second(), 128.0);
}

TEST_F(CancellationTest, AResumedTrialWaitsForItsNodeAndFailsWhenItsCheckpointIsGone) {
  agent_state_.script = {StepLine(0)};
  agent_state_.script_ends = false;
  agent_state_.cancel_lines = {
      R"({"type":"result","outcome":"cancelled","checkpoint":{"step":0,"path":"/ckpt/step-1"}})"};
  const int64_t experiment = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 1; }));
  ASSERT_TRUE(daemon_->dispatcher().Cancel(experiment, "one", /*checkpoint=*/true).ok());
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));

  // The node is away: the trial waits for it, and says so; no other node may take it.
  StopAgent();
  clock_.Advance(seconds(6));
  Tick();
  ASSERT_TRUE(daemon_->dispatcher().Resume(experiment, "one").ok());
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_NE(StatusOf(experiment)
                .trials(0)
                .notice()
                .find("it resumes from a checkpoint on node n1, which is not connected"),
            std::string::npos)
      << StatusOf(experiment).trials(0).notice();

  // It comes back without that run (its disk was wiped): the trial fails saying so.
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.runs.clear();
  }
  StartAgent();
  clock_.Advance(seconds(6));
  Tick();
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kFailed; }));
  const std::string error = StatusOf(experiment).trials(0).error();
  EXPECT_NE(error.find("the agent refused it: this node has no such run"), std::string::npos)
      << error;
}

// A lost attempt's run slow to stop (the real agent answers CancelRun once the run has ended, up to
// its cancel_grace and 5 s) does not hold up the rounds: they go on, health checks included, while
// its CancelRun waits, which is not sent again meanwhile; once the agent confirms the run ended its
// device takes the next attempt. Before, each round made the CancelRun itself and waited for its
// answer (up to the call deadline, 10 s here), and sent it again at the next round.
TEST_F(CancellationTest, ALostAttemptsRunSlowToStopDoesNotHoldUpTheRounds) {
  int64_t experiment = 0;
  ASSERT_NO_FATAL_FAILURE(LoseAttemptOneWhileItsRunGoesOn(experiment));
  const std::string attempt1 = std::to_string(experiment) + "/one#1";
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.cancels_waiting == 1;
  }));
  int health_checks = 0;
  {
    std::lock_guard lock(agent_state_.mutex);
    health_checks = agent_state_.node_info_calls;
  }

  clock_.Advance(config_.health_interval);
  Tick();  // the node is checked while attempt 1's CancelRun still waits
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_GT(agent_state_.node_info_calls, health_checks);
    EXPECT_EQ(agent_state_.cancelled, std::vector<std::string>{attempt1});
    EXPECT_EQ(agent_state_.cancels_waiting, 1);
    EXPECT_EQ(agent_state_.runs.size(), 1u) << "attempt 2 waits for attempt 1's device";
    agent_state_.cancel_open = true;  // attempt 1's run ends
    agent_state_.stream_results.clear();
    agent_state_.script_ends = true;
  }
  agent_state_.changed.notify_all();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));
  Tick();  // attempt 2 takes the device
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
}

// A controller restarted (or killed -9) while a lost attempt's run is still stopping keeps that
// run's device from placement: the store holds the lost run, the new controller asks its agent
// again at its first round, and attempt 2 takes the device only once the agent confirms attempt 1's
// run ended; that confirmation is stored, so a controller restarted after it places at once.
// Before, the lost runs lived in memory only: the restarted controller placed attempt 2 at its
// first round on the device attempt 1 still held, two trainings on one device.
TEST_F(CancellationTest, ARestartedControllerKeepsALostAttemptsDeviceUntilItsRunHasStopped) {
  int64_t experiment = 0;
  ASSERT_NO_FATAL_FAILURE(LoseAttemptOneWhileItsRunGoesOn(experiment));
  const std::string attempt1 = std::to_string(experiment) + "/one#1";
  const auto cancels_waiting = [&](int waiting) {
    return Eventually([&] {
      std::lock_guard lock(agent_state_.mutex);
      return agent_state_.cancels_waiting == waiting;
    });
  };
  ASSERT_TRUE(cancels_waiting(1));

  daemon_.reset();  // its CancelRun is cancelled with it
  ASSERT_TRUE(cancels_waiting(0));
  StartController();  // a new store and dispatcher on the same database file
  Tick();
  EXPECT_EQ(RunsStarted(), 1u) << "attempt 2 waits for attempt 1's device";
  ASSERT_TRUE(cancels_waiting(1));
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.cancelled, (std::vector<std::string>{attempt1, attempt1}));
  }
  clock_.Advance(config_.health_interval);
  Tick();
  EXPECT_EQ(RunsStarted(), 1u) << "attempt 2 waits for attempt 1's device";
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.cancel_open = true;  // attempt 1's run ends
    agent_state_.stream_results.clear();
    agent_state_.script_ends = true;
  }
  agent_state_.changed.notify_all();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().LostRunCancelsInFlight() == 0; }));

  daemon_.reset();
  StartController();
  Tick();  // attempt 2 takes the device at once: attempt 1's run was confirmed stopped
  EXPECT_EQ(RunsStarted(), 2u);
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(experiment).current_attempt, 2);
}

// The lost runs a store hands back at a controller's first round (after an upgrade, migration 16
// keeps every unended run of the attempts lost before it) are asked kCancelsAtOnce at a time, each
// a thread and a call, and the rest as those end: before, each had its thread at once. Every run
// is released in the end, and none of their devices takes a trial before.
TEST_F(CancellationTest, TheLostRunsAStoreHandsBackAreAskedABoundedNumberAtATime) {
  agent_state_.cancel_open = false;  // every CancelRun waits
  using dispatch::kCancelsAtOnce;
  constexpr size_t kRuns = kCancelsAtOnce + 3;
  for (size_t i = 0; i < kRuns; ++i) {
    const int64_t trial = OnlyTrial(SubmitOne()).id;
    ASSERT_TRUE(daemon_->store().StartAttempt(trial, "n1", clock_.Now(), {0}).ok());
    ASSERT_TRUE(daemon_->store().MarkAttemptLost(trial, 1, clock_.Now()).ok());
  }
  Tick();  // the first round reads the lost runs back and asks their agent
  EXPECT_EQ(daemon_->dispatcher().LostRunCancelsInFlight(), static_cast<int>(kCancelsAtOnce));
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.cancels_waiting == static_cast<int>(kCancelsAtOnce);
  }));
  Tick();  // a round while every call is under way starts no more
  EXPECT_EQ(daemon_->dispatcher().LostRunCancelsInFlight(), static_cast<int>(kCancelsAtOnce));
  EXPECT_EQ(RunsStarted(), 0u);
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.cancel_open = true;  // the agent knows none of them: each is released
  }
  agent_state_.changed.notify_all();
  ASSERT_TRUE(Eventually([&] {
    Tick();
    const auto kept = daemon_->store().ListLostRuns();
    return kept.ok() && kept->empty();
  }));
  std::lock_guard lock(agent_state_.mutex);
  EXPECT_EQ(agent_state_.cancelled.size(), kRuns);
}

using TwoNodeCancellationTest = TwoNodeDispatcherTest;

// A cancel asks every node of a trial to stop side by side: each node's CancelRun here waits, until
// just before its call deadline, for the other node's to arrive. Asked one after the other, as
// before, n1's call waited out its deadline (10 s here; a silent node's 15 s by default) before n2
// was asked, and then n2's did too: a node slow to answer delayed every node after it.
TEST_F(TwoNodeCancellationTest, ACancelAsksEveryNodeOfATrialToStopSideBySide) {
  for (FakeAgentState* state : {&agent_state_, &second_state_}) state->script_ends = false;
  const int64_t experiment = SubmitTwoNodeTrial();
  Tick();
  ASSERT_TRUE(Eventually([&] { return daemon_->dispatcher().ActiveStreams() == 2; }));
  for (FakeAgentState* state : {&agent_state_, &second_state_}) state->cancel_gate = &gate_;

  v1::CancelResponse response;
  ASSERT_TRUE(CancelExperiment(experiment, &response).ok());
  EXPECT_EQ(response.cancelled_size(), 1);
  {
    std::lock_guard lock(gate_.mutex);
    EXPECT_EQ(gate_.most_in_flight, 2);
  }
  for (FakeAgentState* state : {&agent_state_, &second_state_}) {
    std::lock_guard lock(state->mutex);
    ASSERT_FALSE(state->cancelled.empty()) << state->node;
    EXPECT_EQ(state->cancelled.front(), std::to_string(experiment) + "/one#1") << state->node;
    EXPECT_TRUE(state->runs.begin()->second.ended) << state->node;
  }
  ASSERT_TRUE(
      Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kCancelled; }));
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
