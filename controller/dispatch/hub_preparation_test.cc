// Hub models: prepared once per node before the trial runs, retried after a backoff, failing their
// trial with the agent's message; IsPermanentPrepareFailure.
#include "controller/dispatch/hub_preparation.h"

#include <gtest/gtest.h>

#include "controller/blob_store.h"
#include "controller/change_notifier.h"
#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

using HubPreparationTest = DispatcherTest;

TEST_F(HubPreparationTest, AHubModelIsPreparedOnceOnTheNodeBeforeItsTrialRuns) {
  agent_state_.prepare_open = false;
  const int64_t experiment = SubmitOne("hf:TinyLlama/TinyLlama-1.1B@abc123");
  Tick();
  ASSERT_TRUE(Eventually([&] { return PrepareCalls() == 1; }));
  // The download goes on in the background: the round is over and the trial waits, queued.
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_NE(
      StatusOf(experiment)
          .trials(0)
          .notice()
          .find("placed, and waits: node n1 is downloading hf:TinyLlama/TinyLlama-1.1B@abc123 "
                "from the Hugging Face hub"),
      std::string::npos)
      << StatusOf(experiment).trials(0).notice();
  Tick();
  EXPECT_EQ(PrepareCalls(), 1u) << "one download per node and model";
  EXPECT_EQ(RunsStarted(), 0u);
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.prepared[0].repo(), "TinyLlama/TinyLlama-1.1B");
    EXPECT_EQ(agent_state_.prepared[0].revision(), "abc123");
    agent_state_.prepare_open = true;
  }
  agent_state_.changed.notify_all();
  // The finished download wakes the dispatcher; these rounds stand in for the woken thread.
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));

  // A second experiment with the same model finds it there.
  const int64_t again = SubmitOne("hf:TinyLlama/TinyLlama-1.1B@abc123");
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(again).state == store::TrialState::kOk; }));
  EXPECT_EQ(PrepareCalls(), 1u);
}

TEST_F(HubPreparationTest, AHubDownloadThatMayRecoverIsRetriedAfterTheBackoff) {
  agent_state_.prepare_results = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "hub 503"),
                                  grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow")};
  const int64_t experiment = SubmitOne("hf:org/tiny");
  Tick();
  ASSERT_TRUE(Eventually([&] { return PrepareCalls() == 1 && InFlightPrepares() == 0; }));
  Tick();  // within the backoff (1 s)
  EXPECT_EQ(InFlightPrepares(), 0);
  EXPECT_EQ(PrepareCalls(), 1u);
  clock_.Advance(seconds(1));
  Tick();
  ASSERT_TRUE(Eventually([&] { return PrepareCalls() == 2 && InFlightPrepares() == 0; }));
  clock_.Advance(seconds(1));
  Tick();  // the backoff doubled
  EXPECT_EQ(InFlightPrepares(), 0);
  EXPECT_EQ(PrepareCalls(), 2u);
  clock_.Advance(seconds(1));
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  EXPECT_EQ(PrepareCalls(), 3u);
  {
    std::lock_guard lock(agent_state_.mutex);
    EXPECT_EQ(agent_state_.prepared[2].revision(), "main");
  }
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
}

TEST_F(HubPreparationTest, AHubModelThatCannotBePreparedFailsItsTrialWithTheAgentsMessage) {
  agent_state_.prepare_results = {
      grpc::Status(grpc::StatusCode::NOT_FOUND, "hf:org/missing@main: the hub has no such repo")};
  const int64_t experiment = SubmitOne("hf:org/missing");
  Tick();
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return OnlyTrial(experiment).state == store::TrialState::kFailed;
  }));
  EXPECT_EQ(RunsStarted(), 0u);
  const v1::ExperimentStatus status = StatusOf(experiment);
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_NE(status.trials(0).error().find("preparing hf:org/missing@main on node n1"),
            std::string::npos)
      << status.trials(0).error();
  EXPECT_NE(status.trials(0).error().find("the hub has no such repo"), std::string::npos);
  EXPECT_EQ(PrepareCalls(), 1u);
}

