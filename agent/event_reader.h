// Follows a growing JSON-lines event file: each call returns the lines completed since the last
// one. A line counts only once its '\n' is there, so a line being written is never cut in two.
// Memory is bounded whatever the file holds: a call reads at most kReadBudgetBytes (the caller
// calls again for the rest), and of an unfinished line at most the cap (common/event_line.h) is
// held; the rest of a longer line is dropped, and the line comes out with its size only.
#ifndef LLMCTL_AGENT_EVENT_READER_H_
#define LLMCTL_AGENT_EVENT_READER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/event_line.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace llmctl::agent {

// One line as read, without its '\n'.
struct EventLine {
  std::string text;   // empty when the line was longer than the cap
  int64_t bytes = 0;  // the line's length as written: more than text.size() for an overlong line
  bool overlong() const { return bytes > static_cast<int64_t>(text.size()); }
};

// Splits a byte stream into lines, holding at most `max_line_bytes` of an unfinished one.
class LineSplitter {
 public:
  explicit LineSplitter(int64_t max_line_bytes = event_line::kMaxBytes)
      : max_line_bytes_(max_line_bytes) {}
  // Appends the lines that `data` completes to `lines`.
  void Feed(std::string_view data, std::vector<EventLine>& lines);
  // Bytes of the unfinished line held now (at most max_line_bytes).
  size_t held_bytes() const { return partial_.size(); }

 private:
  const int64_t max_line_bytes_;
  std::string partial_;        // the unfinished line's bytes, while it is within the cap
  int64_t partial_bytes_ = 0;  // its length so far, dropped bytes included
};

// How much of the file one ReadNewLines call reads.
inline constexpr int64_t kReadBudgetBytes = int64_t{1} << 20;

class EventReader {
 public:
  explicit EventReader(std::string path) : path_(std::move(path)) {}
  EventReader(const EventReader&) = delete;
  EventReader& operator=(const EventReader&) = delete;

  // The lines completed since the previous call, in order, from at most kReadBudgetBytes of the
  // file (none while it does not exist yet).
  StatusOr<std::vector<EventLine>> ReadNewLines();
  // Whether the last call read up to the end of the file: else there is more to read at once.
  bool at_end() const { return at_end_; }

  // Lines returned so far: the sequence number of the last one.
  int64_t lines_read() const { return lines_read_; }

 private:
  const std::string path_;
  UniqueFd fd_;
  int64_t offset_ = 0;
  LineSplitter splitter_;
  int64_t lines_read_ = 0;
  bool at_end_ = false;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_EVENT_READER_H_
