#include "controller/store/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <thread>

#include "controller/store/refusing_vfs.h"
#include "controller/store/schema.h"
#include "controller/store/store_test_support.h"

namespace llmctl::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

TEST_F(StoreTest, CreateExperimentStoresEverythingInFileOrder) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->LatestExperimentId().status().code(), StatusCode::kNotFound);
  NewExperiment input = MakeExperiment("lab", {"zeta", "alpha", "mid"});
  input.trials[1].expect = "oom";
  input.trials[2].device_type = "cuda";
  input.trials[2].device_count = 2;
  input.trials[0].prediction_json = R"({"peak_bytes":1024,"verdict":"fits"})";
  const int64_t id = *store->CreateExperiment(input, kNow);
  EXPECT_EQ(*store->LatestExperimentId(), id);

  StatusOr<ExperimentRecord> experiment = store->GetExperiment(id);
  ASSERT_TRUE(experiment.ok());
  EXPECT_EQ(experiment->filename, "experiments/demo.yaml");
  EXPECT_EQ(experiment->yaml_text, "model: tiny\n");
  EXPECT_EQ(experiment->target.at("flavor"), "g1.h100.pci.1");
  EXPECT_EQ(experiment->created_at, kNow);
  EXPECT_EQ(experiment->state, ExperimentState::kActive);
  EXPECT_EQ(store->GetInputs(id)->at("data/train.jsonl"), "sha256:abc");

  StatusOr<std::vector<TrialRecord>> trials = store->ListTrials(id);
  ASSERT_TRUE(trials.ok());
  ASSERT_EQ(trials->size(), 3u);
  EXPECT_EQ((*trials)[0].name, "zeta");
  EXPECT_EQ((*trials)[1].name, "alpha");
  EXPECT_EQ((*trials)[1].expect, "oom");
  EXPECT_EQ((*trials)[2].device_type, "cuda");
  EXPECT_EQ((*trials)[2].device_count, 2);
  EXPECT_EQ((*trials)[0].prediction_json, R"({"peak_bytes":1024,"verdict":"fits"})");
  EXPECT_FALSE((*trials)[1].prediction_json.has_value());
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*trials)[i].ordinal, i);
    EXPECT_EQ((*trials)[i].state, TrialState::kQueued);
    EXPECT_EQ((*trials)[i].current_attempt, 0);
  }
  EXPECT_EQ(store->GetTrial((*trials)[1].id)->name, "alpha");
  EXPECT_EQ(store->ListExperiments()->size(), 1u);
}

TEST_F(StoreTest, CreateExperimentIsAllOrNothing) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  // The duplicate is the third trial: the experiment row and two trials were already written
  // inside the transaction when it failed.
  StatusOr<int64_t> duplicate =
      store->CreateExperiment(MakeExperiment("dup", {"a", "b", "a"}), kNow);
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(duplicate.status().message(), HasSubstr("'a' twice"));
  EXPECT_THAT(*store->ListExperiments(), IsEmpty());
  EXPECT_THAT(*store->NextQueuedTrials(), IsEmpty());
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trials"), 0);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM inputs"), 0);

  // The store is usable afterwards.
  EXPECT_TRUE(store->CreateExperiment(MakeExperiment("ok", {"a", "b"}), kNow).ok());
}

TEST_F(StoreTest, CreateExperimentNamesTheBadField) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment bad_device = MakeExperiment("e", {"a", "b"});
  bad_device.trials[1].device_type = "gpu";
  StatusOr<int64_t> result = store->CreateExperiment(bad_device, kNow);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("trial 'b': device type must be cpu or cuda"));

  NewExperiment bad_expect = MakeExperiment("e", {"a"});
  bad_expect.trials[0].expect = "fail";
  EXPECT_THAT(store->CreateExperiment(bad_expect, kNow).status().message(),
              HasSubstr("expect must be ok or oom"));

  NewExperiment bad_count = MakeExperiment("e", {"a"});
  bad_count.trials[0].device_count = 0;
  EXPECT_THAT(store->CreateExperiment(bad_count, kNow).status().message(),
              HasSubstr("device count must be at least 1"));

  NewExperiment bad_prediction = MakeExperiment("e", {"a"});
  bad_prediction.trials[0].prediction_json = "[1]";
  EXPECT_THAT(store->CreateExperiment(bad_prediction, kNow).status().message(),
              HasSubstr("trial 'a': prediction is not a JSON object"));

  EXPECT_EQ(store->CreateExperiment(MakeExperiment("e", {}), kNow).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_THAT(*store->ListExperiments(), IsEmpty());
}

