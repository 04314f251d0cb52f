#include "controller/store/sqlite.h"

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "common/mutex.h"

namespace llmctl::store::sqlite {
namespace {

// The statements kept for reuse, by connection and SQL text; each is out of here while a
// Statement holds it.
class KeptStatements {
 public:
  // A kept statement of `sql` on `db`, taken out; null when none is kept.
  sqlite3_stmt* Take(sqlite3* db, const std::string& sql) LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    auto connection = kept_.find(db);
    if (connection == kept_.end()) return nullptr;
    auto found = connection->second.find(sql);
    if (found == connection->second.end()) return nullptr;
    sqlite3_stmt* stmt = found->second;
    connection->second.erase(found);
    return stmt;
  }
  // Keeps a reset `stmt`, or finalizes it when `db` has kMaxKeptStatements kept.
  void Keep(sqlite3* db, std::string sql, sqlite3_stmt* stmt) LLMCTL_EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);
      std::multimap<std::string, sqlite3_stmt*>& kept = kept_[db];
      if (kept.size() < kMaxKeptStatements) {
        kept.emplace(std::move(sql), stmt);
        return;
      }
    }
    sqlite3_finalize(stmt);
  }
  // Finalizes every statement kept for `db`.
  void Forget(sqlite3* db) LLMCTL_EXCLUDES(mutex_) {
    std::multimap<std::string, sqlite3_stmt*> kept;
    {
      MutexLock lock(mutex_);
      auto connection = kept_.find(db);
      if (connection == kept_.end()) return;
      kept = std::move(connection->second);
      kept_.erase(connection);
    }
    for (const auto& [sql, stmt] : kept) sqlite3_finalize(stmt);
  }

 private:
  Mutex mutex_;
  std::map<sqlite3*, std::multimap<std::string, sqlite3_stmt*>> kept_ LLMCTL_GUARDED_BY(mutex_);
};

KeptStatements& Kept() {
  static KeptStatements* kept = new KeptStatements();  // never destroyed: used until exit
  return *kept;
}

}  // namespace

Status Error(sqlite3* db, int rc, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += db != nullptr && sqlite3_errcode(db) == rc ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  const int primary = rc & 0xff;
  // SQLite's words for a file it could not write ("database or disk is full", "disk I/O error")
  // name no file and no reason: the user has to know which filesystem to free or repair.
  const bool file_error = primary == SQLITE_FULL || primary == SQLITE_IOERR ||
                          primary == SQLITE_CANTOPEN || primary == SQLITE_READONLY ||
                          primary == SQLITE_PERM;
  if (const char* file = db != nullptr ? sqlite3_db_filename(db, "main") : nullptr;
      file_error && file != nullptr && *file != '\0') {
    // SQLite keeps no errno for a full disk (its unix VFS clears it on ENOSPC or a short write),
    // and the store sets no page limit that SQLITE_FULL could mean instead.
    int error = sqlite3_system_errno(db);
    if (error == 0 && primary == SQLITE_FULL) error = ENOSPC;
    message.append(" (").append(file);
    if (error != 0) message.append(": ").append(std::strerror(error));
    message += ")";
  }
  switch (primary) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return UnavailableError(std::move(message));
    case SQLITE_CONSTRAINT:
      if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return AlreadyExistsError(std::move(message));
      }
      return InvalidArgumentError(std::move(message));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return DataLossError(std::move(message));
    case SQLITE_FULL:
      return ResourceExhaustedError(std::move(message));
    // The file could not be opened, read or written (re-permissioned, removed, on a filesystem
    // remounted read-only or failing): a storage failure, which the controller retries once the
    // file is fixed. Never FailedPrecondition: the store keeps that for a fenced-off attempt
    // (store::IsFence), whose stream is never read again.
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_IOERR:
    default:
      return InternalError(std::move(message));
  }
}

