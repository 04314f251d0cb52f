// The trainer's event log: one JSON object per line, appended and flushed line by line so another process
// (the agent) can follow the file while the trial runs. The line number is the event's sequence number.
// A log without a final "result" line is a trial that has not finished (or died).
#ifndef LLMCTL_TRAINER_TRAIN_EVENTS_H_
#define LLMCTL_TRAINER_TRAIN_EVENTS_H_

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace llmctl::trainer {

class EventLog {
 public:
  // Appends to `path` (created if missing). An empty path gives a log that keeps nothing.
  static StatusOr<std::unique_ptr<EventLog>> Open(const std::string& path);
  ~EventLog();

  // Writes `event` (which must carry "type") as one line and flushes it.
  void Emit(const nlohmann::json& event);
  int64_t lines_written() const { return lines_written_; }

 private:
  explicit EventLog(std::FILE* file) : file_(file) {}
  std::FILE* file_;  // owned; null for a log that keeps nothing
  int64_t lines_written_ = 0;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_EVENTS_H_