TEST_F(StoreTest, LostAttemptRequeuesAndTheNextAttemptIsNumberedOnwards) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  EXPECT_EQ(*store->StartAttempt(trial, "node-1", kNow), 1);
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kRunning);
  EXPECT_THAT(*store->NextQueuedTrials(), IsEmpty());
  ASSERT_EQ(store->ListRunningAttempts()->size(), 1u);
  EXPECT_EQ((*store->ListRunningAttempts())[0].node, "node-1");
  EXPECT_EQ(store->StartAttempt(trial, "node-2", kNow).status().code(),
            StatusCode::kFailedPrecondition);

  ASSERT_TRUE(store->MarkAttemptLost(trial, 1, kNow).ok());
  EXPECT_TRUE(store->MarkAttemptLost(trial, 1, kNow).ok());  // repeating is harmless
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kQueued);
  EXPECT_THAT(*store->ListRunningAttempts(), IsEmpty());
  EXPECT_EQ(*store->StartAttempt(trial, "node-2", kNow), 2);
  EXPECT_EQ(store->GetTrial(trial)->current_attempt, 2);
}

TEST_F(StoreTest, AnAttemptKeepsTheDeviceIndicesItStartedWith) {
  std::vector<int64_t> trials;
  {
    std::unique_ptr<Store> store = OpenStore();
    ASSERT_NE(store, nullptr);
    trials = CreateTrials(*store, "e", {"a", "b", "c"});
    ASSERT_EQ(*store->StartAttempt(trials[0], "gpu-node", kNow, {3, 2}), 1);
    ASSERT_EQ(*store->StartAttempt(trials[1], "gpu-node", kNow, {0}), 1);
    // Negative or repeated indices are refused and start nothing.
    for (const std::vector<int64_t>& bad : {std::vector<int64_t>{-1}, std::vector<int64_t>{1, 1}}) {
      const StatusOr<int64_t> refused = store->StartAttempt(trials[2], "gpu-node", kNow, bad);
      EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(refused.status().message(), HasSubstr("must be distinct and >= 0"));
    }
    EXPECT_EQ(store->GetTrial(trials[2])->state, TrialState::kQueued);
  }
  std::unique_ptr<Store> reopened = OpenStore();  // as after a controller restart
  ASSERT_NE(reopened, nullptr);
  StatusOr<std::vector<RunningAttempt>> running = reopened->ListRunningAttempts();
  ASSERT_TRUE(running.ok()) << running.status().ToString();
  ASSERT_EQ(running->size(), 2u);
  EXPECT_THAT((*running)[0].device_indices, ElementsAre(2, 3));
  EXPECT_THAT((*running)[1].device_indices, ElementsAre(0));
}

TEST_F(StoreTest, AttemptsFromBeforeDeviceIndicesWereStoredStillLoad) {
  // A database at schema version 2 (before the attempts' device indices) with a running attempt.
  std::filesystem::create_directories(dir_ / "data");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  std::string sql = std::string(Migrations()[0]) + std::string(Migrations()[1]) +
                    "INSERT INTO experiments VALUES (1, 'old', 'old.yaml', 'model: tiny', '', "
                    "'{}', 0, 'active');"
                    "INSERT INTO trials (id, experiment_id, ordinal, name, description, "
                    "config_json, device_type, device_count, state, current_attempt) VALUES "
                    "(1, 1, 0, 'a', '', '{}', 'cuda', 2, 'running', 1);"
                    "INSERT INTO attempts (trial_id, attempt, node, state, started_at) VALUES "
                    "(1, 1, 'gpu-node', 'running', 0);"
                    "PRAGMA user_version = 2;";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);

  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int64_t>(Migrations().size()));
  StatusOr<std::vector<RunningAttempt>> running = store->ListRunningAttempts();
  ASSERT_TRUE(running.ok()) << running.status().ToString();
  ASSERT_EQ(running->size(), 1u);
  EXPECT_EQ((*running)[0].node, "gpu-node");
  EXPECT_THAT((*running)[0].device_indices, IsEmpty());  // unknown
}

