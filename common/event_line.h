// An event line's rule: a rule two processes share. llm-train writes one JSON object per line
// (trainer/train/events.h); the agent reads the file and streams each line with its sequence number
// (agent/event_reader.h, agent/server.cc), and the controller stores it (controller/dispatch/
// event_streams.cc). Neither trusts the line it is given: a line that breaks the rule is replaced
// by a `refused_line` event with the same sequence number, so the numbers stay contiguous (the
// controller resumes a stream after its last stored one) and no line can stop a stream.
#ifndef LLMCTL_COMMON_EVENT_LINE_H_
#define LLMCTL_COMMON_EVENT_LINE_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace llmctl::event_line {

// The longest line taken, without its '\n'. llm-train's longest lines (`start`, a `log` with an
// error message) are a few KiB; the agent holds at most this much of an unfinished line, and the
// controller's channel to the agent takes a message this large (agent_links.cc).
inline constexpr int64_t kMaxBytes = int64_t{1} << 20;

// The replacement of a refused line: {"type":"refused_line","bytes":N,"error":"..."}, N the line's
// length as written (without its '\n'), the error saying why in words.
inline constexpr std::string_view kRefusedType = "refused_line";
inline constexpr std::string_view kBytes = "bytes";
inline constexpr std::string_view kError = "error";

// A line as it goes on: the line itself when it keeps the rule, else its replacement.
struct Accepted {
  std::string type;     // the line's `type`; kRefusedType for a replacement
  std::string json;     // the line, or its replacement
  std::string refusal;  // why the line was replaced; "" when it was not
};

// Why `line` breaks the rule, "" when it keeps it: it is at most kMaxBytes of valid UTF-8 and JSON,
// an object whose `type` is a non-empty string. `bytes`: the line's length as written, more than
// line.size() where a reader dropped the rest of an overlong line.
std::string Refusal(std::string_view line, int64_t bytes);

// The line, or its replacement when Refusal names a reason. Never throws.
Accepted Accept(std::string line, int64_t bytes);
inline Accepted Accept(std::string line) {
  const auto bytes = static_cast<int64_t>(line.size());
  return Accept(std::move(line), bytes);
}

// The replacement event's line.
std::string RefusedLine(int64_t bytes, std::string_view refusal);

}  // namespace llmctl::event_line

#endif  // LLMCTL_COMMON_EVENT_LINE_H_
