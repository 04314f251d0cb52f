// Input blobs a node lacks: a few sent during the round (launcher_test.cc), more on a thread of
// their own while the trial waits queued and the round goes on, retried after a backoff (on the
// monotonic clock), and cancelled when the controller stops.
#include "controller/dispatch/blob_delivery.h"

#include <gtest/gtest.h>

#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

class BlobDeliveryTest : public DispatcherTest {
 protected:
  // Every input is "large": none is sent during the round.
  void SetUp() override {
    DispatcherTest::SetUp();
    daemon_.reset();
    inline_upload_bytes_ = 0;
    StartController();
  }

  int64_t SubmitWithData() {
    const auto [experiment, tree] = SubmitWithDataFile(*controller_, "{\"text\": \"hello\"}\n");
    EXPECT_NE(experiment, 0);
    return experiment;
  }
};

TEST_F(BlobDeliveryTest, LargeInputsAreSentInTheBackgroundWhileTheTrialWaitsQueued) {
  agent_state_.upload_open = false;  // the upload takes as long as the test says
  const int64_t experiment = SubmitWithData();
  Tick();  // returns with the upload under way: the round does not wait for it
  ASSERT_TRUE(Eventually([&] { return UploadsStarted() == 1; }));
  EXPECT_EQ(InFlightDeliveries(), 1);
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(RunsStarted(), 0u);
  const v1::ExperimentStatus status = StatusOf(experiment);
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_NE(status.trials(0).notice().find("placed, and waits: sending 18 B of inputs to node n1"),
            std::string::npos)
      << status.trials(0).notice();
  Tick();
  EXPECT_EQ(UploadsStarted(), 1) << "one delivery per node and tree";

  OpenUploads();
  // The finished delivery wakes the dispatcher; these rounds stand in for the woken thread.
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(UploadsStarted(), 1);
  EXPECT_EQ(InFlightDeliveries(), 0);
}

TEST_F(BlobDeliveryTest, AFailedDeliveryIsTriedAgainAfterTheBackoff) {
  agent_state_.upload_results = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "disk busy")};
  const int64_t experiment = SubmitWithData();
  Tick();
  ASSERT_TRUE(Eventually([&] { return UploadsStarted() == 1 && InFlightDeliveries() == 0; }));
  Tick();  // within the backoff (1 s)
  EXPECT_EQ(UploadsStarted(), 1);
  EXPECT_EQ(RunsStarted(), 0u);
  const v1::ExperimentStatus status = StatusOf(experiment);
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_NE(status.trials(0).notice().find("sending inputs to node n1 failed, trying again"),
            std::string::npos)
      << status.trials(0).notice();
  EXPECT_NE(status.trials(0).notice().find("disk busy"), std::string::npos);
  clock_.Advance(seconds(1));
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  EXPECT_EQ(UploadsStarted(), 2);
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
}

// The backoff runs on the monotonic clock: the wall clock stepped an hour back does not hold the
// retry up for the hour.
TEST_F(BlobDeliveryTest, AFailedDeliveryIsTriedAgainAfterTheBackoffThoughTheWallClockSteppedBack) {
  agent_state_.upload_results = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "disk busy")};
  const int64_t experiment = SubmitWithData();
  Tick();
  ASSERT_TRUE(Eventually([&] { return UploadsStarted() == 1 && InFlightDeliveries() == 0; }));
  clock_.StepWallClock(-std::chrono::hours(1));
  clock_.Advance(seconds(1));
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  EXPECT_EQ(UploadsStarted(), 2);
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
}

// Each trial with other inputs asks for another (node, tree): what is kept of a delivery goes once
// its launch has taken it, or once no launch has asked for it in 10 minutes.
TEST_F(BlobDeliveryTest, DeliveriesAreForgottenOnceTakenOrNoLongerAskedFor) {
  agent_state_.upload_results = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "disk busy")};
  const auto [cancelled, first_tree] = SubmitWithDataFile(*controller_, "{\"text\": \"one\"}\n");
  ASSERT_NE(cancelled, 0);
  Tick();
  ASSERT_TRUE(Eventually([&] { return UploadsStarted() == 1 && InFlightDeliveries() == 0; }));
  EXPECT_EQ(daemon_->dispatcher().BlobDeliveriesHeld(), 1) << "kept for its retry";
  // Its trial is cancelled before the retry: nothing asks for that delivery again.
  ASSERT_TRUE(daemon_->dispatcher().Cancel(cancelled, "").ok());
  clock_.Advance(std::chrono::minutes(10));

  const auto [experiment, tree] = SubmitWithDataFile(*controller_, "{\"text\": \"two\"}\n");
  ASSERT_NE(experiment, 0);
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return RunsStarted() == 1;
  }));
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));
  EXPECT_EQ(UploadsStarted(), 2);
  EXPECT_EQ(daemon_->dispatcher().BlobDeliveriesHeld(), 0);

  // The same inputs again, which the node has: sent during the round, nothing kept.
  const auto [again, same_tree] = SubmitWithDataFile(*controller_, "{\"text\": \"two\"}\n");
  ASSERT_NE(again, 0);
  Tick();
  EXPECT_EQ(RunsStarted(), 2u);
  EXPECT_EQ(daemon_->dispatcher().BlobDeliveriesHeld(), 0);
}

// A delivery no longer asked for is erased by the Ensure of another, which may return while that
// other runs: the erased delivery's finished thread is joined on that return too.
TEST_F(BlobDeliveryTest, ADeliveryNoLongerAskedForGoesWhileAnotherIsUnderWay) {
  agent_state_.upload_results = {grpc::Status(grpc::StatusCode::UNAVAILABLE, "disk busy")};
  const auto [cancelled, first_tree] = SubmitWithDataFile(*controller_, "{\"text\": \"one\"}\n");
  ASSERT_NE(cancelled, 0);
  Tick();
  ASSERT_TRUE(Eventually([&] { return UploadsStarted() == 1 && InFlightDeliveries() == 0; }));
  ASSERT_TRUE(daemon_->dispatcher().Cancel(cancelled, "").ok());

  agent_state_.upload_open = false;
  const auto [experiment, tree] = SubmitWithDataFile(*controller_, "{\"text\": \"two\"}\n");
  ASSERT_NE(experiment, 0);
  Tick();
  ASSERT_TRUE(Eventually([&] { return InFlightDeliveries() == 1; }));
  clock_.Advance(std::chrono::minutes(10));
  Tick();  // the cancelled trial's delivery goes; the other is still under way
  EXPECT_EQ(daemon_->dispatcher().BlobDeliveriesHeld(), 1);
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.upload_open = true;
  }
  agent_state_.changed.notify_all();
  ASSERT_TRUE(Eventually([&] {
    Tick();
    return OnlyTrial(experiment).state == store::TrialState::kOk;
  }));
}

TEST_F(BlobDeliveryTest, StoppingTheControllerCancelsADeliveryUnderWay) {
  agent_state_.upload_open = false;
  SubmitWithData();
  Tick();
  ASSERT_TRUE(Eventually([&] { return UploadsStarted() == 1; }));
  daemon_.reset();  // would wait out the upload's deadline (10 s and more) if not
  EXPECT_TRUE(Eventually([&] {
    std::lock_guard lock(agent_state_.mutex);
    return agent_state_.uploads_cancelled == 1;
  }));
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