TEST_F(StoreTest, DamagedDeviceIndicesAreReportedAsDataLoss) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow, {0}), 1);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE attempts SET device_indices_json = '[0, \"x\"]'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  StatusOr<std::vector<RunningAttempt>> running = store->ListRunningAttempts();
  EXPECT_EQ(running.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(running.status().message(), HasSubstr("device indices of attempt 1 of trial"));
}

TEST_F(StoreTest, AppendEventsIsIdempotentOnTrialAttemptAndSeq) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
  EXPECT_EQ(*store->LastSeq(trial, 1), 0);

  const std::vector<Event> first = {StepEvent(1, 0), StepEvent(2, 1), StepEvent(3, 2)};
  EXPECT_EQ(*store->AppendEvents(trial, 1, first), 3);
  EXPECT_EQ(*store->AppendEvents(trial, 1, first), 0);  // the same batch again
  EXPECT_EQ(*store->LastSeq(trial, 1), 3);

  // A stream that resumed from an older position: 2 and 3 again, then new ones.
  const std::vector<Event> overlapping = {StepEvent(2, 1), StepEvent(3, 2), StepEvent(4, 3),
                                          StepEvent(5, 4)};
  EXPECT_EQ(*store->AppendEvents(trial, 1, overlapping), 2);
  EXPECT_EQ(*store->LastSeq(trial, 1), 5);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM events"), 5);
  EXPECT_EQ(QueryInt("SELECT COUNT(DISTINCT seq) FROM events WHERE seq BETWEEN 1 AND 5"), 5);
  EXPECT_EQ(*store->AppendEvents(trial, 1, {}), 0);
}

TEST_F(StoreTest, AppendEventsRefusesMalformedEventsWhole) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
  const std::vector<Event> zero_seq = {StepEvent(1, 0), StepEvent(0, 1)};
  EXPECT_THAT(store->AppendEvents(trial, 1, zero_seq).status().message(),
              HasSubstr("event 0 of attempt 1"));
  const std::vector<Event> not_json = {Event{.seq = 1, .type = "step", .json = "{step: 1"}};
  EXPECT_EQ(store->AppendEvents(trial, 1, not_json).status().code(), StatusCode::kInvalidArgument);
  const std::vector<Event> wrong_type = {
      Event{.seq = 1, .type = "step", .json = R"({"type":"result"})"}};
  EXPECT_THAT(store->AppendEvents(trial, 1, wrong_type).status().message(),
              HasSubstr("\"result\", not 'step'"));
  // The controller resumes a stream from the last seq + 1: INT64_MAX would overflow it.
  const std::vector<Event> last_seq = {StepEvent(std::numeric_limits<int64_t>::max(), 0)};
  EXPECT_THAT(store->AppendEvents(trial, 1, last_seq).status().message(),
              HasSubstr("past the last sequence number"));
  EXPECT_EQ(*store->LastSeq(trial, 1), 0);
}

TEST_F(StoreTest, LinesThatWouldFillTheDiskAreRefusedAndTheControllersRecordsGoOn) {
  // A filesystem with less free than this store keeps: every line is refused, and nothing else.
  const int64_t more_than_any_disk = int64_t{1} << 60;
  {
    std::unique_ptr<Store> store = OpenStore(more_than_any_disk);
    ASSERT_NE(store, nullptr);
    const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
    ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
    const StatusOr<int64_t> refused = store->AppendEvents(trial, 1, std::vector{StepEvent(1, 0)});
    EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
    EXPECT_THAT(refused.status().message(),
                HasSubstr("1 event lines of trial " + std::to_string(trial) + " attempt 1"));
    EXPECT_EQ(*store->LastSeq(trial, 1), 0);
    NewDeviceSample sample;
    sample.seq = 1;
    sample.sample.time = kNow;
    sample.sample.device = "cpu";
    EXPECT_EQ(store->AppendDeviceSamples(trial, 1, std::vector{sample}, 0).status().code(),
              StatusCode::kResourceExhausted);
    // What the controller records of its own still goes in.
    EXPECT_TRUE(store->FinishAttempt(trial, 1, TrialState::kOk, 0, "", kNow).ok());
  }
  // With room, lines go in.
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "f", {"a"})[0];
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
  EXPECT_EQ(*store->AppendEvents(trial, 1, std::vector{StepEvent(1, 0)}), 1);
}

