// A thin RAII layer over the SQLite C API for the store: statements with typed binds and columns,
// transactions that roll back unless committed, and one mapping from SQLite result codes to Status
// codes. Internal to controller/store/; the store's public header knows nothing of SQLite.
#ifndef LLMCTL_CONTROLLER_STORE_SQLITE_H_
#define LLMCTL_CONTROLLER_STORE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl::store::sqlite {

// The Status for SQLite result code `rc` on `db`, "what: sqlite's message". Busy or locked →
// Unavailable (the same call may succeed later); a UNIQUE or PRIMARY KEY conflict → AlreadyExists;
// other constraints → InvalidArgument; a corrupt file or one that is no database → DataLoss; a
// full disk → ResourceExhausted; a file that cannot be opened, read or written (CANTOPEN,
// READONLY, PERM, IOERR: a storage failure) and anything else → Internal. Never
// FailedPrecondition, which the store keeps for its own refusals (store::IsFence). A file's error
// (full, I/O, cannot open, read only, no permission) names the database file and the system's
// reason: "... database or disk is full (/x/llmctl.db: No space left on device)".
Status Error(sqlite3* db, int rc, std::string_view what);

// Runs one or more statements that return no rows.
Status Exec(sqlite3* db, std::string_view sql);

// Closes `db` (sqlite3_close_v2) after finalizing the statements kept for reuse on it: the one way
// the store closes a connection it prepared Statements on.
void Close(sqlite3* db);

// A prepared statement. Binds are 1-based (as in SQLite), columns 0-based. Bind errors are kept
// and returned by the next Step/Run, so call sites stay flat. Statements are kept for reuse per
// connection and SQL text: Prepare takes a kept one when there is one, and the destructor resets
// it and keeps it (at most kMaxKeptStatements a connection, else it is finalized). The store runs
// the same few dozen statements for every event line it ingests and every status a watcher
// rebuilds, and compiling them was a quarter of the controller's CPU on a CPU node (11-30).
inline constexpr size_t kMaxKeptStatements = 256;

class Statement {
 public:
  static StatusOr<Statement> Prepare(sqlite3* db, std::string_view sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) = delete;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, std::string_view value);
  // nullopt binds NULL.
  Statement& BindOptional(int index, const std::optional<std::string>& value);
  Statement& BindOptional(int index, const std::optional<int64_t>& value);
  Statement& BindOptional(int index, const std::optional<double>& value);

  // Advances to the next row: true when there is one, false when done.
  StatusOr<bool> Step();
  // Steps a statement that returns no rows to completion.
  Status Run();
  // Makes the statement ready to run again with new binds.
  void Reset();

  bool IsNull(int column) const;
  int64_t Int(int column) const;
  std::string Text(int column) const;  // NULL reads as ""
  std::optional<std::string> OptionalText(int column) const;
  std::optional<int64_t> OptionalInt(int column) const;
  // nullopt unless the column holds a number (NULL, or text that json_extract found in a field
  // that should have been a number).
  std::optional<double> OptionalNumber(int column) const;

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt, std::string sql)
      : db_(db), stmt_(stmt), sql_(std::move(sql)) {}
  void KeepBindError(int rc);

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string sql_;  // the text it is kept under
  int bind_error_ = SQLITE_OK;
};

// Begin: BEGIN IMMEDIATE, for writes; BeginRead: BEGIN DEFERRED. ROLLBACK on destruction unless
// Commit() succeeded. IMMEDIATE takes the write lock up front: a deferred transaction that reads
// and then writes can fail with SQLITE_BUSY at once, without waiting for the busy timeout, when
// another connection wrote in between.
class Transaction {
 public:
  static StatusOr<Transaction> Begin(sqlite3* db);
  // A deferred (read) transaction: its statements see one snapshot of the database.
  static StatusOr<Transaction> BeginRead(sqlite3* db);
  ~Transaction();
  Transaction(Transaction&& other) noexcept : db_(other.db_) { other.db_ = nullptr; }
  Transaction& operator=(Transaction&&) = delete;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  Status Commit();

 private:
  explicit Transaction(sqlite3* db) : db_(db) {}
  sqlite3* db_;  // null once committed or moved from
};

}  // namespace llmctl::store::sqlite

#endif  // LLMCTL_CONTROLLER_STORE_SQLITE_H_
