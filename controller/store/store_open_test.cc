// The store's database file: where and how it is opened, what is refused in its place, and its
// schema's versions and migrations.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "controller/store/schema.h"
#include "controller/store/store.h"
#include "controller/store/store_test_support.h"

namespace llmctl::store {
namespace {

using ::testing::HasSubstr;

using namespace test_support;  // NOLINT(build/namespaces): the tests' shared vocabulary

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

// Another user who may write the directory could put a write-ahead log or journal of theirs beside
// the database, which SQLite would take as its own, or replace the file. One that is there is
// never narrowed; one that only lets others read is the user's choice.
TEST_F(StoreTest, ADirectoryOthersMayWriteIsRefusedAndLeftAsItIs) {
  const std::string dir = (dir_ / "data").string();
  ASSERT_TRUE(std::filesystem::create_directories(dir));
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  StatusOr<std::unique_ptr<Store>> refused = Store::Open(path_);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr(dir + ": writable by other users (mode 0777)"));
  EXPECT_EQ(FileMode(dir), 0777u);
  EXPECT_FALSE(std::filesystem::exists(path_));

  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  EXPECT_NE(OpenStore(), nullptr);
  EXPECT_EQ(FileMode(dir), 0755u);
}

// Nor is a link in the directory's place followed to wherever it leads.
TEST_F(StoreTest, ALinkInTheDirectorysPlaceIsRefused) {
  ASSERT_TRUE(std::filesystem::create_directories(dir_ / "elsewhere"));
  std::filesystem::create_directory_symlink(dir_ / "elsewhere", dir_ / "data");
  StatusOr<std::unique_ptr<Store>> refused = Store::Open(path_);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr((dir_ / "data").string() + ": a symbolic link, not a directory"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "elsewhere" / "llmctl.db"));
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

// The CLI reads the store without migrating it (llmctl estimate): a file of another schema is
// refused naming it, both versions and what to do, after an upgrade as after a downgrade.
TEST_F(StoreTest, OpenReadOnlyRefusesAnotherSchemaSayingWhatToDo) {
  ASSERT_NE(OpenStore(), nullptr);
  const std::string known = std::to_string(QueryInt("PRAGMA user_version"));
  const auto set_version = [this](int version) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    const std::string sql = "PRAGMA user_version = " + std::to_string(version);
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  };
  set_version(1);
  Status older = Store::OpenReadOnly(path_).status();
  EXPECT_EQ(older.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(older.message(),
            "store " + path_ + ": its schema version is 1, this build's " + known +
                ": an earlier llmctld wrote it, and this llmctl's llmctld migrates "
                "it when it starts (llmctl daemon stop, then llmctl daemon start)");
  set_version(999);
  Status newer = Store::OpenReadOnly(path_).status();
  EXPECT_EQ(newer.message(), "store " + path_ + ": its schema version is 999, this build's " +
                                 known + ": a newer llmctld wrote it; use that llmctl");
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

// A FIFO in place of the database (llmctl estimate once waited on one for ever) is refused at
// once, naming it, by the read-only opening and by the daemon's. Each opening runs on a thread
// that, should it block after all, is released by opening the FIFO's other end, so the test ends
// either way.
TEST_F(StoreTest, FifoInPlaceOfTheFileIsRefusedWithoutWaiting) {
  std::filesystem::create_directories(dir_ / "data");
  ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0);
  const auto refused_in_time = [&](auto open) {
    std::packaged_task<Status()> task([&] { return open().status(); });
    std::future<Status> result = task.get_future();
    std::thread opener(std::move(task));
    const bool in_time = result.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!in_time) {
      // Blocked on the FIFO: a writer releases the reader (and SQLite then fails on it).
      const int writer = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (writer >= 0) ::close(writer);
    }
    opener.join();
    EXPECT_TRUE(in_time) << "opening a FIFO blocked";
    return result.get();
  };
  const Status read_only = refused_in_time([&] { return Store::OpenReadOnly(path_); });
  EXPECT_EQ(read_only.code(), StatusCode::kInvalidArgument) << read_only.ToString();
  EXPECT_THAT(read_only.message(), HasSubstr(path_));
  EXPECT_THAT(read_only.message(), HasSubstr("not a regular file"));
  const Status read_write = refused_in_time([&] { return Store::Open(path_); });
  EXPECT_FALSE(read_write.ok());
  EXPECT_THAT(read_write.message(), HasSubstr(path_));
  EXPECT_THAT(read_write.message(), HasSubstr("not a regular file"));
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
  const json expected = {
      {"trial", "a"}, {"allocated_bytes", 9'000}, {"comm_bytes", 4'000}, {"gathered_bytes", 0}};
  EXPECT_EQ(
      QueryRows(path_,
                "SELECT trial, allocated_bytes, comm_bytes, gathered_bytes FROM trial_results"),
      std::vector<json>{expected});
  EXPECT_EQ(QueryRows(path_,
                      "SELECT trial, allocated_bytes, comm_bytes, gathered_bytes FROM "
                      "trial_phase_peaks"),
            std::vector<json>{expected});
}