TEST_F(StoreTest, StaleAttemptsAreFencedOff) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
  const std::vector<Event> batch = {StepEvent(1, 0)};
  ASSERT_EQ(*store->AppendEvents(trial, 1, batch), 1);
  ASSERT_TRUE(store->MarkAttemptLost(trial, 1, kNow).ok());

  // Declared lost but not yet restarted: the old attempt already may not write.
  StatusOr<int64_t> lost = store->AppendEvents(trial, 1, std::vector<Event>{StepEvent(2, 1)});
  EXPECT_EQ(lost.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsFence(lost.status()));
  EXPECT_THAT(lost.status().message(), HasSubstr("declared lost"));

  ASSERT_EQ(*store->StartAttempt(trial, "m", kNow), 2);
  StatusOr<int64_t> stale = store->AppendEvents(trial, 1, std::vector<Event>{StepEvent(2, 1)});
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.status().message(),
            "stale attempt 1 of trial " + std::to_string(trial) + "; current is 2");
  const Status finish = store->FinishAttempt(trial, 1, TrialState::kOk, 0, "", kNow);
  EXPECT_EQ(finish.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsFence(finish));
  EXPECT_THAT(finish.message(), HasSubstr("stale attempt 1"));
  const Status future = store->MarkAttemptLost(trial, 3, kNow);
  EXPECT_EQ(future.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(future.message(), HasSubstr("attempt 3 of trial " + std::to_string(trial) +
                                          " was never started; current is 2"));

  EXPECT_EQ(*store->LastSeq(trial, 1), 1);
  EXPECT_EQ(*store->LastSeq(trial, 2), 0);
  EXPECT_EQ(*store->AppendEvents(trial, 2, batch), 1);
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kRunning);
}

// A database file that cannot be written for a while (made read-only, failing) refuses the
// current attempt's writes as a storage failure naming the file, never as the fence above: the
// same writes are stored once the file takes them again, on the same connection. SQLite's
// READONLY was FailedPrecondition, and the event stream gave the attempt up as fenced off.
TEST_F(StoreTest, AFileThatCannotBeWrittenIsNoFenceAndTheWritesAreStoredOnceItCanBe) {
  RefusingVfs vfs;  // before the store opens its file, and destroyed after it closes it
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow), 1);
  const std::vector<Event> batch = {StepEvent(1, 0)};
  for (const int refusal : {SQLITE_READONLY, SQLITE_IOERR_WRITE, SQLITE_CANTOPEN}) {
    SCOPED_TRACE(sqlite3_errstr(refusal));
    vfs.Refuse(refusal);
    const Status events = store->AppendEvents(trial, 1, batch).status();
    EXPECT_EQ(events.code(), StatusCode::kInternal) << events.ToString();
    EXPECT_FALSE(IsFence(events));
    EXPECT_THAT(events.message(), HasSubstr(path_));
    const Status end = store->FinishAttempt(trial, 1, TrialState::kOk, 0, "", kNow);
    EXPECT_EQ(end.code(), StatusCode::kInternal) << end.ToString();
    EXPECT_FALSE(IsFence(end));
  }
  vfs.Accept();
  EXPECT_EQ(*store->AppendEvents(trial, 1, batch), 1);
  EXPECT_TRUE(store->FinishAttempt(trial, 1, TrialState::kOk, 0, "", kNow).ok());
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kOk);
}

TEST_F(StoreTest, FinishAttemptSetsTheOutcomeAndIsIdempotent) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> trials = CreateTrials(*store, "e", {"a", "b"});
  const int64_t experiment = *store->LatestExperimentId();
  ASSERT_EQ(*store->StartAttempt(trials[0], "n", kNow), 1);
  EXPECT_EQ(store->FinishAttempt(trials[0], 1, TrialState::kRunning, 0, "", kNow).code(),
            StatusCode::kInvalidArgument);

  ASSERT_TRUE(store->FinishAttempt(trials[0], 1, TrialState::kOom, 3, "out of memory", kNow).ok());
  EXPECT_EQ(store->GetTrial(trials[0])->state, TrialState::kOom);
  EXPECT_TRUE(store->FinishAttempt(trials[0], 1, TrialState::kOom, 3, "out of memory", kNow).ok());
  const Status different = store->FinishAttempt(trials[0], 1, TrialState::kOk, 0, "", kNow);
  EXPECT_EQ(different.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(different.message(), HasSubstr("already ended as oom"));
  EXPECT_EQ(store->MarkAttemptLost(trials[0], 1, kNow).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kActive);

  // Events that drain after the exit status still belong to the current attempt.
  EXPECT_EQ(*store->AppendEvents(trials[0], 1, std::vector<Event>{StepEvent(1, 0)}), 1);

  ASSERT_EQ(*store->StartAttempt(trials[1], "n", kNow), 1);
  ASSERT_TRUE(store->FinishAttempt(trials[1], 1, TrialState::kOk, 0, "", kNow).ok());
  EXPECT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kDone);
}

