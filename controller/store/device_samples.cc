// Store's device samples: the agents' once-a-second readings of each attempt's devices, kept one by
// one for each node's last kDeviceSampleWindow and merged into kDeviceSampleBucket rows before
// that (controller/store/schema.cc, kDeviceSamples and kDeviceSampleSeq).
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/text.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using internal::FromMillis;
using internal::ToMillis;
using sqlite::Statement;
using sqlite::Transaction;

constexpr char kSampleColumns[] =
    "attempt, node_rank, device, sampled_at, count, utilization_percent, memory_used_bytes, "
    "memory_total_bytes, power_watts, temperature_celsius";

// The one statement that writes a device_samples row, a reading as its agent took it or a bucket's
// merged readings; BindRow binds it. A reading repeated within one bucket's millisecond (a clock
// step back) is one reading; a merged row never meets another, as its bucket's rows were removed.
constexpr char kInsertRow[] =
    "INSERT OR IGNORE INTO device_samples (trial_id, attempt, node_rank, device, sampled_at, "
    "count, utilization_percent, memory_used_bytes, memory_total_bytes, power_watts, "
    "temperature_celsius, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

// Binds `row` to kInsertRow as a row of the trial's attempt `attempt` (a reading does not carry
// row.attempt) whose last reading is `seq`.
Statement& BindRow(Statement& insert, int64_t trial_id, int64_t attempt, const DeviceSample& row,
                   int64_t seq) {
  return insert.Bind(1, trial_id)
      .Bind(2, attempt)
      .Bind(3, row.node_rank)
      .Bind(4, row.device)
      .Bind(5, ToMillis(row.time))
      .Bind(6, row.count)
      .BindOptional(7, row.utilization_percent)
      .Bind(8, row.memory_used_bytes)
      .Bind(9, row.memory_total_bytes)
      .BindOptional(10, row.power_watts)
      .BindOptional(11, row.temperature_celsius)
      .Bind(12, seq);
}

DeviceSample ReadSample(const Statement& stmt) {
  DeviceSample sample;
  sample.attempt = stmt.Int(0);
  sample.node_rank = stmt.Int(1);
  sample.device = stmt.Text(2);
  sample.time = FromMillis(stmt.Int(3));
  sample.count = stmt.Int(4);
  sample.utilization_percent = stmt.OptionalNumber(5);
  sample.memory_used_bytes = stmt.Int(6);
  sample.memory_total_bytes = stmt.Int(7);
  sample.power_watts = stmt.OptionalNumber(8);
  sample.temperature_celsius = stmt.OptionalNumber(9);
  return sample;
}

// Where node rank `node_rank`'s highest ingested reading of the attempt is kept: node rank 0's
// with the attempt, another's with its attempt_nodes row.
std::string CursorQuery(int64_t node_rank, bool update) {
  if (node_rank == 0) {
    return update ? "UPDATE attempts SET device_sample_seq = ? WHERE trial_id = ? AND attempt = ?"
                  : "SELECT device_sample_seq FROM attempts WHERE trial_id = ? AND attempt = ?";
  }
  return update ? "UPDATE attempt_nodes SET device_sample_seq = ? WHERE trial_id = ? AND "
                  "attempt = ? AND node_rank = " +
                      std::to_string(node_rank)
                : "SELECT device_sample_seq FROM attempt_nodes WHERE trial_id = ? AND attempt = ? "
                  "AND node_rank = " +
                      std::to_string(node_rank);
}

StatusOr<std::vector<DeviceSample>> ReadSamples(Statement& stmt) {
  std::vector<DeviceSample> samples;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) return samples;
    samples.push_back(ReadSample(stmt));
  }
}

// A utilisation or power that is negative, not finite or past any device's.
bool IsBadFigure(const std::optional<double>& value) {
  return value.has_value() &&
         (!std::isfinite(*value) || *value < 0 || *value > kMaxDeviceSampleFigure);
}