Status Exec(sqlite3* db, std::string_view sql) {
  const std::string text(sql);
  const int rc = sqlite3_exec(db, text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return Error(db, rc, "executing SQL");
  return Status::Ok();
}

void Close(sqlite3* db) {
  Kept().Forget(db);
  sqlite3_close_v2(db);
}

StatusOr<Statement> Statement::Prepare(sqlite3* db, std::string_view sql) {
  std::string text(sql);
  if (sqlite3_stmt* kept = Kept().Take(db, text); kept != nullptr) {
    return Statement(db, kept, std::move(text));
  }
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                                    SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return Error(db, rc, "preparing SQL");
  }
  return Statement(db, stmt, std::move(text));
}

Statement::~Statement() {
  if (stmt_ == nullptr) return;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  Kept().Keep(db_, std::move(sql_), stmt_);
}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_),
      stmt_(std::exchange(other.stmt_, nullptr)),
      sql_(std::move(other.sql_)),
      bind_error_(other.bind_error_) {}

void Statement::KeepBindError(int rc) {
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
}

Statement& Statement::Bind(int index, int64_t value) {
  KeepBindError(sqlite3_bind_int64(stmt_, index, value));
  return *this;
}

Statement& Statement::Bind(int index, std::string_view value) {
  KeepBindError(
      sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  return *this;
}

Statement& Statement::BindOptional(int index, const std::optional<std::string>& value) {
  if (!value) {
    KeepBindError(sqlite3_bind_null(stmt_, index));
    return *this;
  }
  return Bind(index, std::string_view(*value));
}

Statement& Statement::BindOptional(int index, const std::optional<int64_t>& value) {
  if (!value) {
    KeepBindError(sqlite3_bind_null(stmt_, index));
    return *this;
  }
  return Bind(index, *value);
}

Statement& Statement::BindOptional(int index, const std::optional<double>& value) {
  KeepBindError(value ? sqlite3_bind_double(stmt_, index, *value)
                      : sqlite3_bind_null(stmt_, index));
  return *this;
}

StatusOr<bool> Statement::Step() {
  if (bind_error_ != SQLITE_OK) return Error(db_, bind_error_, "binding a value");
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  // sqlite3_reset returns the same code; it also ends an implicit read transaction early.
  sqlite3_reset(stmt_);
  return Error(db_, rc, "running SQL");
}

Status Statement::Run() {
  ASSIGN_OR_RETURN(const bool has_row, Step());
  if (has_row) return InternalError("SQL statement returned rows where none were expected");
  return Status::Ok();
}

void Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_error_ = SQLITE_OK;
}

bool Statement::IsNull(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

int64_t Statement::Int(int column) const { return sqlite3_column_int64(stmt_, column); }

std::string Statement::Text(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  if (text == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(text),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
}

std::optional<std::string> Statement::OptionalText(int column) const {
  if (IsNull(column)) return std::nullopt;
  return Text(column);
}

std::optional<int64_t> Statement::OptionalInt(int column) const {
  if (IsNull(column)) return std::nullopt;
  return Int(column);
}

std::optional<double> Statement::OptionalNumber(int column) const {
  const int type = sqlite3_column_type(stmt_, column);
  if (type != SQLITE_INTEGER && type != SQLITE_FLOAT) return std::nullopt;
  return sqlite3_column_double(stmt_, column);
}

StatusOr<Transaction> Transaction::Begin(sqlite3* db) {
  RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE").WithContext("starting a transaction"));
  return Transaction(db);
}

StatusOr<Transaction> Transaction::BeginRead(sqlite3* db) {
  RETURN_IF_ERROR(Exec(db, "BEGIN DEFERRED").WithContext("starting a read transaction"));
  return Transaction(db);
}

Transaction::~Transaction() {
  if (db_ != nullptr) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

Status Transaction::Commit() {
  RETURN_IF_ERROR(Exec(db_, "COMMIT").WithContext("committing a transaction"));
  db_ = nullptr;
  return Status::Ok();
}

}  // namespace llmctl::store::sqlite