TEST_F(StoreTest, CancelEndsQueuedTrialsAndReturnsRunningOnes) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> trials = CreateTrials(*store, "e", {"run", "lose", "wait", "done"});
  const int64_t experiment = *store->LatestExperimentId();
  ASSERT_EQ(*store->StartAttempt(trials[0], "n1", kNow), 1);
  ASSERT_EQ(*store->StartAttempt(trials[1], "n2", kNow), 1);
  ASSERT_EQ(*store->StartAttempt(trials[3], "n1", kNow), 1);
  ASSERT_TRUE(store->FinishAttempt(trials[3], 1, TrialState::kOk, 0, "", kNow).ok());

  StatusOr<std::vector<RunningAttempt>> running = store->CancelExperiment(experiment);
  ASSERT_TRUE(running.ok()) << running.status().ToString();
  ASSERT_EQ(running->size(), 2u);
  EXPECT_EQ((*running)[0].trial_id, trials[0]);
  EXPECT_EQ((*running)[0].node, "n1");
  EXPECT_EQ((*running)[1].trial_id, trials[1]);
  EXPECT_EQ(store->GetTrial(trials[2])->state, TrialState::kCancelled);
  EXPECT_EQ(store->GetTrial(trials[3])->state, TrialState::kOk);
  EXPECT_TRUE(store->GetTrial(trials[0])->cancel_requested);
  EXPECT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kActive);

  // The agent confirms one cancellation; the other agent is lost, and a cancelled trial is not
  // queued again.
  ASSERT_TRUE(store->FinishAttempt(trials[0], 1, TrialState::kCancelled, 5, "", kNow).ok());
  ASSERT_TRUE(store->MarkAttemptLost(trials[1], 1, kNow).ok());
  EXPECT_EQ(store->GetTrial(trials[1])->state, TrialState::kCancelled);
  EXPECT_THAT(*store->NextQueuedTrials(), IsEmpty());
  EXPECT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kDone);

  EXPECT_THAT(*store->CancelTrial(trials[0]), IsEmpty());  // nothing left to cancel
  EXPECT_EQ(store->CancelTrial(987654).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->CancelExperiment(987654).status().code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, NextQueuedTrialsFollowExperimentsThenFileOrder) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> first = CreateTrials(*store, "first", {"c", "a"});
  const std::vector<int64_t> second = CreateTrials(*store, "second", {"b", "d"});
  ASSERT_EQ(*store->StartAttempt(first[0], "n", kNow), 1);
  std::vector<std::string> names;
  const StatusOr<std::vector<TrialRecord>> queued = store->NextQueuedTrials();
  ASSERT_TRUE(queued.ok());
  for (const TrialRecord& trial : *queued) {
    names.push_back(std::to_string(trial.experiment_id) + "/" + trial.name);
  }
  const std::string e1 = std::to_string(store->GetTrial(first[0])->experiment_id);
  const std::string e2 = std::to_string(store->GetTrial(second[0])->experiment_id);
  EXPECT_THAT(names, ElementsAre(e1 + "/a", e2 + "/b", e2 + "/d"));
}

// A trial of `ranks` data-parallel ranks on one node; returns its id.
int64_t CreateDataParallelTrial(Store& store, int64_t ranks) {
  NewExperiment file = MakeExperiment("e", {"ddp"});
  file.trials[0].config_json = DataParallelConfig(ranks);
  StatusOr<int64_t> experiment = store.CreateExperiment(file, kNow);
  EXPECT_TRUE(experiment.ok()) << experiment.status().ToString();
  return experiment.ok() ? store.ListTrials(*experiment)->at(0).id : 0;
}

Event Ranked(Event event, int32_t rank) {
  event.rank = rank;
  return event;
}

