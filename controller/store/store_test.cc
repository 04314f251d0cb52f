#include "controller/store/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "controller/store/schema.h"

namespace llmctl::store {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using json = nlohmann::json;

const Time kNow = Time(std::chrono::milliseconds(1'700'000'000'123));

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "llmctl-store-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    path_ = (dir_ / "data" / "llmctl.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Store> OpenStore() {
    StatusOr<std::unique_ptr<Store>> store = Store::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }

  // A statement's single integer result, read through a connection of the test's own.
  int64_t QueryInt(const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    EXPECT_EQ(sqlite3_step(stmt), SQLITE_ROW) << sql;
    const int64_t value = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return value;
  }

  std::filesystem::path dir_;
  std::string path_;
};

NewTrial MakeTrial(std::string name, std::string device_type = "cpu", int64_t count = 1) {
  return NewTrial{.name = std::move(name),
                  .description = "",
                  .config_json = R"({"model":"tiny"})",
                  .expect = std::nullopt,
                  .device_type = std::move(device_type),
                  .device_count = count};
}

NewExperiment MakeExperiment(std::string name, std::vector<std::string> trial_names) {
  NewExperiment experiment{.name = std::move(name),
                           .filename = "experiments/demo.yaml",
                           .yaml_text = "model: tiny\n",
                           .description = "a test",
                           .target = {{"flavor", "g1.h100.pci.1"}},
                           .trials = {},
                           .inputs = {{"data/train.jsonl", "sha256:abc"}}};
  for (std::string& trial : trial_names) experiment.trials.push_back(MakeTrial(std::move(trial)));
  return experiment;
}

Event MakeEvent(int64_t seq, const json& line) {
  return Event{.seq = seq, .type = line.at("type").get<std::string>(), .json = line.dump()};
}

Event StepEvent(int64_t seq, int64_t step, double loss = 1.0) {
  return MakeEvent(seq, {{"type", "step"}, {"step", step}, {"loss", loss}});
}

json Snapshot(int64_t step, const std::string& phase, int64_t allocated) {
  return {{"type", "snapshot"},
          {"step", step},
          {"micro_batch", 0},
          {"phase", phase},
          {"params_bytes", 10},
          {"grads_bytes", 20},
          {"allocated_bytes", allocated}};
}

// Creates an experiment with the given trials and returns their ids in file order.
std::vector<int64_t> CreateTrials(Store& store, const std::string& name,
                                  std::vector<std::string> trial_names) {
  StatusOr<int64_t> id = store.CreateExperiment(MakeExperiment(name, std::move(trial_names)), kNow);
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  std::vector<int64_t> ids;
  if (!id.ok()) return ids;
  StatusOr<std::vector<TrialRecord>> trials = store.ListTrials(*id);
  EXPECT_TRUE(trials.ok()) << trials.status().ToString();
  for (const TrialRecord& trial : *trials) ids.push_back(trial.id);
  return ids;
}

mode_t FileMode(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 0777;
}

TEST_F(StoreTest, OpenCreatesAPrivateDatabaseAtTheNewestSchema) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int64_t>(Migrations().size()));
  EXPECT_EQ(FileMode(path_), 0600u);
  EXPECT_EQ(FileMode((dir_ / "data").string()), 0700u);
  ASSERT_TRUE(store->CreateExperiment(MakeExperiment("e", {"a"}), kNow).ok());
  // The write-ahead log holds the same data and gets the database file's mode.
  EXPECT_EQ(FileMode(path_ + "-wal"), 0600u);
}

TEST_F(StoreTest, ReopeningKeepsTheDataAndTheSchemaVersion) {
  int64_t experiment_id = 0;
  {
    std::unique_ptr<Store> store = OpenStore();
    ASSERT_NE(store, nullptr);
    experiment_id = *store->CreateExperiment(MakeExperiment("kept", {"a", "b"}), kNow);
  }
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int64_t>(Migrations().size()));
  StatusOr<ExperimentRecord> experiment = store->GetExperiment(experiment_id);
  ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
  EXPECT_EQ(experiment->name, "kept");
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trials"), 2);
}

TEST_F(StoreTest, OpenNarrowsAWiderFileToOwnerOnly) {
  std::filesystem::create_directories(dir_ / "data");
  std::ofstream(path_).close();
  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  ASSERT_NE(OpenStore(), nullptr);
  EXPECT_EQ(FileMode(path_), 0600u);
}

TEST_F(StoreTest, DatabaseFromANewerVersionIsRefused) {
  std::filesystem::create_directories(dir_ / "data");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 999", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  StatusOr<std::unique_ptr<Store>> store = Store::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  EXPECT_THAT(store.status().message(), HasSubstr("schema version is 999"));
  EXPECT_EQ(QueryInt("PRAGMA user_version"), 999);  // untouched
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM sqlite_schema"), 0);
}

TEST_F(StoreTest, FileThatIsNoDatabaseIsRefused) {
  std::filesystem::create_directories(dir_ / "data");
  std::ofstream(path_) << std::string(4096, 'x');
  StatusOr<std::unique_ptr<Store>> store = Store::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(store.status().message(), HasSubstr("not an SQLite database"));
}

TEST_F(StoreTest, DirectoryInPlaceOfTheFileIsRefused) {
  std::filesystem::create_directories(path_);
  StatusOr<std::unique_ptr<Store>> store = Store::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
}

TEST_F(StoreTest, CreateExperimentStoresEverythingInFileOrder) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->LatestExperimentId().status().code(), StatusCode::kNotFound);
  NewExperiment input = MakeExperiment("lab", {"zeta", "alpha", "mid"});
  input.trials[1].expect = "oom";
  input.trials[2].device_type = "cuda";
  input.trials[2].device_count = 2;
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
  EXPECT_EQ(*store->LastSeq(trial, 1), 0);
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
  EXPECT_THAT(lost.status().message(), HasSubstr("declared lost"));

  ASSERT_EQ(*store->StartAttempt(trial, "m", kNow), 2);
  StatusOr<int64_t> stale = store->AppendEvents(trial, 1, std::vector<Event>{StepEvent(2, 1)});
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.status().message(),
            "stale attempt 1 of trial " + std::to_string(trial) + "; current is 2");
  const Status finish = store->FinishAttempt(trial, 1, TrialState::kOk, 0, "", kNow);
  EXPECT_EQ(finish.code(), StatusCode::kFailedPrecondition);
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

