// The store's database file: created private, opened with the connection's settings (busy timeout,
// foreign keys, write-ahead log) and migrated to this build's schema, or opened read only.
#include "controller/store/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <span>

#include "common/errno_status.h"
#include "common/files.h"
#include "controller/store/schema.h"
#include "controller/store/sqlite.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using sqlite::Statement;
using sqlite::Transaction;

constexpr int kBusyTimeoutMs = 5000;

using internal::Quoted;

// The database's directory, made 0700 when missing (the database holds the user's experiments and
// the names of their secrets). One that is there is never narrowed, and refused when another user
// may write it: they could put a write-ahead log or journal there that SQLite would take as the
// database's own, or replace the file. Others may read it: the database file itself is 0600.
Status EnsureDatabaseDirectory(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  if (parent.empty()) return Status::Ok();
  return EnsureOwnDirectory(parent, 0700, OthersMay::kRead);
}

// Creates the database file with mode 0600 before SQLite opens it (SQLite would create it with
// 0644 less the umask) and narrows an existing one. SQLite gives its -wal and -shm files the mode
// of the database file.
Status CreatePrivateFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, "cannot open " + path);
  struct stat info {};
  Status status;
  if (::fstat(fd, &info) != 0) {
    status = ErrnoStatus(errno, "cannot stat " + path);
  } else if (!S_ISREG(info.st_mode)) {
    status = FailedPreconditionError(path + " is not a regular file");
  } else if ((info.st_mode & 0777) != 0600 && ::fchmod(fd, 0600) != 0) {
    status = ErrnoStatus(errno, "cannot make " + path + " private (mode 0600)");
  }
  ::close(fd);
  return status;
}

StatusOr<int64_t> ReadUserVersion(sqlite3* db) {
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db, "PRAGMA user_version"));
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return InternalError("PRAGMA user_version returned no row");
  return stmt.Int(0);
}

// Applies the migrations the database lacks, all in one transaction, so that two processes opening
// a fresh file at once migrate it once.
Status Migrate(sqlite3* db) {
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
  ASSIGN_OR_RETURN(const int64_t version, ReadUserVersion(db));
  const std::span<const std::string_view> migrations = Migrations();
  const auto known = static_cast<int64_t>(migrations.size());
  if (version > known) {
    return FailedPreconditionError("its schema version is " + std::to_string(version) +
                                   " but this llmctld knows versions up to " +
                                   std::to_string(known) +
                                   ": a newer llmctld wrote it; run that version or use another "
                                   "data directory");
  }
  if (version < 0) {
    return DataLossError("its schema version is negative (" + std::to_string(version) + ")");
  }
  for (int64_t next = version; next < known; ++next) {
    const std::string label = "schema migration " + std::to_string(next + 1);
    RETURN_IF_ERROR(sqlite::Exec(db, migrations[static_cast<size_t>(next)]).WithContext(label));
    RETURN_IF_ERROR(
        sqlite::Exec(db, "PRAGMA user_version = " + std::to_string(next + 1)).WithContext(label));
  }
  return txn.Commit();
}

Status Configure(sqlite3* db) {
  sqlite3_extended_result_codes(db, 1);
  const int rc = sqlite3_busy_timeout(db, kBusyTimeoutMs);
  if (rc != SQLITE_OK) return sqlite::Error(db, rc, "setting the busy timeout");
  RETURN_IF_ERROR(sqlite::Exec(db, "PRAGMA foreign_keys = ON"));
  // The first statement that reads the file: a file that is no database fails here.
  ASSIGN_OR_RETURN(Statement journal, Statement::Prepare(db, "PRAGMA journal_mode = WAL"));
  ASSIGN_OR_RETURN(const bool has_row, journal.Step());
  const std::string mode = has_row ? journal.Text(0) : "";
  if (mode != "wal") {
    return FailedPreconditionError("cannot switch to write-ahead logging (journal mode is " +
                                   Quoted(mode) + "); is the file on a network file system?");
  }
  // With a write-ahead log, NORMAL syncs at checkpoints rather than at every commit: a killed
  // process loses nothing and the file never corrupts; a power cut may lose the last commits,
  // which ingestion recovers from anyway (streams resume from LastSeq). FULL cost about 5 ms per
  // transaction here.
  return sqlite::Exec(db, "PRAGMA synchronous = NORMAL");
}

}  // namespace

StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path, int64_t keep_free_bytes) {
  if (path.empty()) return InvalidArgumentError("the store's database path is empty");
  const std::string context = "store " + path;
  RETURN_IF_ERROR(EnsureDatabaseDirectory(path).WithContext(context));
  RETURN_IF_ERROR(CreatePrivateFile(path).WithContext(context));
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  // Owned from here on, so that every error path closes the connection.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  std::unique_ptr<Store> store(new Store(db, dir.empty() ? "." : dir, keep_free_bytes));
  if (rc != SQLITE_OK) return sqlite::Error(db, rc, "opening the database").WithContext(context);
  Status status = Configure(db);
  if (status.ok()) status = Migrate(db);
  if (status.code() == StatusCode::kDataLoss) {
    return DataLossError(context + ": not an SQLite database, or a damaged one (" +
                         status.message() + ")");
  }
  RETURN_IF_ERROR(status.WithContext(context));
  return store;
}

Status Store::CheckRoomForRows(size_t count, std::string_view rows, int64_t trial_id,
                               int64_t attempt, int64_t bytes) const {
  if (dir_.empty()) return Status::Ok();
  return CheckRoomFor(std::to_string(count) + " " + std::string(rows) + " of trial " +
                          std::to_string(trial_id) + " attempt " + std::to_string(attempt),
                      dir_, bytes, keep_free_bytes_);
}

StatusOr<std::unique_ptr<Store>> Store::OpenReadOnly(const std::string& path) {
  const std::string context = "store " + path;
  if (::access(path.c_str(), F_OK) != 0) return NotFoundError(context + ": no such file");
  // SQLite opens whatever the path names and would wait for ever on a FIFO's writer (llmctl
  // estimate hung on one): anything but a regular file is refused first, opened without blocking.
  // A link to a database elsewhere is followed, as SQLite would.
  {
    struct stat info {};
    StatusOr<UniqueFd> regular = OpenRegularFile(path, info);
    if (!regular.ok()) return regular.status().WithContext(context);
  }
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  std::unique_ptr<Store> store(new Store(db));
  if (rc != SQLITE_OK) return sqlite::Error(db, rc, "opening the database").WithContext(context);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  StatusOr<int64_t> version = ReadUserVersion(db);
  if (!version.ok()) {
    return DataLossError(context + ": not an SQLite database, or a damaged one (" +
                         version.status().message() + ")");
  }
  const auto known = static_cast<int64_t>(Migrations().size());
  if (*version != known) {
    // Read by the CLI (llmctl estimate) of an llmctl upgraded or downgraded since llmctld last
    // opened the file: only llmctld migrates it.
    return FailedPreconditionError(
        context + ": its schema version is " + std::to_string(*version) + ", this build's " +
        std::to_string(known) +
        (*version > known ? ": a newer llmctld wrote it; use that llmctl"
                          : ": an earlier llmctld wrote it, and this llmctl's llmctld migrates it "
                            "when it starts (llmctl daemon stop, then llmctl daemon start)"));
  }
  return store;
}

Store::~Store() { sqlite::Close(db_); }

StatusOr<int64_t> Store::SchemaVersion() {
  MutexLock lock(mutex_);
  return ReadUserVersion(db_);
}

}  // namespace llmctl::store
