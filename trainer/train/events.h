// The trainer's event log: one JSON object per line, appended and written line by line so another
// process (the agent) can follow the file while the trial runs. The line number is the event's
// sequence number. A log without a final "result" line is a trial that has not finished (or died).
#ifndef LLMCTL_TRAINER_TRAIN_EVENTS_H_
#define LLMCTL_TRAINER_TRAIN_EVENTS_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "common/status.h"
#include "common/unique_fd.h"

namespace llmctl::trainer {

class EventLog {
 public:
  // Appends to `path` (created if missing). An empty path gives a log that keeps nothing.
  static StatusOr<std::unique_ptr<EventLog>> Open(const std::string& path);

  // Writes `event` (which must carry "type") as one line. A line that cannot be written whole (a
  // full disk, a file size limit) is cut off the file again and nothing more is written, so the
  // file ends after the last whole line; status() then says why.
  void Emit(const nlohmann::json& event);
  int64_t lines_written() const { return lines_written_; }
  // The first write that failed, naming the file; OK while every line was kept.
  const Status& status() const { return status_; }

 private:
  EventLog(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  const std::string path_;
  UniqueFd fd_;  // invalid for a log that keeps nothing
  int64_t lines_written_ = 0;
  Status status_;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_EVENTS_H_