TEST_F(StoreTest, NodesAndSecretReferences) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NodeRecord node{.name = "gpu-1",
                  .address = "10.0.0.5:7070",
                  .devices_json = R"([{"type":"cuda","count":1}])",
                  .last_seen = kNow,
                  .state = "connected",
                  .lease = std::nullopt};
  ASSERT_TRUE(store->UpsertNode(node).ok());
  node.state = "disconnected";
  node.last_seen = kNow + std::chrono::seconds(5);
  ASSERT_TRUE(store->UpsertNode(node).ok());
  ASSERT_TRUE(store
                  ->UpsertNode({.name = "cpu-0",
                                .address = "unix:/tmp/a.sock",
                                .devices_json = "[]",
                                .last_seen = kNow,
                                .state = "connected",
                                .lease = std::nullopt})
                  .ok());
  StatusOr<std::vector<NodeRecord>> nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].name, "cpu-0");
  EXPECT_EQ((*nodes)[1].state, "disconnected");
  EXPECT_EQ((*nodes)[1].last_seen, kNow + std::chrono::seconds(5));
  EXPECT_EQ(store
                ->UpsertNode({.name = "x",
                              .address = "a",
                              .devices_json = "{",
                              .last_seen = kNow,
                              .state = "connected",
                              .lease = std::nullopt})
                .code(),
            StatusCode::kInvalidArgument);

  // A node's lease survives the dispatcher's upserts of its state.
  const NodeLease lease{.name = "lab",
                        .site = "KVM@TACC",
                        .flavor = "g1.h100.pci.1",
                        .ends = kNow + std::chrono::hours(3)};
  ASSERT_TRUE(store->SetNodeLease("gpu-1", lease).ok());
  EXPECT_EQ(store->SetNodeLease("nobody", lease).code(), StatusCode::kNotFound);
  node.state = "connected";
  ASSERT_TRUE(store->UpsertNode(node).ok());
  nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok() && nodes->size() == 2u);
  EXPECT_EQ((*nodes)[1].lease, lease);
  EXPECT_EQ((*nodes)[1].state, "connected");
  EXPECT_FALSE((*nodes)[0].lease.has_value());

  ASSERT_TRUE(store->PutSecretRef("openstack", "secrets.json#chameleon").ok());
  EXPECT_EQ(*store->GetSecretRef("openstack"), "secrets.json#chameleon");
  EXPECT_EQ(store->GetSecretRef("nope").status().code(), StatusCode::kNotFound);
}

NodeRecord RegisteredNode(std::string name) {
  return NodeRecord{.name = std::move(name),
                    .address = "127.0.0.2:7443",
                    .devices_json = "[]",
                    .last_seen = kNow,
                    .state = "connected",
                    .lease = std::nullopt};
}

TEST_F(StoreTest, RemovingANodeLosesItsRunningAttemptsAndRequeuesTheirTrialsAtOnce) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-1")).ok());
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-2")).ok());
  ASSERT_TRUE(store->PutSecretRef("gpu-1", "secrets.json#node_tokens/gpu-1").ok());
  ASSERT_TRUE(store->PutSecretRef("gpu-2", "secrets.json#node_tokens/gpu-2").ok());
  const std::vector<int64_t> trials = CreateTrials(*store, "e", {"a", "b", "c", "d"});
  ASSERT_EQ(*store->StartAttempt(trials[0], "gpu-1", kNow), 1);
  ASSERT_EQ(*store->StartAttempt(trials[1], "gpu-1", kNow), 1);
  ASSERT_EQ(*store->StartAttempt(trials[2], "gpu-2", kNow), 1);  // elsewhere: untouched
  ASSERT_EQ(*store->StartAttempt(trials[3], "gpu-1", kNow), 1);
  ASSERT_TRUE(store->FinishAttempt(trials[3], 1, TrialState::kOk, 0, "", kNow).ok());
  ASSERT_EQ(store->CancelTrial(trials[1])->size(), 1u);  // cancel requested while it runs

  const Time later = kNow + std::chrono::seconds(1);  // far less than any requeue_after
  StatusOr<NodeRemoval> removal = store->RemoveNode("gpu-1", later);
  ASSERT_TRUE(removal.ok()) << removal.status().ToString();
  EXPECT_EQ(removal->result, NodeRemoval::Result::kRemoved);
  EXPECT_EQ(removal->removed_at, later);
  ASSERT_EQ(removal->lost.size(), 2u);
  EXPECT_EQ(removal->lost[0].trial_id, trials[0]);
  EXPECT_EQ(removal->lost[1].trial_id, trials[1]);

  // The lost attempt's trial is queued again and its next attempt is 2; a cancelled one ends.
  EXPECT_EQ(store->GetTrial(trials[0])->state, TrialState::kQueued);
  EXPECT_EQ(store->GetTrial(trials[1])->state, TrialState::kCancelled);
  EXPECT_EQ(store->GetTrial(trials[2])->state, TrialState::kRunning);
  EXPECT_EQ(store->GetTrial(trials[3])->state, TrialState::kOk);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM attempts WHERE node = 'gpu-1' AND state = 'lost'"), 2);
  // Whatever the removed node's attempt still sends is fenced off.
  EXPECT_EQ(store->AppendEvents(trials[0], 1, std::vector<Event>{StepEvent(1, 0)}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store->StartAttempt(trials[0], "gpu-2", later), 2);

  // Gone from the list, its secret reference deleted, its lease refused; its history stays.
  StatusOr<std::vector<NodeRecord>> nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].name, "gpu-2");
  EXPECT_EQ(store->GetSecretRef("gpu-1").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store->GetSecretRef("gpu-2").ok());
  EXPECT_EQ(
      store
          ->SetNodeLease("gpu-1", NodeLease{.name = "l", .site = "s", .flavor = "f", .ends = later})
          .code(),
      StatusCode::kNotFound);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM nodes WHERE name = 'gpu-1' AND removed_at IS NOT NULL"),
            1);
  // No new attempt starts there, and a health check racing with the removal does not revive it.
  const int64_t late = CreateTrials(*store, "late", {"x"})[0];
  EXPECT_EQ(store->StartAttempt(late, "gpu-1", later).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->UpsertNode(RegisteredNode("gpu-1")).ok());
  EXPECT_EQ(store->ListNodes()->size(), 1u);

  // Idempotent: a second removal changes nothing and says when the first one was.
  StatusOr<NodeRemoval> again = store->RemoveNode("gpu-1", later + std::chrono::seconds(9));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->result, NodeRemoval::Result::kAlreadyRemoved);
  EXPECT_EQ(again->removed_at, later);
  EXPECT_THAT(again->lost, IsEmpty());
  StatusOr<NodeRemoval> unknown = store->RemoveNode("never-registered", later);
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  EXPECT_EQ(unknown->result, NodeRemoval::Result::kUnknown);
  EXPECT_FALSE(unknown->removed_at.has_value());
}