Status ValidateSample(const NewDeviceSample& reading, int64_t trial_id, int64_t attempt) {
  const std::string where = "device sample " + std::to_string(reading.seq) + " of attempt " +
                            std::to_string(attempt) + " of trial " + std::to_string(trial_id);
  const DeviceSample& sample = reading.sample;
  if (reading.seq < 1) return InvalidArgumentError(where + ": sequence numbers start at 1");
  if (reading.seq > kMaxSeq) return InvalidArgumentError(where + ": past the last sequence number");
  if (sample.device.empty()) return InvalidArgumentError(where + ": no device named");
  if (const std::string problem = PrintableTextProblem(sample.device, 64); !problem.empty()) {
    return InvalidArgumentError(where + ": its device's name " + problem);
  }
  if (ToMillis(sample.time) <= 0) return InvalidArgumentError(where + ": no time");
  if (sample.memory_used_bytes < 0 || sample.memory_total_bytes < 0) {
    return InvalidArgumentError(where + ": negative memory");
  }
  if (sample.memory_total_bytes > 0 && sample.memory_used_bytes > sample.memory_total_bytes) {
    return InvalidArgumentError(where + ": " + std::to_string(sample.memory_used_bytes) +
                                " bytes used of " + std::to_string(sample.memory_total_bytes));
  }
  if (IsBadFigure(sample.utilization_percent) || IsBadFigure(sample.power_watts) ||
      (sample.temperature_celsius && !std::isfinite(*sample.temperature_celsius))) {
    return InvalidArgumentError(where + ": a figure is negative, not finite or past any device's");
  }
  return Status::Ok();
}

// A device sample bucket's length, and the window before a node's last reading in which its
// readings stay one per row.
constexpr int64_t kBucketMs = std::chrono::milliseconds(kDeviceSampleBucket).count();
constexpr int64_t kWindowMs = std::chrono::milliseconds(kDeviceSampleWindow).count();

// When node rank `node_rank` took its last reading of the attempt, on its own clock; nullopt when
// it has none. Its highest seq, as its clock may have stepped back since an earlier reading, and
// another node's clock is not its own. Rows stored before the schema kept a seq have 0; the latest
// date decides among them.
StatusOr<std::optional<int64_t>> LastReadingMillis(sqlite3* db, int64_t trial_id, int64_t attempt,
                                                   int64_t node_rank) {
  ASSIGN_OR_RETURN(Statement newest,
                   Statement::Prepare(db,
                                      "SELECT sampled_at FROM device_samples WHERE trial_id = ? "
                                      "AND attempt = ? AND node_rank = ? "
                                      "ORDER BY seq DESC, sampled_at DESC LIMIT 1"));
  newest.Bind(1, trial_id).Bind(2, attempt).Bind(3, node_rank);
  ASSIGN_OR_RETURN(const bool has_newest, newest.Step());
  if (!has_newest) return std::optional<int64_t>();
  return std::optional<int64_t>(newest.Int(0));
}

// Where merging stops for a last reading at `last_ms`: the start of the bucket that holds the
// window's start. Whole buckets only: a bucket straddling the window's start stays one reading per
// row.
int64_t MergeCutoff(int64_t last_ms) {
  const int64_t oldest_kept = last_ms - kWindowMs;
  return oldest_kept - ((oldest_kept % kBucketMs) + kBucketMs) % kBucketMs;
}

// A bucket's readings merged into one row, and its last reading's seq.
struct MergedRow {
  DeviceSample sample;
  int64_t seq = 0;
};

