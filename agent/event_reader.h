// Follows a growing JSON-lines event file: each call returns the lines completed since the last
// one. A line counts only once its '\n' is there, so a line being written is never cut in two.
#ifndef LLMCTL_AGENT_EVENT_READER_H_
#define LLMCTL_AGENT_EVENT_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::agent {

class EventReader {
 public:
  explicit EventReader(std::string path) : path_(std::move(path)) {}
  ~EventReader();
  EventReader(const EventReader&) = delete;
  EventReader& operator=(const EventReader&) = delete;

  // The lines completed since the previous call (without their '\n'), in order; none while the
  // file does not exist yet.
  StatusOr<std::vector<std::string>> ReadNewLines();

  // Lines returned so far: the sequence number of the last one.
  int64_t lines_read() const { return lines_read_; }

 private:
  const std::string path_;
  int fd_ = -1;
  int64_t offset_ = 0;
  std::string partial_;  // bytes after the last '\n'
  int64_t lines_read_ = 0;
};

// The `type` of an event line, "" when the line is not a JSON object with a string `type`.
std::string EventType(const std::string& line);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_EVENT_READER_H_
