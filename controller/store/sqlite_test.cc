// The statements kept for reuse: one compiled statement per text and connection, reset and without
// its binds when taken again, at most kMaxKeptStatements kept, and none left after Close; the
// Status each SQLite result code becomes.
#include "controller/store/sqlite.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace llmctl::store::sqlite {
namespace {

// How many statements `db` has compiled and not finalized.
int LiveStatements(sqlite3* db) {
  int count = 0;
  for (sqlite3_stmt* stmt = sqlite3_next_stmt(db, nullptr); stmt != nullptr;
       stmt = sqlite3_next_stmt(db, stmt)) {
    ++count;
  }
  return count;
}

class SqliteTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(sqlite3_open(":memory:", &db_), SQLITE_OK); }
  void TearDown() override { Close(db_); }

  // The one row of `sql` with `value` bound to its parameter, or without a bind.
  std::string SelectOne(const std::string& sql, std::optional<int64_t> value) {
    StatusOr<Statement> stmt = Statement::Prepare(db_, sql);
    EXPECT_TRUE(stmt.ok()) << stmt.status().ToString();
    if (value.has_value()) stmt->Bind(1, *value);
    StatusOr<bool> row = stmt->Step();
    EXPECT_TRUE(row.ok() && *row);
    return stmt->IsNull(0) ? "NULL" : stmt->Text(0);
  }

  sqlite3* db_ = nullptr;
};

TEST_F(SqliteTest, AStatementIsCompiledOnceAndTakenAgainResetWithoutItsBinds) {
  EXPECT_EQ(SelectOne("SELECT ?", 5), "5");
  EXPECT_EQ(LiveStatements(db_), 1);
  EXPECT_EQ(SelectOne("SELECT ?", std::nullopt), "NULL") << "the kept one's bind was cleared";
  EXPECT_EQ(SelectOne("SELECT ?", 7), "7");
  EXPECT_EQ(LiveStatements(db_), 1);
  EXPECT_EQ(SelectOne("SELECT ? + 1", 7), "8");
  EXPECT_EQ(LiveStatements(db_), 2);

  // Two of one text at once: each its own, both kept.
  {
    StatusOr<Statement> first = Statement::Prepare(db_, "SELECT ?");
    StatusOr<Statement> second = Statement::Prepare(db_, "SELECT ?");
    ASSERT_TRUE(first.ok() && second.ok());
    first->Bind(1, int64_t{1});
    second->Bind(1, int64_t{2});
    ASSERT_TRUE(*first->Step());
    ASSERT_TRUE(*second->Step());
    EXPECT_EQ(first->Int(0), 1);
    EXPECT_EQ(second->Int(0), 2);
  }
  EXPECT_EQ(LiveStatements(db_), 3);

  // A statement left mid-rows is reset when kept: a write then is not blocked by its read.
  ASSERT_TRUE(Exec(db_, "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2)").ok());
  {
    StatusOr<Statement> rows = Statement::Prepare(db_, "SELECT x FROM t");
    ASSERT_TRUE(rows.ok());
    ASSERT_TRUE(*rows->Step());
  }
  ASSERT_TRUE(Exec(db_, "DROP TABLE t").ok());
  // A kept statement whose table is gone fails when run (a fresh one fails to compile).
  StatusOr<Statement> gone = Statement::Prepare(db_, "SELECT x FROM t");
  ASSERT_TRUE(gone.ok());
  const StatusOr<bool> row = gone->Step();
  EXPECT_FALSE(row.ok());
  EXPECT_NE(row.status().message().find("no such table: t"), std::string::npos)
      << row.status().message();
}

TEST_F(SqliteTest, AtMostTheLimitIsKeptAConnection) {
  for (size_t i = 0; i < kMaxKeptStatements + 10; ++i) {
    EXPECT_EQ(SelectOne("SELECT " + std::to_string(i), std::nullopt), std::to_string(i));
  }
  EXPECT_EQ(LiveStatements(db_), static_cast<int>(kMaxKeptStatements));
}

// A file that cannot be opened, read or written is a storage failure (Internal), never
// FailedPrecondition, which the store keeps for fenced-off attempts: the event stream gives those
// up and retries the others.
TEST(SqliteErrorTest, AFileThatCannotBeOpenedReadOrWrittenIsInternal) {
  for (const int rc : {SQLITE_CANTOPEN, SQLITE_READONLY, SQLITE_READONLY_DBMOVED, SQLITE_PERM,
                       SQLITE_IOERR, SQLITE_IOERR_WRITE}) {
    EXPECT_EQ(Error(nullptr, rc, "writing").code(), StatusCode::kInternal) << sqlite3_errstr(rc);
  }
  EXPECT_EQ(Error(nullptr, SQLITE_FULL, "writing").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Error(nullptr, SQLITE_BUSY, "writing").code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace llmctl::store::sqlite
