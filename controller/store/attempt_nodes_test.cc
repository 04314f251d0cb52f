// Multi-node attempts: started on every node at once, listed with their nodes, lost with any of
// them, withdrawn when none of their runs started, and ended once every node's run has, with the
// outcome that explains the end.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "controller/store/store.h"

namespace llmctl::store {
namespace {

const Time kNow = Time(std::chrono::milliseconds(1'700'000'000'000));
Time Later(int ms) { return kNow + std::chrono::milliseconds(ms); }

class AttemptNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "llmctl-attempt-nodes-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    auto store = Store::Open((dir_ / "llmctl.db").string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    NewExperiment experiment;
    experiment.name = "e";
    experiment.filename = "e.yaml";
    experiment.yaml_text = "model: tiny\n";
    for (const char* name : {"a", "b"}) {
      NewTrial trial;
      trial.name = name;
      trial.config_json = R"({"model":"tiny","nodes":2,"strategy":"ddp"})";
      trial.device_type = "cuda";
      trial.device_count = 2;
      experiment.trials.push_back(trial);
    }
    auto id = store_->CreateExperiment(experiment, kNow);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    auto trials = store_->ListTrials(*id);
    ASSERT_TRUE(trials.ok());
    for (const TrialRecord& trial : *trials) trial_ids_.push_back(trial.id);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Starts trial `a` on n1 (devices 0, 1) and n2 (devices 2, 3); returns the attempt number.
  int64_t StartOnTwoNodes() {
    auto attempt = store_->StartMultiNodeAttempt(
        trial_ids_[0],
        {{.node_rank = 0, .node = "n1", .device_indices = {1, 0}, .ended = false},
         {.node_rank = 1, .node = "n2", .device_indices = {2, 3}, .ended = false}},
        kNow);
    EXPECT_TRUE(attempt.ok()) << attempt.status().ToString();
    return attempt.ok() ? *attempt : 0;
  }

  TrialRecord Trial(int64_t id) {
    auto trial = store_->GetTrial(id);
    EXPECT_TRUE(trial.ok());
    return trial.ok() ? *trial : TrialRecord{};
  }

  std::filesystem::path dir_;
  std::unique_ptr<Store> store_;
  std::vector<int64_t> trial_ids_;
};

TEST_F(AttemptNodesTest, ARunningAttemptListsEveryNodeWithItsDevices) {
  const int64_t attempt = StartOnTwoNodes();
  ASSERT_EQ(attempt, 1);
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kRunning);
  auto running = store_->ListRunningAttempts();
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->size(), 1u);
  const RunningAttempt& listed = running->front();
  EXPECT_EQ(listed.node, "n1");
  EXPECT_EQ(listed.device_indices, (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(listed.nodes.size(), 2u);
  EXPECT_EQ(listed.nodes[0].node, "n1");
  EXPECT_EQ(listed.nodes[1].node, "n2");
  EXPECT_EQ(listed.nodes[1].node_rank, 1);
  EXPECT_EQ(listed.nodes[1].device_indices, (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(listed.nodes[1].ended);
  EXPECT_TRUE(listed.RunsOn("n2"));
  EXPECT_FALSE(listed.RunsOn("n3"));
}

TEST_F(AttemptNodesTest, BadNodeListsAreRefusedAndStartNothing) {
  const auto start = [&](std::vector<AttemptNode> nodes) {
    return store_->StartMultiNodeAttempt(trial_ids_[0], nodes, kNow).status();
  };
  EXPECT_EQ(start({{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(start({{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false},
                   {.node_rank = 1, .node = "n1", .device_indices = {1}, .ended = false}})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(start({{.node_rank = 1, .node = "n1", .device_indices = {0}, .ended = false},
                   {.node_rank = 0, .node = "n2", .device_indices = {1}, .ended = false}})
                .code(),
            StatusCode::kInvalidArgument);
  // Node rank 1's devices are checked inside the transaction: nothing of the attempt remains.
  EXPECT_EQ(start({{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false},
                   {.node_rank = 1, .node = "n2", .device_indices = {1, 1}, .ended = false}})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kQueued);
  EXPECT_EQ(Trial(trial_ids_[0]).current_attempt, 0);
}

TEST_F(AttemptNodesTest, TheAttemptEndsOnlyWhenEveryNodeHasEnded) {
  const int64_t attempt = StartOnTwoNodes();
  auto first = store_->FinishAttemptNode(trial_ids_[0], attempt, 1, TrialState::kOk, 0, "", kNow);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->has_value());
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kRunning);
  auto running = store_->ListRunningAttempts();
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->size(), 1u);
  EXPECT_TRUE(running->front().nodes[1].ended);
  EXPECT_FALSE(running->front().nodes[0].ended);

  auto last =
      store_->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kOk, 0, "", Later(5));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(*last, TrialState::kOk);
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kOk);
  running = store_->ListRunningAttempts();
  ASSERT_TRUE(running.ok());
  EXPECT_TRUE(running->empty());
  // A repeated end (a stream reopened after the controller restarted) changes nothing.
  auto again =
      store_->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kOk, 0, "", Later(9));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, TrialState::kOk);
  EXPECT_EQ(store_->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kFailed, 1, "x", kNow)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->FinishAttemptNode(trial_ids_[0], attempt, 2, TrialState::kOk, 0, "", kNow)
                .status()
                .code(),
            StatusCode::kNotFound);
}

