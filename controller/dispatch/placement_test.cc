// Placement: a restarted controller places around the devices running attempts hold, and a trial
// that waits has a notice saying why (the scheduler's reason, or WaitingNotice when no connected
// node can run it).
#include "controller/dispatch/placement.h"

#include <gtest/gtest.h>

#include "controller/dispatch/dispatch_test_support.h"

namespace llmctl::controller::dispatch_test {
namespace {

using PlacementTest = DispatcherTest;

TEST_F(PlacementTest, ARestartedControllerKnowsWhichDevicesTheRunningAttemptsHold) {
  {
    std::lock_guard lock(agent_state_.mutex);
    agent_state_.cuda_devices = 4;
    agent_state_.script_ends = false;
  }
  auto submit = [&](const std::string& name, const std::string& trials) {
    v1::SubmitRequest request;
    request.set_filename(name + ".yaml");
    request.set_yaml_text(std::string(kExperiment) + "device: cuda\ntrials:\n" + trials);
    v1::SubmitResponse submitted;
    grpc::ClientContext context;
    const grpc::Status accepted = controller_->Submit(&context, request, &submitted);
    EXPECT_TRUE(accepted.ok()) << accepted.error_message();
    return submitted.experiment_id();
  };
  auto devices_of = [&](const std::string& run) {
    std::lock_guard lock(agent_state_.mutex);
    const auto& indices = agent_state_.runs.at(run).request.device_indices();
    return std::vector<int32_t>(indices.begin(), indices.end());
  };
  // a → {0}, b → {1}, c → {2, 3}; then b ends: {2, 3} and {0} stay busy.
  const int64_t first = submit("first",
                               "  - {name: a}\n  - {name: b}\n"
                               "  - {name: c, set: {devices: 2, train.global_batch_size: 4}}\n");
  Tick();
  const std::string prefix = std::to_string(first) + "/";
  ASSERT_EQ(RunsStarted(), 3u);
  ASSERT_EQ(devices_of(prefix + "c#1"), (std::vector<int32_t>{2, 3}));
  ASSERT_EQ(devices_of(prefix + "a#1"), (std::vector<int32_t>{0}));
  agent_state_.AddLinesAndEnd(prefix + "b#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] {
    auto trials = daemon_->store().ListTrials(first);
    return trials.ok() && (*trials)[1].state == store::TrialState::kOk;
  }));

  daemon_.reset();  // a new store and dispatcher on the same database file
  StartController();
  const int64_t second = submit("second", "  - {name: d}\n");
  Tick();
  ASSERT_EQ(RunsStarted(), 4u);
  EXPECT_EQ(devices_of(std::to_string(second) + "/d#1"), (std::vector<int32_t>{1}));
}

TEST_F(PlacementTest, ATrialNoConnectedNodeCanRunWaitsWithANoticeSayingWhy) {
  v1::SubmitRequest request;
  request.set_filename("gpu.yaml");
  request.set_yaml_text(std::string(kExperiment) + "device: cuda\n");
  v1::SubmitResponse submitted;
  grpc::ClientContext submit_context;
  const grpc::Status accepted = controller_->Submit(&submit_context, request, &submitted);
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  Tick();
  EXPECT_EQ(OnlyTrial(submitted.experiment_id()).state, store::TrialState::kQueued);
  EXPECT_EQ(RunsStarted(), 0u);

  grpc::ClientContext context;
  v1::GetExperimentRequest get;
  get.set_experiment_id(submitted.experiment_id());
  v1::ExperimentStatus status;
  ASSERT_TRUE(controller_->GetExperiment(&context, get, &status).ok());
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_NE(status.trials(0).notice().find("no connected node has 1 cuda device"),
            std::string::npos)
      << status.trials(0).notice();

  // A CPU trial is placed as usual and carries no notice.
  const int64_t cpu = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(cpu).state == store::TrialState::kOk; }));
  EXPECT_EQ(daemon_->dispatcher().QueuedNotice(OnlyTrial(cpu).id), "");

  // An experiment for one flavor runs only on a node whose lease is of that flavor.
  request.set_filename("targeted.yaml");
  request.set_yaml_text(std::string(kExperiment) +
                        "target: {site: KVM@TACC, flavor: g1.h100.pci.1}\n");
  grpc::ClientContext targeted_context;
  ASSERT_TRUE(controller_->Submit(&targeted_context, request, &submitted).ok());
  const int64_t targeted = submitted.experiment_id();
  Tick();
  EXPECT_EQ(OnlyTrial(targeted).state, store::TrialState::kQueued);
  EXPECT_NE(daemon_->dispatcher()
                .QueuedNotice(OnlyTrial(targeted).id)
                .find("no connected node with flavor g1.h100.pci.1, site KVM@TACC has 1 cpu"),
            std::string::npos)
      << daemon_->dispatcher().QueuedNotice(OnlyTrial(targeted).id);
  ASSERT_TRUE(daemon_->store()
                  .SetNodeLease("n1", {.name = "lab",
                                       .site = "KVM@TACC",
                                       .flavor = "g1.h100.pci.1",
                                       .ends = clock_.Now() + std::chrono::hours(10)})
                  .ok());
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(targeted).state == store::TrialState::kOk; }));
}