TEST_F(StoreTest, RankEventsAreKeptPerRankWithTheirOwnSeqs) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateDataParallelTrial(*store, 3);
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow, {0, 1, 2}), 1);
  EXPECT_THAT(*store->LastRankSeqs(trial, 1), IsEmpty());
  // Rank 0's seq 1 and rank 1's seq 1 are different lines; rank 0 keeps its table.
  const std::vector<Event> batch = {StepEvent(1, 0), Ranked(StepEvent(1, 0, 2.0), 1),
                                    Ranked(StepEvent(2, 1, 2.0), 1),
                                    Ranked(StepEvent(1, 0, 3.0), 2)};
  EXPECT_EQ(*store->AppendEvents(trial, 1, batch), 4);
  EXPECT_EQ(*store->AppendEvents(trial, 1, batch), 0);  // idempotent on (rank, seq)
  EXPECT_EQ(*store->LastSeq(trial, 1), 1);
  EXPECT_THAT(*store->LastRankSeqs(trial, 1), ElementsAre(Pair(1, 2), Pair(2, 1)));
  EXPECT_EQ(store->AppendEvents(trial, 1, std::vector<Event>{Ranked(StepEvent(3, 2), -1)})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM events"), 1);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM rank_events"), 3);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trial_rank_steps WHERE rank = 1"), 2);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM all_rank_events"), 4);
}

// An event of a rank the attempt does not run (its world is the config's ranks per node x the
// attempt's nodes) is refused with the message naming it, and none of its batch is stored.
TEST_F(StoreTest, AnEventOfARankOutsideTheAttemptsWorldIsRefusedAndNothingIsWritten) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateDataParallelTrial(*store, 2);
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow, {0, 1}), 1);
  ASSERT_EQ(*store->AppendEvents(trial, 1,
                                 std::vector<Event>{StepEvent(1, 0), Ranked(StepEvent(1, 0), 1)}),
            2);
  const std::string label = "event 2 of attempt 1 of trial " + std::to_string(trial);
  for (const int32_t rank : {2, std::numeric_limits<int32_t>::max()}) {
    // Good lines of ranks 0 and 1 before it in the same batch are not stored either.
    const std::vector<Event> batch = {StepEvent(2, 1), Ranked(StepEvent(2, 1), 1),
                                      Ranked(StepEvent(2, 1), rank)};
    const StatusOr<int64_t> appended = store->AppendEvents(trial, 1, batch);
    EXPECT_EQ(appended.status().code(), StatusCode::kInvalidArgument) << rank;
    EXPECT_EQ(appended.status().message(), label + ": rank " + std::to_string(rank) +
                                               " is not one of the attempt's 2 ranks (0 to 1)");
    EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM events"), 1) << rank;
    EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM rank_events"), 1) << rank;
    EXPECT_EQ(*store->LastSeq(trial, 1), 1);
    EXPECT_THAT(*store->LastRankSeqs(trial, 1), ElementsAre(Pair(1, 1)));
  }
  // A trial of one rank takes rank 0's lines alone.
  const int64_t single = CreateTrials(*store, "single", {"one"})[0];
  ASSERT_EQ(*store->StartAttempt(single, "n", kNow, {0}), 1);
  EXPECT_EQ(store->AppendEvents(single, 1, std::vector<Event>{Ranked(StepEvent(1, 0), 1)})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(*store->AppendEvents(single, 1, std::vector<Event>{StepEvent(1, 0)}), 1);
}

// A multi-node attempt runs the config's ranks per node on each of its nodes.
TEST_F(StoreTest, AMultiNodeAttemptsWorldIsItsNodesRanks) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment file = MakeExperiment("e", {"two-nodes"});
  file.trials[0].config_json = DataParallelConfig(2, 2);
  const int64_t trial = store->ListTrials(*store->CreateExperiment(file, kNow))->at(0).id;
  ASSERT_EQ(*store->StartMultiNodeAttempt(
                trial,
                {{.node_rank = 0, .node = "n1", .device_indices = {0, 1}, .ended = false},
                 {.node_rank = 1, .node = "n2", .device_indices = {0, 1}, .ended = false}},
                kNow),
            1);
  EXPECT_EQ(*store->AppendEvents(trial, 1, std::vector<Event>{Ranked(StepEvent(1, 0), 3)}), 1);
  const StatusOr<int64_t> past =
      store->AppendEvents(trial, 1, std::vector<Event>{Ranked(StepEvent(1, 0), 4)});
  EXPECT_THAT(past.status().message(), HasSubstr("rank 4 is not one of the attempt's 4 ranks"));
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM rank_events"), 1);
}