// The llmctld before migration 16 kept the runs of lost attempts in memory only: those of its
// lost attempts that had not ended are kept from the migration on, except on removed nodes, and
// are asked again by the next llmctld.
TEST_F(StoreTest, MigratingFromVersion15KeepsTheLostAttemptsRuns) {
  std::filesystem::create_directories(dir_ / "data");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  std::string sql;
  for (size_t i = 0; i < 15; ++i) sql += std::string(Migrations()[i]);
  sql +=
      "INSERT INTO experiments VALUES (1, 'old', 'old.yaml', 'model: tiny', '', '{}', 0, "
      "'active');"
      "INSERT INTO nodes (name, address, devices_json, last_seen, state, removed_at) VALUES "
      "('n1', 'a', '[]', 0, 'connected', NULL), ('gone', '', '[]', 0, 'removed', 5);"
      "INSERT INTO trials (id, experiment_id, ordinal, name, description, config_json, "
      "device_type, device_count, state, current_attempt) VALUES "
      "(1, 1, 0, 'single', '', '{}', 'cpu', 1, 'running', 2),"
      "(2, 1, 1, 'multi', '', '{}', 'cpu', 1, 'queued', 1),"
      "(3, 1, 2, 'removed', '', '{}', 'cpu', 1, 'queued', 1),"
      "(4, 1, 3, 'ended', '', '{}', 'cpu', 1, 'ok', 1);"
      "INSERT INTO attempts (trial_id, attempt, node, state, started_at, device_indices_json) "
      "VALUES (1, 1, 'n1', 'lost', 0, '[1]'), (1, 2, 'n1', 'running', 0, '[0]'),"
      "(2, 1, 'n1', 'lost', 0, '[2]'), (3, 1, 'gone', 'lost', 0, '[0]'),"
      "(4, 1, 'n1', 'ended', 0, '[3]');"
      "INSERT INTO attempt_nodes (trial_id, attempt, node_rank, node, device_indices_json, "
      "ended_at) VALUES (2, 1, 0, 'n1', '[2]', NULL), (2, 1, 1, 'n2', '[0]', 7);"
      "PRAGMA user_version = 15;";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);

  std::unique_ptr<Store> store = OpenStore();
  ASSERT_NE(store, nullptr);
  StatusOr<std::vector<LostRun>> lost = store->ListLostRuns();
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  ASSERT_EQ(lost->size(), 2u);
  EXPECT_EQ((*lost)[0].trial_name, "single");
  EXPECT_EQ((*lost)[0].attempt.attempt, 1);
  EXPECT_EQ((*lost)[0].attempt.node, "n1");
  EXPECT_EQ((*lost)[0].attempt.device_indices, std::vector<int64_t>{1});
  EXPECT_EQ((*lost)[1].trial_name, "multi");
  EXPECT_EQ((*lost)[1].attempt.node, "n1");
  EXPECT_EQ((*lost)[1].attempt.device_indices, std::vector<int64_t>{2});
}

}  // namespace
}  // namespace llmctl::store