// The embedded agent is still starting when the first trial comes: the notice says the node has
// not connected yet rather than that no node has the devices (llmctl node up).
TEST_F(PlacementTest, ATrialWaitingForANodeNotYetConnectedSaysSo) {
  StopAgent();
  daemon_.reset();  // a controller whose link to n1 has never connected
  StartController();
  const int64_t experiment = SubmitOne();
  Tick();
  EXPECT_EQ(OnlyTrial(experiment).state, store::TrialState::kQueued);
  EXPECT_EQ(daemon_->dispatcher().QueuedNotice(OnlyTrial(experiment).id),
            "no connected node has 1 cpu device yet: node n1 has not connected since the "
            "controller started; the trial waits (llmctl nodes)");

  StartAgent();
  clock_.Advance(seconds(5));
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(experiment).state == store::TrialState::kOk; }));

  // Once it has connected, a node that goes away is one to bring back.
  StopAgent();
  clock_.Advance(seconds(5));
  const int64_t second = SubmitOne();
  Tick();
  EXPECT_EQ(daemon_->dispatcher().QueuedNotice(OnlyTrial(second).id),
            "no connected node has 1 cpu device; the trial waits until one does (llmctl "
            "nodes, llmctl node up)");
}

// A trial that a connected node could run, but not now, says so with the scheduler's reason
// (scheduler::Placement::waiting_reasons), in the trial's notice (llmctl status, watch).
TEST_F(PlacementTest, ATrialWaitingForBusyDevicesShowsTheSchedulersReason) {
  const int64_t first = SubmitOneThatKeepsRunning();  // the node's one CPU
  const int64_t second = SubmitOne();
  Tick();
  EXPECT_EQ(OnlyTrial(second).state, store::TrialState::kQueued);
  EXPECT_EQ(RunsStarted(), 1u);
  const std::string reason = "needs a node with 1 free cpu device; none has them now";
  EXPECT_EQ(daemon_->dispatcher().QueuedNotice(OnlyTrial(second).id), reason);
  grpc::ClientContext context;
  v1::GetExperimentRequest get;
  get.set_experiment_id(second);
  v1::ExperimentStatus status;
  ASSERT_TRUE(controller_->GetExperiment(&context, get, &status).ok());
  ASSERT_EQ(status.trials_size(), 1);
  EXPECT_EQ(status.trials(0).notice(), reason);
  EXPECT_EQ(daemon_->dispatcher().QueuedNotice(OnlyTrial(first).id), "");  // running

  agent_state_.AddLinesAndEnd(std::to_string(first) + "/one#1", {kResultLine}, "ok");
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(first).state == store::TrialState::kOk; }));
  Tick();
  ASSERT_TRUE(Eventually([&] { return RunsStarted() == 2u; }));
  EXPECT_EQ(daemon_->dispatcher().QueuedNotice(OnlyTrial(second).id), "");
}