TEST_F(StoreTest, ARemovedNodeRegisteredAgainComesBackWithoutItsOldLease) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-1")).ok());
  ASSERT_TRUE(store
                  ->SetNodeLease("gpu-1", NodeLease{.name = "old",
                                                    .site = "KVM@TACC",
                                                    .flavor = "g1.h100.pci.1",
                                                    .ends = kNow + std::chrono::hours(1)})
                  .ok());
  // Registering a node that is there keeps its lease, as UpsertNode does.
  ASSERT_TRUE(store->RegisterNode(RegisteredNode("gpu-1")).ok());
  EXPECT_TRUE((*store->ListNodes())[0].lease.has_value());

  ASSERT_TRUE(store->RemoveNode("gpu-1", kNow).status().ok());
  NodeRecord fresh = RegisteredNode("gpu-1");
  fresh.address = "";
  fresh.state = "registered";
  ASSERT_TRUE(store->RegisterNode(fresh).ok());
  StatusOr<std::vector<NodeRecord>> nodes = store->ListNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].state, "registered");
  EXPECT_FALSE((*nodes)[0].lease.has_value());
  const int64_t trial = CreateTrials(*store, "e", {"a"})[0];
  EXPECT_EQ(*store->StartAttempt(trial, "gpu-1", kNow), 1);
  EXPECT_EQ(store->RemoveNode("gpu-1", kNow)->result, NodeRemoval::Result::kRemoved);
}

TEST_F(StoreTest, RankEventsAreKeptPerRankWithTheirOwnSeqs) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t trial = CreateTrials(*store, "e", {"ddp"})[0];
  ASSERT_EQ(*store->StartAttempt(trial, "n", kNow, {0, 1}), 1);
  EXPECT_THAT(*store->LastRankSeqs(trial, 1), IsEmpty());
  // Rank 0's seq 1 and rank 1's seq 1 are different lines; rank 0 keeps its table.
  auto ranked = [](Event event, int32_t rank) {
    event.rank = rank;
    return event;
  };
  const std::vector<Event> batch = {StepEvent(1, 0), ranked(StepEvent(1, 0, 2.0), 1),
                                    ranked(StepEvent(2, 1, 2.0), 1),
                                    ranked(StepEvent(1, 0, 3.0), 2)};
  EXPECT_EQ(*store->AppendEvents(trial, 1, batch), 4);
  EXPECT_EQ(*store->AppendEvents(trial, 1, batch), 0);  // idempotent on (rank, seq)
  EXPECT_EQ(*store->LastSeq(trial, 1), 1);
  EXPECT_THAT(*store->LastRankSeqs(trial, 1), ElementsAre(Pair(1, 2), Pair(2, 1)));
  EXPECT_EQ(store->AppendEvents(trial, 1, std::vector<Event>{ranked(StepEvent(3, 2), -1)})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM events"), 1);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM rank_events"), 3);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trial_rank_steps WHERE rank = 1"), 2);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM all_rank_events"), 4);
}

TEST_F(StoreTest, ReportHasEveryRanksMemoryForAMultiRankTrial) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = *store->CreateExperiment(MakeExperiment("x", {"ddp", "one"}), kNow);
  const int64_t ddp = store->ListTrials(experiment)->at(0).id;
  const int64_t one = store->ListTrials(experiment)->at(1).id;
  ASSERT_EQ(*store->StartAttempt(ddp, "n", kNow, {0, 1}), 1);
  auto ranked = [](Event event, int32_t rank) {
    event.rank = rank;
    return event;
  };
  ASSERT_EQ(*store->AppendEvents(
                ddp, 1,
                std::vector<Event>{
                    MakeEvent(1, Snapshot(0, "phase1_after_fwd", 300)),
                    MakeEvent(2, Snapshot(0, "phase2_after_bwd", 250)),
                    MakeEvent(3, Snapshot(1, "phase1_after_fwd", 310)),
                    ranked(MakeEvent(1, Snapshot(0, "phase1_after_fwd", 400)), 1),
                    ranked(MakeEvent(2, Snapshot(0, "phase2_after_bwd", 200)), 1),
                    MakeEvent(4, {{"type", "result"}, {"outcome", "ok"}, {"peak_bytes", 330}}),
                    ranked(MakeEvent(3, {{"type", "result"}, {"outcome", "ok"}, {"peak_bytes", 420}}),
                           1),
                }),
            7);
  ASSERT_TRUE(store->FinishAttempt(ddp, 1, TrialState::kOk, 0, "", kNow).ok());
  ASSERT_EQ(*store->StartAttempt(one, "n", kNow, {0}), 1);
  ASSERT_EQ(*store->AppendEvents(one, 1,
                                 std::vector<Event>{MakeEvent(1, Snapshot(0, "phase1_after_fwd", 5))}),
            1);

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const TrialReport& row = report->trials[0];
  ASSERT_EQ(row.ranks.size(), 2u);
  EXPECT_EQ(row.ranks[0].rank, 0);
  EXPECT_EQ(row.ranks[0].peak_bytes, 330);
  EXPECT_EQ(row.ranks[0].allocated_bytes, 310);
  EXPECT_THAT(row.ranks[0].phase_allocated,
              ElementsAre(Pair("phase1_after_fwd", 310), Pair("phase2_after_bwd", 250)));
  EXPECT_EQ(row.ranks[1].rank, 1);
  EXPECT_EQ(row.ranks[1].peak_bytes, 420);
  EXPECT_EQ(row.ranks[1].allocated_bytes, 400);
  EXPECT_THAT(row.ranks[1].phase_allocated,
              ElementsAre(Pair("phase1_after_fwd", 400), Pair("phase2_after_bwd", 200)));
  // The trial-level figures stay rank 0's.
  EXPECT_EQ(row.peak_snapshot.at("allocated_bytes"), 310);
  // A one-process trial lists no ranks.
  EXPECT_THAT(report->trials[1].ranks, IsEmpty());
}