// Node rank `node_rank`'s buckets of the attempt before `cutoff` that hold more than one row, each
// merged: the mean utilisation and power over the readings that have them, the highest memory and
// temperature.
StatusOr<std::vector<MergedRow>> MergeBuckets(sqlite3* db, int64_t trial_id, int64_t attempt,
                                              int64_t node_rank, int64_t cutoff) {
  const std::string bucket = "(sampled_at - ((sampled_at % " + std::to_string(kBucketMs) + ") + " +
                             std::to_string(kBucketMs) + ") % " + std::to_string(kBucketMs) + ")";
  ASSIGN_OR_RETURN(
      Statement groups,
      Statement::Prepare(
          db,
          "SELECT ?, node_rank, device, " + bucket +
              " AS bucket, SUM(count), "
              "SUM(utilization_percent * count) / "
              "SUM(CASE WHEN utilization_percent IS NOT NULL THEN count END), "
              "MAX(memory_used_bytes), MAX(memory_total_bytes), "
              "SUM(power_watts * count) / SUM(CASE WHEN power_watts IS NOT NULL THEN count END), "
              "MAX(temperature_celsius), MAX(seq) FROM device_samples "
              "WHERE trial_id = ? AND attempt = ? AND node_rank = ? AND sampled_at < ? "
              "GROUP BY device, bucket HAVING COUNT(*) > 1"));
  groups.Bind(1, attempt).Bind(2, trial_id).Bind(3, attempt).Bind(4, node_rank).Bind(5, cutoff);
  std::vector<MergedRow> merged;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, groups.Step());
    if (!has_row) return merged;
    merged.push_back({.sample = ReadSample(groups), .seq = groups.Int(10)});
  }
}

// Replaces the rows of each merged row's bucket with it.
Status ReplaceBuckets(sqlite3* db, int64_t trial_id, int64_t attempt,
                      const std::vector<MergedRow>& merged) {
  ASSIGN_OR_RETURN(Statement remove,
                   Statement::Prepare(db,
                                      "DELETE FROM device_samples WHERE trial_id = ? AND attempt = "
                                      "? AND node_rank = ? AND device = ? AND sampled_at >= ? AND "
                                      "sampled_at < ?"));
  ASSIGN_OR_RETURN(Statement insert, Statement::Prepare(db, kInsertRow));
  for (const auto& [row, seq] : merged) {
    const int64_t start = ToMillis(row.time);
    remove.Reset();
    remove.Bind(1, trial_id)
        .Bind(2, attempt)
        .Bind(3, row.node_rank)
        .Bind(4, row.device)
        .Bind(5, start)
        .Bind(6, start + kBucketMs);
    RETURN_IF_ERROR(remove.Run());
    insert.Reset();
    RETURN_IF_ERROR(BindRow(insert, trial_id, attempt, row, seq).Run());
  }
  return Status::Ok();
}

// Merges node rank `node_rank`'s rows of the attempt older than the window before its last
// reading into one row per device and bucket. Buckets that already hold one row are left alone, so
// merging again changes nothing.
Status MergeOldSamples(sqlite3* db, int64_t trial_id, int64_t attempt, int64_t node_rank) {
  ASSIGN_OR_RETURN(const std::optional<int64_t> last_ms,
                   LastReadingMillis(db, trial_id, attempt, node_rank));
  if (!last_ms) return Status::Ok();
  ASSIGN_OR_RETURN(const std::vector<MergedRow> merged,
                   MergeBuckets(db, trial_id, attempt, node_rank, MergeCutoff(*last_ms)));
  if (merged.empty()) return Status::Ok();
  return ReplaceBuckets(db, trial_id, attempt, merged);
}

}  // namespace