// A trial with nodes: 2 and one connected node can never run now: it waits with a notice saying
// it spans 2 nodes, and holds nothing back from a later single-node trial.
TEST_F(PlacementTest, AMultiNodeTrialWithTooFewNodesWaitsAndHoldsNothingBack) {
  const int64_t multi = SubmitTwoNodeTrial();
  ASSERT_NE(multi, 0);
  Tick();
  EXPECT_EQ(OnlyTrial(multi).state, store::TrialState::kQueued);
  EXPECT_EQ(RunsStarted(), 0u);
  const std::string notice = daemon_->dispatcher().QueuedNotice(OnlyTrial(multi).id);
  EXPECT_EQ(notice,
            "fewer than 2 connected nodes have 1 cpu device each (it spans 2 nodes); the trial "
            "waits until 2 do (llmctl nodes, llmctl node up)");

  const int64_t single = SubmitOne();
  Tick();
  ASSERT_TRUE(Eventually([&] { return OnlyTrial(single).state == store::TrialState::kOk; }));
  EXPECT_EQ(OnlyTrial(multi).state, store::TrialState::kQueued);
}

store::TrialRecord WaitingTrial() {
  store::TrialRecord trial;
  trial.experiment_id = 7;
  trial.name = "lr-1e-4";
  trial.device_type = "cuda";
  trial.device_count = 2;
  return trial;
}

TEST(WaitingNoticeTest, SaysWhatNoConnectedNodeHasWithTheTargetAndWhyNodesTakeNone) {
  EXPECT_EQ(dispatch::WaitingNotice(WaitingTrial(), {}, false, false, {}, ""),
            "no connected node has 2 cuda devices; the trial waits until one does (llmctl "
            "nodes, llmctl node up)");
  EXPECT_EQ(dispatch::WaitingNotice(WaitingTrial(), {{"flavor", "g1"}, {"site", "TACC"}}, false,
                                    false, {}, "; n2: driver too old"),
            "no connected node with flavor g1, site TACC has 2 cuda devices; the trial waits "
            "until one does (llmctl nodes, llmctl node up); n2: driver too old");
}

TEST(WaitingNoticeTest, NamesTheNodesNotConnectedSinceTheControllerStartedInsteadOfAskingForNodes) {
  EXPECT_EQ(dispatch::WaitingNotice(WaitingTrial(), {}, false, false, {"local"}, ""),
            "no connected node has 2 cuda devices yet: node local has not connected since the "
            "controller started; the trial waits (llmctl nodes)");
  EXPECT_EQ(dispatch::WaitingNotice(WaitingTrial(), {}, false, false, {"n1", "n2"}, ""),
            "no connected node has 2 cuda devices yet: nodes n1, n2 have not connected since "
            "the controller started; the trial waits (llmctl nodes)");
}

TEST(WaitingNoticeTest, AResumedTrialWaitsForItsCheckpointsNodeOrCannotRunWithoutIt) {
  store::TrialRecord trial = WaitingTrial();
  trial.resume = store::TrialResume{};
  trial.resume->node = "n1";
  const std::string from = "it resumes from a checkpoint on node n1";
  EXPECT_EQ(dispatch::WaitingNotice(trial, {}, false, false, {}, ""),
            from + ", which has been removed: it cannot run (llmctl cancel 7 --trial 'lr-1e-4')");
  EXPECT_EQ(dispatch::WaitingNotice(trial, {}, true, true, {}, ""),
            from + ", which has no 2 cuda devices now; it waits there");
  EXPECT_EQ(dispatch::WaitingNotice(trial, {}, true, false, {}, ""),
            from +
                ", which is not connected or takes no new trials (its lease ends soon); it "
                "waits for it (llmctl nodes)");
  // With the controller's copy of the checkpoint any node will do.
  trial.resume->tree = "tree-digest";
  EXPECT_EQ(dispatch::WaitingNotice(trial, {}, false, false, {}, ""),
            dispatch::WaitingNotice(WaitingTrial(), {}, false, false, {}, ""));
}

}  // namespace
}  // namespace llmctl::controller::dispatch_test