TEST_F(StoreTest, ReportReadsTheFinalAttemptOnly) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment input = MakeExperiment("report", {"requeued", "never-ran"});
  input.trials[0].expect = "ok";
  const int64_t experiment = *store->CreateExperiment(input, kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;

  // Attempt 1 saw a huge snapshot before its node was lost; the report must not show it.
  ASSERT_EQ(*store->StartAttempt(trial, "lost-node", kNow), 1);
  ASSERT_EQ(*store->AppendEvents(trial, 1,
                                 std::vector<Event>{
                                     MakeEvent(1, {{"type", "start"}, {"total_steps", 99}}),
                                     MakeEvent(2, Snapshot(0, "phase1_after_fwd", 1'000'000)),
                                 }),
            2);
  ASSERT_TRUE(store->MarkAttemptLost(trial, 1, kNow).ok());

  ASSERT_EQ(*store->StartAttempt(trial, "good-node", kNow), 2);
  const std::vector<Event> events = {
      MakeEvent(1, {{"type", "start"}, {"total_steps", 2}, {"parameters_total", 1234}}),
      MakeEvent(2, Snapshot(0, "phase0_before_fwd", 100)),
      MakeEvent(3, Snapshot(0, "phase1_after_fwd", 300)),
      MakeEvent(4, Snapshot(0, "phase2_after_bwd", 250)),
      MakeEvent(5, Snapshot(0, "phase3_after_opt_step", 200)),
      StepEvent(6, 0, 2.5),
      MakeEvent(7, Snapshot(1, "phase0_before_fwd", 150)),
      MakeEvent(8, Snapshot(1, "phase1_after_fwd", 300)),  // ties step 0's: the earlier wins
      MakeEvent(9, Snapshot(1, "phase2_after_bwd", 260)),
      StepEvent(10, 1, 2.25),
      MakeEvent(11, {{"type", "log"}, {"level", "info"}, {"message", "hi"}}),
      MakeEvent(12, {{"type", "result"},
                     {"outcome", "ok"},
                     {"train_seconds", 1.5},
                     {"tokens_per_second", 1000.0},
                     {"peak_bytes", 320},
                     {"final_loss", 2.25},
                     {"error", ""}}),
  };
  ASSERT_EQ(*store->AppendEvents(trial, 2, events), 12);
  ASSERT_TRUE(store->FinishAttempt(trial, 2, TrialState::kOk, 0, "", kNow).ok());

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->experiment.name, "report");
  ASSERT_EQ(report->trials.size(), 2u);

  const TrialReport& row = report->trials[0];
  EXPECT_EQ(row.name, "requeued");
  EXPECT_EQ(row.expect, "ok");
  EXPECT_EQ(row.state, TrialState::kOk);
  EXPECT_EQ(row.attempt, 2);
  EXPECT_EQ(row.node, "good-node");
  EXPECT_EQ(row.exit_code, 0);
  EXPECT_EQ(row.start.at("total_steps"), 2);
  EXPECT_EQ(row.tokens_per_second, 1000.0);
  EXPECT_EQ(row.train_seconds, 1.5);
  EXPECT_EQ(row.final_loss, 2.25);
  EXPECT_EQ(row.peak_bytes, 320);  // the result's: the snapshots name no peak
  EXPECT_EQ(row.last_step.at("step"), 1);
  EXPECT_EQ(row.last_step.at("loss"), 2.25);
  EXPECT_EQ(row.peak_snapshot.at("allocated_bytes"), 300);
  EXPECT_EQ(row.peak_snapshot.at("step"), 0);
  EXPECT_EQ(row.peak_snapshot.at("phase"), "phase1_after_fwd");
  EXPECT_EQ(row.peak_snapshot.at("params_bytes"), 10);

  std::vector<std::string> phases;
  for (const auto& [phase, snapshot] : row.phase_peaks) {
    phases.push_back(phase + ":" + std::to_string(snapshot.at("allocated_bytes").get<int64_t>()) +
                     "@" + std::to_string(snapshot.at("step").get<int64_t>()));
  }
  EXPECT_THAT(phases, ElementsAre("phase0_before_fwd:150@1", "phase1_after_fwd:300@0",
                                  "phase2_after_bwd:260@1", "phase3_after_opt_step:200@0"));

  const TrialReport& idle = report->trials[1];
  EXPECT_EQ(idle.name, "never-ran");
  EXPECT_EQ(idle.state, TrialState::kQueued);
  EXPECT_EQ(idle.attempt, 0);
  EXPECT_FALSE(idle.tokens_per_second.has_value());
  EXPECT_FALSE(idle.peak_bytes.has_value());
  EXPECT_TRUE(idle.peak_snapshot.is_null());
  EXPECT_TRUE(idle.phase_peaks.empty());

  EXPECT_EQ(store->Report(987654).status().code(), StatusCode::kNotFound);
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

// A snapshot event with every memory category, as llm-train writes it.
json FullSnapshot(int64_t step, int64_t micro_batch, const std::string& phase, int64_t allocated,
                  int64_t peak) {
  return {{"type", "snapshot"},
          {"step", step},
          {"micro_batch", micro_batch},
          {"phase", phase},
          {"params_bytes", 4000},
          {"grads_bytes", step == 0 && phase == "phase0_before_fwd" ? 0 : 4000},
          {"optim_device_bytes", 8004},
          {"optim_host_bytes", 0},
          {"other_bytes", allocated - 16004},
          {"allocated_bytes", allocated},
          {"peak_bytes", peak},
          {"reserved_bytes", allocated}};
}