TEST_F(StoreTest, ConcurrentWritersFromThreadsAndSeveralStoresLoseNothing) {
  std::unique_ptr<Store> first = OpenStore();
  std::unique_ptr<Store> second = OpenStore();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  const std::vector<int64_t> trials = CreateTrials(*first, "busy", {"a", "b", "c", "d"});
  for (int64_t trial : trials) ASSERT_EQ(*first->StartAttempt(trial, "n", kNow), 1);

  // Each thread writes one trial's events one transaction at a time; two threads share each
  // Store, and the two Stores contend for the file's write lock.
  constexpr int64_t kEvents = 150;
  std::vector<Status> failures(trials.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < trials.size(); ++i) {
    Store* store = i % 2 == 0 ? first.get() : second.get();
    threads.emplace_back([store, trial = trials[i], &failure = failures[i]] {
      for (int64_t seq = 1; seq <= kEvents && failure.ok(); ++seq) {
        StatusOr<int64_t> added =
            store->AppendEvents(trial, 1, std::vector<Event>{StepEvent(seq, seq - 1)});
        if (!added.ok()) failure = added.status();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Status& failure : failures) EXPECT_TRUE(failure.ok()) << failure.ToString();
  for (int64_t trial : trials) {
    EXPECT_EQ(*first->LastSeq(trial, 1), kEvents);
    EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM events WHERE trial_id = " + std::to_string(trial)),
              kEvents);
  }
}

TEST_F(StoreTest, TheControllersCopyOfACheckpointLetsItsTrialResumeAfterItsNodeIsRemoved) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->UpsertNode(RegisteredNode("leased")).ok());
  const std::vector<int64_t> trials =
      CreateTrials(*store, "copy", {"before", "after", "resumed-first"});
  const json checkpoint = {{"step", 4}, {"path", "/runs/1/x/1/output/checkpoints/step-5"}};
  const std::string tree(64, 'a');
  for (int64_t trial : trials) {
    ASSERT_EQ(*store->StartAttempt(trial, "leased", kNow), 1);
    ASSERT_TRUE(store
                    ->AppendEvents(trial, 1,
                                   std::vector<Event>{MakeEvent(
                                       1, ResultEvent("cancelled", 1.0, 1.0, 1, 1.0, checkpoint))})
                    .ok());
    ASSERT_TRUE(store->FinishAttempt(trial, 1, TrialState::kCancelled, 5, "", kNow).ok());
  }
  EXPECT_EQ(store->SetCheckpointTree(trials[0], 2, tree).code(), StatusCode::kNotFound);
  // Resumed while the copy is still on its way: only the node can continue it until it arrives.
  ASSERT_EQ(store->ResumeTrial(trials[2])->tree, "");
  ASSERT_TRUE(store->SetCheckpointTree(trials[2], 1, tree).ok());
  EXPECT_EQ(store->GetTrial(trials[2])->resume->tree, tree);
  // The copy arrives before the resume: the resume names it, and the node may go.
  ASSERT_TRUE(store->SetCheckpointTree(trials[0], 1, tree).ok());
  ASSERT_EQ(store->RemoveNode("leased", kNow)->result, NodeRemoval::Result::kRemoved);
  StatusOr<TrialResume> resume = store->ResumeTrial(trials[0]);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  EXPECT_EQ(*resume, (TrialResume{.attempt = 1,
                                  .node = "leased",
                                  .checkpoint = checkpoint["path"],
                                  .step = 5,
                                  .tree = tree}));
  EXPECT_EQ(store->GetTrial(trials[0])->resume, *resume);
  // Without a copy the removed node's checkpoint is out of reach; once the copy is recorded (a
  // fetch that finished late) the trial resumes from it.
  EXPECT_THAT(store->ResumeTrial(trials[1]).status().message(),
              HasSubstr("which has been removed, and the controller has no copy of it"));
  ASSERT_TRUE(store->SetCheckpointTree(trials[1], 1, tree).ok());
  ASSERT_TRUE(store->ResumeTrial(trials[1]).ok());
  EXPECT_EQ(store->GetTrial(trials[1])->resume->tree, tree);
  // The next attempt starts at the checkpoint's step on any node.
  ASSERT_EQ(*store->StartAttempt(trials[1], "n2", kNow), 2);
  EXPECT_EQ(QueryInt("SELECT first_step FROM attempts WHERE attempt = 2 AND trial_id = " +
                     std::to_string(trials[1])),
            5);
}