// Each experiment may name another hub model: what is kept of a preparation goes once no launch
// has asked for it in 10 minutes, and once its node is forgotten.
TEST_F(HubPreparationTest, PreparationsAreForgottenOnceNoLongerAskedFor) {
  agent_state_.prepare_results = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "hub 503")};
  const int64_t cancelled = SubmitOne("hf:org/first");
  Tick();
  ASSERT_TRUE(Eventually([&] { return PrepareCalls() == 1 && InFlightPrepares() == 0; }));
  EXPECT_EQ(daemon_->dispatcher().HubPreparationsHeld(), 1) << "kept for its retry";
  // Its trial is cancelled before the retry: nothing asks for that preparation again.
  ASSERT_TRUE(daemon_->dispatcher().Cancel(cancelled, "").ok());
  clock_.Advance(std::chrono::minutes(10));

  const int64_t experiment = SubmitOne("hf:org/second");
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(PrepareCalls(), 2u);
  EXPECT_EQ(daemon_->dispatcher().HubPreparationsHeld(), 1) << "only the second, which is ready";

  // The node's credentials change: it is prepared afresh, and what was kept of it goes.
  daemon_->dispatcher().NodeCredentialsChanged("n1");
  const int64_t again = SubmitOne("hf:org/second");
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return OnlyTrial(again).state == store::TrialState::kOk;
  }));
  EXPECT_EQ(PrepareCalls(), 3u);
  EXPECT_EQ(daemon_->dispatcher().HubPreparationsHeld(), 1);
}

// The agent says it has no such model (launcher.cc, ForgetLostHubModel) while that model's
// preparation is under way: the download under way brings it back, so it is still followed and
// its result taken, and no second one starts beside it. Launches reach Forget only after Ensure
// found the model ready, so HubPreparations is driven here directly, with an agent of its own.
TEST_F(HubPreparationTest, ForgettingAPreparationUnderWayKeepsFollowingIt) {
  FakeAgentState state;
  state.prepare_open = false;
  FakeAgent service(state);
  const std::string address = "unix:" + root_ + "/direct-agent.sock";
  const std::unique_ptr<grpc::Server> agent = ServeAgentInsecurely(service, address);
  ASSERT_NE(agent, nullptr);
  auto blobs = BlobStore::Open(root_ + "/direct");
  ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
  ChangeNotifier changes;
  dispatch::DispatcherCore core(daemon_->store(), **blobs, clock_, changes, DispatcherOptions{});
  dispatch::HubPreparations preparations(core);
  struct StopAtEnd {  // cancels and joins the download however the test ends
    dispatch::HubPreparations& preparations;
    ~StopAtEnd() { preparations.Stop(); }
  } stop_at_end{preparations};
  dispatch::AgentLinks::Link link;
  link.name = "n1";
  link.stub = v1::Agent::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const std::string model = "hf:org/tiny@abc";
  const auto prepare_calls = [&] {
    std::lock_guard lock(state.mutex);
    return state.prepared.size();
  };

  auto ready = preparations.Ensure(link, model, 1, clock_.Monotonic());
  ASSERT_TRUE(ready.ok() && !*ready);
  ASSERT_TRUE(Eventually([&] { return prepare_calls() == 1; }));
  preparations.Forget(link.name, model);
  ASSERT_EQ(preparations.InFlight(), 1) << "the download under way is still followed";
  ready = preparations.Ensure(link, model, 1, clock_.Monotonic());
  ASSERT_TRUE(ready.ok() && !*ready);
  EXPECT_EQ(prepare_calls(), 1u) << "no second download beside the first";

  {
    std::lock_guard lock(state.mutex);
    state.prepare_open = true;
  }
  state.changed.notify_all();
  ASSERT_TRUE(Eventually([&] {
    ready = preparations.Ensure(link, model, 1, clock_.Monotonic());
    return ready.ok() && *ready;
  }));
  EXPECT_EQ(prepare_calls(), 1u);
}

TEST(IsPermanentPrepareFailureTest, OnlyCodesThatRetryingCannotCureArePermanent) {
  for (grpc::StatusCode code :
       {grpc::StatusCode::NOT_FOUND, grpc::StatusCode::PERMISSION_DENIED,
        grpc::StatusCode::UNAUTHENTICATED, grpc::StatusCode::FAILED_PRECONDITION,
        grpc::StatusCode::DATA_LOSS, grpc::StatusCode::INVALID_ARGUMENT}) {
    EXPECT_TRUE(dispatch::IsPermanentPrepareFailure(code)) << code;
  }
  for (grpc::StatusCode code : {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::DEADLINE_EXCEEDED,
                                grpc::StatusCode::CANCELLED, grpc::StatusCode::RESOURCE_EXHAUSTED,
                                grpc::StatusCode::INTERNAL, grpc::StatusCode::UNKNOWN}) {
    EXPECT_FALSE(dispatch::IsPermanentPrepareFailure(code)) << code;
  }
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