TEST_F(AttemptNodesTest, AnOwnFailureExplainsTheEndEvenWhenItsPeersEndedFirst) {
  const int64_t attempt = StartOnTwoNodes();
  // Node 0's ranks lose their peers and end as failed before node 1's out-of-memory end arrives.
  ASSERT_TRUE(store_
                  ->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kFailed, 1,
                                      "rank 0 of 4 exited with code 1", kNow)
                  .ok());
  auto last = store_->FinishAttemptNode(trial_ids_[0], attempt, 1, TrialState::kOom, 3,
                                        "rank 3 of 4: CUDA out of memory", Later(10));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(*last, TrialState::kOom);
  const TrialRecord trial = Trial(trial_ids_[0]);
  EXPECT_EQ(trial.state, TrialState::kOom);
  auto report = store_->Report(trial.experiment_id);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->trials.front().error,
            "node n2 (node rank 1 of 2): rank 3 of 4: CUDA out of memory");
  EXPECT_EQ(report->trials.front().exit_code, 3);
  EXPECT_EQ(report->trials.front().node, "n1");
  EXPECT_EQ(report->trials.front().nodes, (std::vector<std::string>{"n1", "n2"}));
}

TEST_F(AttemptNodesTest, TheFirstFailureWinsOverTheNodesTheControllerStopped) {
  const int64_t attempt = StartOnTwoNodes();
  ASSERT_TRUE(store_
                  ->FinishAttemptNode(trial_ids_[0], attempt, 1, TrialState::kFailed, 1,
                                      "rank 2 of 4 exited with code 1", kNow)
                  .ok());
  auto last = store_->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kCancelled, 5, "",
                                        Later(10));
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, TrialState::kFailed);
}

// Node 1's failure is recorded first; the controller's wall clock then steps an hour back before
// node 0's ranks, which lost their peers, end as failed too: the first recorded still explains it.
TEST_F(AttemptNodesTest, TheFirstFailureRecordedWinsOverAWallClockStepBack) {
  const int64_t attempt = StartOnTwoNodes();
  ASSERT_TRUE(store_
                  ->FinishAttemptNode(trial_ids_[0], attempt, 1, TrialState::kFailed, 1,
                                      "rank 2 of 4 exited with code 1", kNow)
                  .ok());
  auto last = store_->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kFailed, 1,
                                        "rank 0 of 4 lost its peers", kNow - std::chrono::hours(1));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(*last, TrialState::kFailed);
  auto report = store_->Report(Trial(trial_ids_[0]).experiment_id);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->trials.front().error,
            "node n2 (node rank 1 of 2): rank 2 of 4 exited with code 1");
}

TEST_F(AttemptNodesTest, AUserCancelEndsItCancelled) {
  const int64_t attempt = StartOnTwoNodes();
  ASSERT_TRUE(store_->CancelTrial(trial_ids_[0]).ok());
  ASSERT_TRUE(
      store_->FinishAttemptNode(trial_ids_[0], attempt, 1, TrialState::kFailed, 1, "peer", kNow)
          .ok());
  auto last =
      store_->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kCancelled, 5, "", Later(1));
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, TrialState::kCancelled);
}