TEST_F(StoreTest, ResumeSaysWhyATrialCannotBeResumed) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->UpsertNode(RegisteredNode("gone")).ok());
  const std::vector<int64_t> trials =
      CreateTrials(*store, "why", {"queued", "no-checkpoint", "removed", "refused"});
  const auto status_of = [&](int64_t trial) { return store->ResumeTrial(trial).status(); };
  EXPECT_EQ(status_of(trials[0]).code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(status_of(trials[0]).message(), HasSubstr("is queued"));
  EXPECT_EQ(store->ResumeTrial(987654).status().code(), StatusCode::kNotFound);

  ASSERT_EQ(*store->StartAttempt(trials[1], "n1", kNow), 1);
  ASSERT_TRUE(store
                  ->AppendEvents(trials[1], 1,
                                 std::vector<Event>{
                                     MakeEvent(1, ResultEvent("cancelled", 1.0, 1.0, 1, nullptr))})
                  .ok());
  ASSERT_TRUE(store->FinishAttempt(trials[1], 1, TrialState::kCancelled, 5, "", kNow).ok());
  EXPECT_THAT(status_of(trials[1]).message(),
              HasSubstr("'no-checkpoint''s final attempt 1 ended cancelled without a checkpoint "
                        "(cancelled at step 3); a running trial stopped with llmctl cancel "
                        "--checkpoint keeps one"));

  const json checkpoint = {{"step", 0}, {"path", "/ckpt/step-1"}};
  ASSERT_EQ(*store->StartAttempt(trials[2], "gone", kNow), 1);
  ASSERT_TRUE(store
                  ->AppendEvents(trials[2], 1,
                                 std::vector<Event>{MakeEvent(
                                     1, ResultEvent("cancelled", 1.0, 1.0, 1, 1.0, checkpoint))})
                  .ok());
  ASSERT_TRUE(store->FinishAttempt(trials[2], 1, TrialState::kCancelled, 5, "", kNow).ok());
  ASSERT_EQ(store->RemoveNode("gone", kNow)->result, NodeRemoval::Result::kRemoved);
  EXPECT_THAT(status_of(trials[2]).message(),
              HasSubstr("checkpoint is on node 'gone', which has been removed"));
  EXPECT_EQ(store->GetTrial(trials[2])->state, TrialState::kCancelled) << "nothing changed";

  // A continuation that ended before naming a checkpoint (the agent no longer had it): resuming
  // again goes back to the same checkpoint.
  ASSERT_EQ(*store->StartAttempt(trials[3], "n1", kNow), 1);
  ASSERT_TRUE(store
                  ->AppendEvents(trials[3], 1,
                                 std::vector<Event>{MakeEvent(
                                     1, ResultEvent("failed", 1.0, 1.0, 1, 1.0, checkpoint))})
                  .ok());
  ASSERT_TRUE(store->FinishAttempt(trials[3], 1, TrialState::kFailed, 1, "", kNow).ok());
  const StatusOr<TrialResume> first = store->ResumeTrial(trials[3]);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->step, 1);
  ASSERT_EQ(*store->StartAttempt(trials[3], "n1", kNow), 2);
  ASSERT_TRUE(store
                  ->FinishAttempt(trials[3], 2, TrialState::kFailed, std::nullopt,
                                  "the agent refused it: its checkpoint is gone", kNow)
                  .ok());
  const StatusOr<TrialResume> again = store->ResumeTrial(trials[3]);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *first);
}

TEST(TrialStateTest, NamesRoundTrip) {
  for (TrialState state :
       {TrialState::kQueued, TrialState::kRunning, TrialState::kOk, TrialState::kOom,
        TrialState::kDiverged, TrialState::kFailed, TrialState::kCancelled}) {
    EXPECT_EQ(*ParseTrialState(TrialStateName(state)), state);
  }
  EXPECT_THAT(ParseTrialState("done").status().message(), HasSubstr("'done' is not one of"));
  EXPECT_EQ(ExperimentStateName(ExperimentState::kDone), "done");
  EXPECT_FALSE(IsOutcome(TrialState::kRunning));
  EXPECT_TRUE(IsOutcome(TrialState::kCancelled));
}

}  // namespace
}  // namespace llmctl::store