// An experiment with one trial of each kind the report tells apart: ok after a lost attempt, out
// of memory, failed without a result, and never started. Returns its id.
int64_t StoreLabExperiment(Store& store) {
  NewExperiment input = MakeExperiment("lab", {"ok-run", "oom-run", "failed-run", "never-ran"});
  input.trials[0].expect = "ok";
  input.trials[1].expect = "oom";
  const int64_t experiment = *store.CreateExperiment(input, kNow);
  const std::vector<TrialRecord> trials = *store.ListTrials(experiment);

  const int64_t ok = trials[0].id;
  EXPECT_EQ(*store.StartAttempt(ok, "lost-node", kNow), 1);
  EXPECT_TRUE(store
                  .AppendEvents(ok, 1,
                                std::vector<Event>{MakeEvent(
                                    1, FullSnapshot(0, 0, "phase1_after_fwd", 99'999, 99'999))})
                  .ok());
  EXPECT_TRUE(store.MarkAttemptLost(ok, 1, kNow).ok());
  EXPECT_EQ(*store.StartAttempt(ok, "cpu-1", kNow), 2);
  EXPECT_TRUE(
      store
          .AppendEvents(
              ok, 2,
              std::vector<Event>{
                  MakeEvent(1, {{"type", "start"}, {"total_steps", 2}, {"load_peak_bytes", 5000}}),
                  MakeEvent(2, FullSnapshot(0, 0, "phase0_before_fwd", 20'000, 21'000)),
                  MakeEvent(3, FullSnapshot(0, 0, "phase1_after_fwd", 30'000, 31'000)),
                  MakeEvent(4, FullSnapshot(0, 0, "phase2_after_bwd", 25'000, 33'000)),
                  MakeEvent(5, FullSnapshot(0, 0, "phase3_after_opt_step", 24'000, 34'000)),
                  MakeEvent(6, {{"type", "step"},
                                {"step", 0},
                                {"loss", 10.5},
                                {"lr", 0.001},
                                {"tokens", 128},
                                {"seconds", 0.25},
                                {"allocated_bytes", 24'000},
                                {"peak_bytes", 34'000}}),
                  MakeEvent(7, FullSnapshot(1, 0, "phase1_after_fwd", 30'000, 34'000)),
                  MakeEvent(8, {{"type", "step"},
                                {"step", 1},
                                {"loss", 9.75},
                                {"lr", 0.0005},
                                {"tokens", 120},
                                {"seconds", 0.5},
                                {"allocated_bytes", 24'000},
                                {"peak_bytes", 34'000}}),
                  MakeEvent(9, {{"type", "result"},
                                {"outcome", "ok"},
                                {"train_seconds", 0.75},
                                {"tokens_per_second", 330.0},
                                {"peak_bytes", 34'500},
                                {"final_loss", 9.75},
                                {"error", ""}}),
              })
          .ok());
  EXPECT_TRUE(store.FinishAttempt(ok, 2, TrialState::kOk, 0, "", kNow).ok());

  const int64_t oom = trials[1].id;
  EXPECT_EQ(*store.StartAttempt(oom, "cpu-1", kNow), 1);
  EXPECT_TRUE(
      store
          .AppendEvents(oom, 1,
                        std::vector<Event>{
                            MakeEvent(1, {{"type", "start"}, {"load_peak_bytes", 6000}}),
                            MakeEvent(2, FullSnapshot(0, 0, "phase0_before_fwd", 40'000, 40'000)),
                            MakeEvent(3, FullSnapshot(0, -1, "oom", 60'000, 61'000)),
                            MakeEvent(4, {{"type", "result"},
                                          {"outcome", "oom"},
                                          {"train_seconds", 0.0},
                                          {"tokens_per_second", 0.0},
                                          {"peak_bytes", 61'000},
                                          {"final_loss", nullptr},
                                          {"error", "out of memory: 2 MiB more"}}),
                        })
          .ok());
  EXPECT_TRUE(store.FinishAttempt(oom, 1, TrialState::kOom, 3, "", kNow).ok());

  const int64_t failed = trials[2].id;
  EXPECT_EQ(*store.StartAttempt(failed, "cpu-1", kNow), 1);
  EXPECT_TRUE(store.AppendEvents(failed, 1, std::vector<Event>{StepEvent(1, 0, 3.5)}).ok());
  EXPECT_TRUE(store
                  .FinishAttempt(failed, 1, TrialState::kFailed, -9,
                                 "killed by the kernel (host memory)", kNow)
                  .ok());
  return experiment;
}

// The rows of a query as JSON objects (column name → value), through a connection of the test's
// own, as the sqlite3 shell would read them.
std::vector<json> QueryRows(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sql << ": " << sqlite3_errmsg(db);
  std::vector<json> rows;
  int rc = SQLITE_DONE;
  while (stmt != nullptr && (rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    json& row = rows.emplace_back(json::object());
    for (int i = 0; i < sqlite3_column_count(stmt); ++i) {
      json& cell = row[sqlite3_column_name(stmt, i)];
      switch (sqlite3_column_type(stmt, i)) {
        case SQLITE_INTEGER:
          cell = sqlite3_column_int64(stmt, i);
          break;
        case SQLITE_FLOAT:
          cell = sqlite3_column_double(stmt, i);
          break;
        case SQLITE_TEXT:
          cell = reinterpret_cast<const char*>(sqlite3_column_text(stmt, i));
          break;
        default:
          cell = nullptr;
      }
    }
  }
  if (stmt != nullptr) {
    EXPECT_EQ(rc, SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return rows;
}

// What a view's column should hold for a figure the report has or lacks.
template <typename T>
json Cell(const std::optional<T>& value) {
  return value.has_value() ? json(*value) : json(nullptr);
}

json SnapshotCell(const json& snapshot, const char* key) {
  return snapshot.is_object() ? snapshot.at(key) : json(nullptr);
}

TEST_F(StoreTest, TrialResultsViewHoldsTheReportsFigures) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const int64_t experiment = StoreLabExperiment(*store);
  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::vector<json> rows = QueryRows(
      path_, "SELECT * FROM trial_results WHERE experiment_id = " + std::to_string(experiment));
  ASSERT_EQ(rows.size(), report->trials.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    const TrialReport& trial = report->trials[i];
    SCOPED_TRACE(trial.name);
    EXPECT_EQ(row["experiment"], "lab");
    EXPECT_EQ(row["trial"], trial.name);
    EXPECT_EQ(row["ordinal"], static_cast<int64_t>(i));
    EXPECT_EQ(row["attempt"], trial.attempt == 0 ? json(nullptr) : json(trial.attempt));
    EXPECT_EQ(row["node"], trial.node.empty() ? json(nullptr) : json(trial.node));
    EXPECT_EQ(row["outcome"], TrialStateName(trial.state));
    EXPECT_EQ(row["expected"], Cell(trial.expect));
    EXPECT_EQ(row["exit_code"], Cell(trial.exit_code));
    EXPECT_EQ(row["error"], trial.error.empty() ? json(nullptr) : json(trial.error));
    EXPECT_EQ(row["peak_bytes"], Cell(trial.peak_bytes));
    EXPECT_EQ(row["load_peak_bytes"], Cell(trial.load_peak_bytes));
    EXPECT_EQ(row["tokens_per_second"], Cell(trial.tokens_per_second));
    EXPECT_EQ(row["train_seconds"], Cell(trial.train_seconds));
    EXPECT_EQ(row["final_loss"], Cell(trial.final_loss));
    EXPECT_EQ(row["at_peak_step"], SnapshotCell(trial.peak_snapshot, "step"));
    EXPECT_EQ(row["at_peak_phase"], SnapshotCell(trial.peak_snapshot, "phase"));
    for (const char* category :
         {"params_bytes", "grads_bytes", "optim_device_bytes", "optim_host_bytes", "other_bytes",
          "allocated_bytes", "reserved_bytes"}) {
      EXPECT_EQ(row[category], SnapshotCell(trial.peak_snapshot, category)) << category;
    }
  }
  // The figures themselves, so that the view and the report cannot be wrong together.
  EXPECT_EQ(rows[0]["attempt"], 2);  // the lost attempt's larger snapshot does not count
  EXPECT_EQ(rows[0]["run_attempts"], "2");
  EXPECT_EQ(rows[0]["node"], "cpu-1");
  EXPECT_EQ(rows[0]["peak_bytes"], 34'500);
  EXPECT_EQ(rows[0]["tokens_per_second"], 330.0);
  EXPECT_EQ(rows[0]["final_loss"], 9.75);
  EXPECT_EQ(rows[0]["at_peak_step"], 0);  // step 1's snapshot only ties it
  EXPECT_EQ(rows[0]["at_peak_phase"], "phase1_after_fwd");
  EXPECT_EQ(rows[0]["other_bytes"], 30'000 - 16'004);
  EXPECT_EQ(rows[1]["outcome"], "oom");
  EXPECT_EQ(rows[1]["at_peak_phase"], "oom");
  EXPECT_EQ(rows[1]["error"], "out of memory: 2 MiB more");
  EXPECT_EQ(rows[1]["final_loss"], nullptr);
  EXPECT_EQ(rows[2]["error"], "killed by the kernel (host memory)");
  EXPECT_EQ(rows[2]["peak_bytes"], nullptr);
  EXPECT_EQ(rows[3]["outcome"], "queued");
  EXPECT_EQ(rows[3]["attempt"], nullptr);

  // Per phase: the report's per-phase rows, in the step anatomy's order.
  const std::vector<json> phases =
      QueryRows(path_,
                "SELECT trial, phase, step, allocated_bytes FROM trial_phase_peaks WHERE "
                "experiment_id = " +
                    std::to_string(experiment));
  std::vector<json> expected;
  for (const TrialReport& trial : report->trials) {
    for (const auto& [phase, snapshot] : trial.phase_peaks) {
      expected.push_back({{"trial", trial.name},
                          {"phase", phase},
                          {"step", snapshot.at("step")},
                          {"allocated_bytes", snapshot.at("allocated_bytes")}});
    }
  }
  EXPECT_EQ(phases, expected);
  ASSERT_EQ(phases.size(), 6u);
  EXPECT_EQ(phases[1]["phase"], "phase1_after_fwd");
  EXPECT_EQ(phases[1]["step"], 0);
  EXPECT_EQ(phases[5]["phase"], "oom");

  // Steps: the final attempts' step events.
  const std::vector<json> steps =
      QueryRows(path_,
                "SELECT trial, attempt, step, loss, tokens, seconds FROM trial_steps WHERE "
                "experiment_id = " +
                    std::to_string(experiment));
  EXPECT_EQ(steps, (std::vector<json>{
                       {{"trial", "ok-run"},
                        {"attempt", 2},
                        {"step", 0},
                        {"loss", 10.5},
                        {"tokens", 128},
                        {"seconds", 0.25}},
                       {{"trial", "ok-run"},
                        {"attempt", 2},
                        {"step", 1},
                        {"loss", 9.75},
                        {"tokens", 120},
                        {"seconds", 0.5}},
                       {{"trial", "failed-run"},
                        {"attempt", 1},
                        {"step", 0},
                        {"loss", 3.5},
                        {"tokens", nullptr},
                        {"seconds", nullptr}},
                   }));
}

// The README's "The results in SQL" shows `sqlite3 PATH 'QUERY'` lines (wherever the docs keep
// it: README.md or docs/*.md): each query runs against a database the store wrote, and the path is
// the embedded controller's.
TEST_F(StoreTest, TheDocsSqlExamplesRun) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  StoreLabExperiment(*store);
  const char* source_dir = std::getenv("LLMCTL_SOURCE_DIR");
  const std::filesystem::path source = source_dir != nullptr ? source_dir : ".";
  ASSERT_TRUE(std::filesystem::exists(source / "README.md")) << "README.md not found";
  std::vector<std::filesystem::path> docs = {source / "README.md"};
  for (const auto& entry : std::filesystem::directory_iterator(source / "docs")) {
    if (entry.path().extension() == ".md") docs.push_back(entry.path());
  }
  int examples = 0;
  for (const std::filesystem::path& doc : docs) {
    std::ifstream in(doc);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.starts_with("sqlite3 ")) continue;
      SCOPED_TRACE(doc.string() + ": " + line);
      ++examples;
      EXPECT_NE(line.find(" ~/.local/share/llmctl/llmctl.db "), std::string::npos)
          << "not the embedded controller's database";
      const size_t open = line.find_first_of("'\"");
      ASSERT_NE(open, std::string::npos);
      const size_t close = line.rfind(line[open]);
      ASSERT_GT(close, open);
      const std::string sql = line.substr(open + 1, close - open - 1);
      EXPECT_FALSE(QueryRows(path_, sql).empty()) << sql;
    }
  }
  EXPECT_GE(examples, 2);
}

json ResultEvent(const std::string& outcome, double train_seconds, double tokens_per_second,
                 int64_t peak, json final_loss, json checkpoint = nullptr) {
  json result = {{"type", "result"},
                 {"outcome", outcome},
                 {"train_seconds", train_seconds},
                 {"tokens_per_second", tokens_per_second},
                 {"peak_bytes", peak},
                 {"final_loss", std::move(final_loss)},
                 {"error", outcome == "cancelled" ? "cancelled at step 3" : ""}};
  if (!checkpoint.is_null()) result["checkpoint"] = std::move(checkpoint);
  return result;
}

TEST_F(StoreTest, AResumedTrialRunsFromItsCheckpointAndItsRunJoinsTheAttempts) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewExperiment input = MakeExperiment("resume", {"long"});
  input.trials[0].expect = "ok";
  const int64_t experiment = *store->CreateExperiment(input, kNow);
  const int64_t trial = store->ListTrials(experiment)->at(0).id;
  const std::string checkpoint = "/agent/runs/1/long/1/output/checkpoints/step-3";
  const json checkpoint_event = {{"step", 2}, {"path", checkpoint}};

  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 1);
  EXPECT_THAT(store->ResumeTrial(trial).status().message(),
              HasSubstr("'long' is running; only a trial that has ended can be resumed"));
  // Stopped after 4 steps with a checkpoint of 3 (an older one: writing the stop's failed), so step
  // 3 (from 0) is run again by the continuation.
  std::vector<Event> first = {
      MakeEvent(1, {{"type", "start"}, {"total_steps", 6}, {"load_peak_bytes", 90}}),
      MakeEvent(2, FullSnapshot(0, 0, "phase1_after_fwd", 30'000, 30'000)),
      MakeEvent(3, FullSnapshot(0, 0, "phase3_after_opt_step", 24'000, 31'000)),
  };
  for (int step = 0; step < 4; ++step) {
    first.push_back(MakeEvent(4 + step, {{"type", "step"},
                                         {"step", step},
                                         {"loss", 6.0 - step},
                                         {"tokens", 100},
                                         {"seconds", 1.0}}));
  }
  first.push_back(
      MakeEvent(8, ResultEvent("cancelled", 3.0, 100.0, 35'000, 3.0, checkpoint_event)));
  ASSERT_TRUE(store->AppendEvents(trial, 1, first).ok());
  ASSERT_TRUE(store->CancelTrial(trial).ok());  // a cancel request, as `cancel --checkpoint` makes
  ASSERT_TRUE(store->FinishAttempt(trial, 1, TrialState::kCancelled, 5, "", kNow).ok());
  ASSERT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kDone);

  StatusOr<TrialResume> resume = store->ResumeTrial(trial);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  const TrialResume expected{
      .attempt = 1, .node = "n1", .checkpoint = checkpoint, .step = 3, .tree = ""};
  EXPECT_EQ(*resume, expected);
  StatusOr<TrialRecord> record = store->GetTrial(trial);
  EXPECT_EQ(record->state, TrialState::kQueued);
  EXPECT_FALSE(record->cancel_requested);
  EXPECT_EQ(record->resume, expected);
  EXPECT_EQ(store->GetExperiment(experiment)->state, ExperimentState::kActive);

  // The continuation is lost (its cancel request was cleared: it is queued again, not cancelled),
  // and the next one starts from the same checkpoint.
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 2);
  ASSERT_TRUE(store->AppendEvents(trial, 2, std::vector<Event>{StepEvent(1, 3, 99.0)}).ok());
  ASSERT_TRUE(store->MarkAttemptLost(trial, 2, kNow).ok());
  EXPECT_EQ(store->GetTrial(trial)->state, TrialState::kQueued);
  ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 3);
  EXPECT_EQ(
      QueryInt("SELECT SUM(first_step) FROM attempts WHERE trial_id = " + std::to_string(trial)),
      6);  // 0 + 3 + 3
  std::vector<Event> third = {
      MakeEvent(1, {{"type", "start"}, {"total_steps", 6}, {"load_peak_bytes", 80}}),
      MakeEvent(2, FullSnapshot(4, 0, "phase1_after_fwd", 30'000, 30'000)),  // ties attempt 1's
      MakeEvent(3, FullSnapshot(4, 0, "phase3_after_opt_step", 26'000, 30'000)),
  };
  for (int step = 3; step < 6; ++step) {
    third.push_back(MakeEvent(1 + static_cast<int64_t>(third.size()), {{"type", "step"},
                                                                       {"step", step},
                                                                       {"loss", 6.0 - step},
                                                                       {"tokens", 100},
                                                                       {"seconds", 0.5}}));
  }
  third.push_back(MakeEvent(1 + static_cast<int64_t>(third.size()),
                            ResultEvent("ok", 1.5, 200.0, 32'000, 1.0, checkpoint_event)));
  ASSERT_TRUE(store->AppendEvents(trial, 3, third).ok());
  ASSERT_TRUE(store->FinishAttempt(trial, 3, TrialState::kOk, 0, "", kNow).ok());

  StatusOr<ExperimentReport> report = store->Report(experiment);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const TrialReport& row = report->trials[0];
  EXPECT_EQ(row.state, TrialState::kOk);
  EXPECT_EQ(row.attempt, 3);
  EXPECT_THAT(row.run_attempts, ElementsAre(1, 3));
  EXPECT_EQ(row.train_seconds, 4.5);
  EXPECT_DOUBLE_EQ(*row.tokens_per_second, (300.0 + 300.0) / 4.5);
  EXPECT_EQ(row.peak_bytes, 35'000);  // attempt 1's result
  EXPECT_EQ(row.final_loss, 1.0);
  EXPECT_EQ(row.load_peak_bytes, 80);  // the final attempt's start
  EXPECT_EQ(row.error, "");
  EXPECT_EQ(row.start.at("load_peak_bytes"), 80);
  EXPECT_EQ(row.peak_snapshot.at("step"), 0) << "a tie goes to the earlier attempt";
  std::vector<std::string> phases;
  for (const auto& [phase, snapshot] : row.phase_peaks) {
    phases.push_back(phase + "@" + std::to_string(snapshot.at("step").get<int64_t>()));
  }
  EXPECT_THAT(phases, ElementsAre("phase1_after_fwd@0", "phase3_after_opt_step@4"));
  // Memory over time: the run's attempts, each with every snapshot it took (the lost one none).
  ASSERT_EQ(row.memory_timeline.size(), 2u);
  EXPECT_EQ(row.memory_timeline[0].attempt, 1);
  EXPECT_THAT(row.memory_timeline[0].snapshots,
              ElementsAre(json::parse(first[1].json), json::parse(first[2].json)));
  EXPECT_EQ(row.memory_timeline[1].attempt, 3);
  EXPECT_THAT(row.memory_timeline[1].snapshots,
              ElementsAre(json::parse(third[1].json), json::parse(third[2].json)));
  EXPECT_EQ(row.memory_timeline[1].started_unix_ms, std::nullopt) << "a start without the field";

  StatusOr<std::vector<TrialStep>> steps = store->RunSteps(experiment);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  std::vector<std::string> run;
  for (const TrialStep& step : *steps) {
    run.push_back(std::to_string(step.attempt) + ":" + std::to_string(step.step) + "=" +
                  std::to_string(static_cast<int>(step.loss.value_or(-1))));
  }
  // Attempt 1 up to its checkpoint (its step 3 was run again), the lost attempt 2 not at all.
  EXPECT_THAT(run, ElementsAre("1:0=6", "1:1=5", "1:2=4", "3:3=3", "3:4=2", "3:5=1"));
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trial_steps"), 6);
  EXPECT_EQ(QueryInt("SELECT train_seconds * 10 FROM trial_results"), 45);

  EXPECT_THAT(store->ResumeTrial(trial).status().message(),
              HasSubstr("'long' ended ok: there is nothing left to run"));
  EXPECT_EQ(store->RunSteps(987654).status().code(), StatusCode::kNotFound);
}

// The trial_memory_timeline view: each attempt's snapshots in order beside its start's wall clock
// and device limit; an attempt without snapshots is listed all the same.
TEST_F(StoreTest, MemoryTimelineHoldsEachAttemptsSnapshotsAndItsStart) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> trials =
      CreateTrials(*store, "timeline", {"fits", "load-oom", "queued"});
  ASSERT_EQ(trials.size(), 3u);
  ASSERT_EQ(*store->StartAttempt(trials[0], "n1", kNow), 1);
  json early = FullSnapshot(0, 0, "phase0_before_fwd", 20'000, 20'000);
  early["elapsed_ms"] = 812.125;
  json late = FullSnapshot(0, 0, "phase1_after_fwd", 30'000, 30'000);
  late["elapsed_ms"] = 1'020.5;
  json oom = FullSnapshot(0, -1, "oom", 40'000, 40'000);
  oom["elapsed_ms"] = 1'100;
  ASSERT_TRUE(
      store
          ->AppendEvents(
              trials[0], 1,
              std::vector<Event>{
                  MakeEvent(1, {{"type", "start"},
                                {"started_unix_ms", 1'700'000'000'123},
                                {"device_limit_bytes", 226'492'416}}),
                  MakeEvent(2, early), StepEvent(3, 0), MakeEvent(4, late), MakeEvent(5, oom),
                  MakeEvent(6, {{"type", "result"}, {"outcome", "oom"}, {"elapsed_ms", 1'234.5}})})
          .ok());
  ASSERT_EQ(*store->StartAttempt(trials[1], "n1", kNow), 1);  // no start event, no snapshot

  StatusOr<ExperimentReport> report = store->Report(store->ListExperiments()->back().id);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::vector<AttemptMemory>& fits = report->trials[0].memory_timeline;
  ASSERT_EQ(fits.size(), 1u);
  EXPECT_EQ(fits[0].attempt, 1);
  EXPECT_EQ(fits[0].started_unix_ms, 1'700'000'000'123);
  EXPECT_EQ(fits[0].device_limit_bytes, 226'492'416);
  EXPECT_THAT(fits[0].snapshots, ElementsAre(early, late, oom));
  EXPECT_EQ(fits[0].ended_elapsed_ms, 1'234.5);
  const std::vector<AttemptMemory>& load_oom = report->trials[1].memory_timeline;
  ASSERT_EQ(load_oom.size(), 1u);
  EXPECT_EQ(load_oom[0].started_unix_ms, std::nullopt);
  EXPECT_EQ(load_oom[0].device_limit_bytes, std::nullopt);
  EXPECT_TRUE(load_oom[0].snapshots.empty());
  EXPECT_EQ(load_oom[0].ended_elapsed_ms, std::nullopt);
  EXPECT_TRUE(report->trials[2].memory_timeline.empty()) << "never started";
  // What sqlite3 users read: the times and bytes as columns.
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM trial_memory_timeline WHERE trial = 'fits'"), 3);
  EXPECT_EQ(QueryInt("SELECT SUM(elapsed_ms * 1000) FROM trial_memory_timeline"), 2'932'625);
  EXPECT_EQ(QueryInt("SELECT allocated_bytes FROM trial_memory_timeline WHERE phase = 'oom'"),
            40'000);
}

// Data parallelism's memory: DDP's gradient buckets and the ranks' sum slots (comm_bytes), FSDP's
// gathered full parameters (gathered_bytes), next to the other categories; NULL, as any category
// is, in a snapshot from before the trainer measured them.
TEST_F(StoreTest, TheViewsHaveTheDataParallelCategories) {
  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::vector<int64_t> trials = CreateTrials(*store, "dist", {"ddp", "fsdp", "older"});
  ASSERT_EQ(trials.size(), 3u);
  json ddp = FullSnapshot(0, 0, "phase2_after_bwd", 30'000, 30'000);
  ddp["comm_bytes"] = 4'000;
  ddp["gathered_bytes"] = 0;
  ddp["other_bytes"] = 30'000 - 16'004 - 4'000;
  json fsdp = FullSnapshot(0, 0, "phase1_after_fwd", 25'000, 25'000);
  fsdp["comm_bytes"] = 1'500;
  fsdp["gathered_bytes"] = 8'000;
  fsdp["other_bytes"] = 25'000 - 16'004 - 9'500;
  const json older = FullSnapshot(0, 0, "phase1_after_fwd", 20'000, 20'000);
  for (const auto& [trial, snapshot] : {std::pair{trials[0], ddp}, std::pair{trials[1], fsdp},
                                        std::pair{trials[2], older}}) {
    ASSERT_EQ(*store->StartAttempt(trial, "n1", kNow), 1);
    ASSERT_TRUE(store->AppendEvents(trial, 1, std::vector<Event>{MakeEvent(1, snapshot)}).ok());
  }

  const std::vector<json> expected = {
      {{"trial", "ddp"}, {"comm_bytes", 4'000}, {"gathered_bytes", 0}, {"other_bytes", 9'996}},
      {{"trial", "fsdp"}, {"comm_bytes", 1'500}, {"gathered_bytes", 8'000}, {"other_bytes", -504}},
      {{"trial", "older"},
       {"comm_bytes", nullptr},
       {"gathered_bytes", nullptr},
       {"other_bytes", 3'996}}};
  EXPECT_EQ(QueryRows(path_, "SELECT trial, comm_bytes, gathered_bytes, other_bytes "
                             "FROM trial_results ORDER BY ordinal"),
            expected);
  EXPECT_EQ(QueryRows(path_, "SELECT trial, comm_bytes, gathered_bytes, other_bytes "
                             "FROM trial_phase_peaks ORDER BY trial_id, phase_order"),
            expected);
  // Placed with the other byte categories, before other_bytes.
  for (const char* view : {"trial_results", "trial_phase_peaks"}) {
    const std::vector<json> columns =
        QueryRows(path_, std::string("SELECT group_concat(name, ',') AS names FROM "
                                     "pragma_table_info('") +
                             view + "')");
    ASSERT_EQ(columns.size(), 1u);
    EXPECT_THAT(columns[0]["names"].get<std::string>(),
                HasSubstr("optim_host_bytes,comm_bytes,gathered_bytes,other_bytes,"))
        << view;
  }
}

TEST_F(StoreTest, MigratingFromVersion8KeepsTheRowsAndRecreatesTheViews) {
  // A database at schema version 8, its two report views as they were then (stand-ins without the
  // data-parallel categories), with a trial that has a snapshot.
  std::filesystem::create_directories(dir_ / "data");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  std::string sql;
  for (size_t i = 0; i < 8; ++i) sql += std::string(Migrations()[i]);
  sql +=
      "DROP VIEW trial_results; DROP VIEW trial_phase_peaks;"
      "CREATE VIEW trial_results AS SELECT id AS trial_id, name AS trial FROM trials;"
      "CREATE VIEW trial_phase_peaks AS SELECT id AS trial_id, name AS trial FROM trials;"
      "INSERT INTO experiments VALUES (1, 'old', 'old.yaml', 'model: tiny', '', '{}', 0, "
      "'active');"
      "INSERT INTO trials (id, experiment_id, ordinal, name, description, config_json, "
      "device_type, device_count, state, current_attempt) VALUES "
      "(1, 1, 0, 'a', '', '{}', 'cpu', 2, 'running', 1);"
      "INSERT INTO attempts (trial_id, attempt, node, state, started_at) VALUES "
      "(1, 1, 'n1', 'running', 0);"
      "INSERT INTO events VALUES (1, 1, 1, 'snapshot', '{\"type\":\"snapshot\",\"step\":0,"
      "\"phase\":\"phase2_after_bwd\",\"comm_bytes\":4000,\"gathered_bytes\":0,"
      "\"allocated_bytes\":9000}');"
      "PRAGMA user_version = 8;";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);

  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int64_t>(Migrations().size()));
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM events"), 1);
  EXPECT_EQ(QueryInt("SELECT COUNT(*) FROM attempts WHERE node = 'n1'"), 1);
  const json expected = {{"trial", "a"},
                         {"allocated_bytes", 9'000},
                         {"comm_bytes", 4'000},
                         {"gathered_bytes", 0}};
  EXPECT_EQ(QueryRows(path_,
                      "SELECT trial, allocated_bytes, comm_bytes, gathered_bytes FROM trial_results"),
            std::vector<json>{expected});
  EXPECT_EQ(QueryRows(path_,
                      "SELECT trial, allocated_bytes, comm_bytes, gathered_bytes FROM "
                      "trial_phase_peaks"),
            std::vector<json>{expected});
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