TEST_F(AttemptNodesTest, AnAttemptNoneOfWhoseRunsStartedIsWithdrawnAndItsNumberUsedAgain) {
  const int64_t attempt = StartOnTwoNodes();
  ASSERT_EQ(attempt, 1);
  const Status withdrawn = store_->WithdrawAttempt(trial_ids_[0], attempt);
  ASSERT_TRUE(withdrawn.ok()) << withdrawn.ToString();
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kQueued);
  EXPECT_EQ(Trial(trial_ids_[0]).current_attempt, 0);
  auto running = store_->ListRunningAttempts();
  ASSERT_TRUE(running.ok());
  EXPECT_TRUE(running->empty());
  // Nothing of it stays: the next attempt takes its number, on other nodes.
  auto again = store_->StartMultiNodeAttempt(
      trial_ids_[0],
      {{.node_rank = 0, .node = "n3", .device_indices = {0}, .ended = false},
       {.node_rank = 1, .node = "n1", .device_indices = {1}, .ended = false}},
      Later(5));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, 1);
  running = store_->ListRunningAttempts();
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->size(), 1u);
  EXPECT_EQ(running->front().node, "n3");
  ASSERT_EQ(running->front().nodes.size(), 2u);
  EXPECT_EQ(running->front().nodes[1].node, "n1");
  EXPECT_EQ(running->front().started_at, Later(5));
}

TEST_F(AttemptNodesTest, AnAttemptWithAnythingStoredIsNeverWithdrawn) {
  // An event of any rank, or a node's end, proves a run ran.
  const int64_t attempt = StartOnTwoNodes();
  const std::vector<Event> rank1 = {
      {.seq = 1, .type = "step", .json = R"({"type":"step"})", .rank = 1}};
  ASSERT_TRUE(store_->AppendEvents(trial_ids_[0], attempt, rank1).ok());
  EXPECT_EQ(store_->WithdrawAttempt(trial_ids_[0], attempt).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kRunning);
  EXPECT_EQ(Trial(trial_ids_[0]).current_attempt, attempt);

  auto b = store_->StartMultiNodeAttempt(
      trial_ids_[1],
      {{.node_rank = 0, .node = "n3", .device_indices = {0}, .ended = false},
       {.node_rank = 1, .node = "n4", .device_indices = {0}, .ended = false}},
      kNow);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(
      store_->FinishAttemptNode(trial_ids_[1], *b, 1, TrialState::kFailed, 1, "peer", kNow).ok());
  EXPECT_EQ(store_->WithdrawAttempt(trial_ids_[1], *b).code(), StatusCode::kFailedPrecondition);

  // Nor one that has been lost, nor a number that is not the current attempt's.
  ASSERT_TRUE(store_->MarkAttemptLost(trial_ids_[0], attempt, Later(1)).ok());
  EXPECT_EQ(store_->WithdrawAttempt(trial_ids_[0], attempt).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->WithdrawAttempt(trial_ids_[0], attempt + 1).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kQueued);
  EXPECT_EQ(Trial(trial_ids_[0]).current_attempt, attempt);
}

TEST_F(AttemptNodesTest, AWithdrawnAttemptOfATrialTheUserCancelledEndsItCancelled) {
  const int64_t attempt = StartOnTwoNodes();
  ASSERT_TRUE(store_->CancelTrial(trial_ids_[0]).ok());
  ASSERT_TRUE(store_->WithdrawAttempt(trial_ids_[0], attempt).ok());
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kCancelled);
  EXPECT_EQ(Trial(trial_ids_[0]).current_attempt, 0);
}