StatusOr<int64_t> Store::AppendDeviceSamples(int64_t trial_id, int64_t attempt,
                                             std::span<const NewDeviceSample> samples,
                                             int64_t node_rank) {
  for (const NewDeviceSample& sample : samples) {
    RETURN_IF_ERROR(ValidateSample(sample, trial_id, attempt));
  }
  RETURN_IF_ERROR(CheckRoomForRows(samples.size(), "device samples", trial_id, attempt,
                                   static_cast<int64_t>(samples.size()) * 2 * kRowOverheadBytes));
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  RETURN_IF_ERROR(internal::CheckCurrentAttempt(db_, trial_id, attempt));
  ASSIGN_OR_RETURN(Statement cursor, Statement::Prepare(db_, CursorQuery(node_rank, false)));
  cursor.Bind(1, trial_id).Bind(2, attempt);
  ASSIGN_OR_RETURN(const bool has_cursor, cursor.Step());
  if (!has_cursor) {
    if (node_rank == 0) return InternalError("the current attempt has no row");
    return InvalidArgumentError("attempt " + std::to_string(attempt) + " of trial " +
                                std::to_string(trial_id) + " has no node rank " +
                                std::to_string(node_rank));
  }
  int64_t last_seq = cursor.Int(0);
  ASSIGN_OR_RETURN(Statement insert, Statement::Prepare(db_, kInsertRow));
  int64_t added = 0;
  for (const NewDeviceSample& reading : samples) {
    if (reading.seq <= last_seq) continue;
    last_seq = reading.seq;
    DeviceSample row = reading.sample;
    row.node_rank = node_rank;
    row.count = 1;
    insert.Reset();
    RETURN_IF_ERROR(BindRow(insert, trial_id, attempt, row, reading.seq).Run());
    ++added;
  }
  if (added == 0) return 0;
  ASSIGN_OR_RETURN(Statement advance, Statement::Prepare(db_, CursorQuery(node_rank, true)));
  advance.Bind(1, last_seq).Bind(2, trial_id).Bind(3, attempt);
  RETURN_IF_ERROR(advance.Run());
  RETURN_IF_ERROR(MergeOldSamples(db_, trial_id, attempt, node_rank));
  RETURN_IF_ERROR(txn.Commit());
  return added;
}

StatusOr<int64_t> Store::LastDeviceSampleSeq(int64_t trial_id, int64_t attempt, int64_t node_rank) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, CursorQuery(node_rank, false)));
  stmt.Bind(1, trial_id).Bind(2, attempt);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  return has_row ? stmt.Int(0) : 0;
}

StatusOr<std::vector<DeviceSample>> Store::DeviceSamples(int64_t experiment_id,
                                                         std::string_view trial) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::BeginRead(db_));
  ASSIGN_OR_RETURN(
      Statement find,
      Statement::Prepare(db_, "SELECT id FROM trials WHERE experiment_id = ? AND name = ?"));
  find.Bind(1, experiment_id).Bind(2, trial);
  ASSIGN_OR_RETURN(const bool found, find.Step());
  if (!found) {
    return NotFoundError("experiment " + std::to_string(experiment_id) + " has no trial '" +
                         std::string(trial) + "'");
  }
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_, std::string("SELECT ") + kSampleColumns +
                                               " FROM device_samples WHERE trial_id = ? "
                                               "ORDER BY sampled_at, node_rank, device, attempt"));
  stmt.Bind(1, find.Int(0));
  return ReadSamples(stmt);
}

StatusOr<std::vector<DeviceSample>> Store::LatestDeviceSamples(int64_t trial_id, int64_t attempt) {
  MutexLock lock(mutex_);
  // Each device's last reading taken: its highest seq, not its latest date, which its node's
  // clock gave (LastReadingMillis says why, and how rows without a seq are ordered).
  ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_, std::string("SELECT ") + kSampleColumns +
                                  " FROM device_samples s WHERE trial_id = ? AND attempt = ? "
                                  "AND sampled_at = (SELECT sampled_at FROM device_samples "
                                  "WHERE trial_id = s.trial_id AND attempt = s.attempt AND "
                                  "node_rank = s.node_rank AND device = s.device "
                                  "ORDER BY seq DESC, sampled_at DESC LIMIT 1) "
                                  "ORDER BY node_rank, device"));
  stmt.Bind(1, trial_id).Bind(2, attempt);
  return ReadSamples(stmt);
}

}  // namespace llmctl::store