TEST_F(AttemptNodesTest, RemovingAnyOfItsNodesLosesTheAttemptAndFencesItsNodes) {
  const int64_t attempt = StartOnTwoNodes();
  NodeRecord node;
  node.name = "n2";
  node.address = "127.0.0.1:1";
  node.devices_json = "[]";
  ASSERT_TRUE(store_->RegisterNode(node).ok());
  auto removal = store_->RemoveNode("n2", kNow);
  ASSERT_TRUE(removal.ok()) << removal.status().ToString();
  ASSERT_EQ(removal->lost.size(), 1u);
  EXPECT_EQ(removal->lost.front().trial_id, trial_ids_[0]);
  EXPECT_EQ(Trial(trial_ids_[0]).state, TrialState::kQueued);
  EXPECT_EQ(store_->FinishAttemptNode(trial_ids_[0], attempt, 0, TrialState::kOk, 0, "", kNow)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
  // The next attempt cannot be placed on the removed node.
  EXPECT_EQ(store_
                ->StartMultiNodeAttempt(
                    trial_ids_[0],
                    {{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false},
                     {.node_rank = 1, .node = "n2", .device_indices = {0}, .ended = false}},
                    kNow)
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
}

// A lost attempt's runs that had not ended hold their devices, each until released, and are kept
// in the file (a restarted controller reads them back); a removed node's are released with it.
TEST_F(AttemptNodesTest, ALostAttemptsRunsAreKeptUntilReleasedOrTheirNodeRemoved) {
  const int64_t a = StartOnTwoNodes();
  auto b = store_->StartAttempt(trial_ids_[1], "n3", kNow, {4});
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(store_->MarkAttemptLost(trial_ids_[0], a, Later(1)).ok());
  ASSERT_TRUE(store_->MarkAttemptLost(trial_ids_[1], *b, Later(1)).ok());
  const auto listed = [&] {
    std::vector<std::string> runs;
    StatusOr<std::vector<LostRun>> lost = store_->ListLostRuns();
    EXPECT_TRUE(lost.ok()) << lost.status().ToString();
    for (const LostRun& run : lost.ok() ? *lost : std::vector<LostRun>{}) {
      std::string devices;
      for (int64_t index : run.attempt.device_indices) devices += std::to_string(index);
      runs.push_back(run.trial_name + "#" + std::to_string(run.attempt.attempt) + "@" +
                     run.attempt.node + ":" + devices);
    }
    return runs;
  };
  EXPECT_EQ(listed(), (std::vector<std::string>{"a#1@n1:01", "a#1@n2:23", "b#1@n3:4"}));
  store_.reset();
  auto reopened = Store::Open((dir_ / "llmctl.db").string());
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  store_ = std::move(*reopened);
  EXPECT_EQ(listed(), (std::vector<std::string>{"a#1@n1:01", "a#1@n2:23", "b#1@n3:4"}));

  ASSERT_TRUE(store_->ReleaseLostRun(trial_ids_[0], a, "n1").ok());
  ASSERT_TRUE(store_->ReleaseLostRun(trial_ids_[0], a, "n1").ok());       // again: harmless
  ASSERT_TRUE(store_->MarkAttemptLost(trial_ids_[0], a, Later(2)).ok());  // keeps nothing again
  EXPECT_EQ(listed(), (std::vector<std::string>{"a#1@n2:23", "b#1@n3:4"}));
  NodeRecord node;
  node.name = "n3";
  node.address = "127.0.0.1:1";
  node.devices_json = "[]";
  ASSERT_TRUE(store_->RegisterNode(node).ok());
  ASSERT_TRUE(store_->RemoveNode("n3", Later(3)).ok());
  EXPECT_EQ(listed(), (std::vector<std::string>{"a#1@n2:23"}));

  // A node whose run had ended when the attempt was lost holds nothing.
  auto next = store_->StartMultiNodeAttempt(
      trial_ids_[0],
      {{.node_rank = 0, .node = "n1", .device_indices = {0}, .ended = false},
       {.node_rank = 1, .node = "n4", .device_indices = {1}, .ended = false}},
      Later(4));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ASSERT_TRUE(store_
                  ->FinishAttemptNode(trial_ids_[0], *next, 1, TrialState::kFailed, 1,
                                      "lost its peer", Later(5))
                  .ok());
  ASSERT_TRUE(store_->MarkAttemptLost(trial_ids_[0], *next, Later(6)).ok());
  EXPECT_EQ(listed(), (std::vector<std::string>{"a#1@n2:23", "a#2@n1:0"}));
}

}  // namespace
}  // namespace llmctl::store
