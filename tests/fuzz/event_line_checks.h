// The event-line rule's promises (common/event_line.h), checked by both event-line fuzz targets:
// whatever the line, what goes on is the line itself, unchanged, when it keeps the rule, else
// exactly one well-formed refused_line event that states the line's size and keeps the rule itself.
#ifndef LLMCTL_TESTS_FUZZ_EVENT_LINE_CHECKS_H_
#define LLMCTL_TESTS_FUZZ_EVENT_LINE_CHECKS_H_

#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/event_line.h"

namespace llmctl::event_line_fuzz {

inline void Check(bool condition) {
  if (!condition) std::abort();
}

// `line` (of `bytes` as written) went on as `type` and `json`, refused for `refusal` ("" if not).
inline void CheckPassedOn(std::string_view line, int64_t bytes, const std::string& type,
                          const std::string& json, const std::string& refusal) {
  Check(!type.empty());
  Check(event_line::Refusal(json, static_cast<int64_t>(json.size())).empty());
  const nlohmann::json event = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  Check(event.is_object() && event["type"].is_string() && event["type"] == type);
  if (refusal.empty()) {
    Check(json == line);
    Check(bytes == static_cast<int64_t>(line.size()) && bytes <= event_line::kMaxBytes);
    return;
  }
  Check(type == event_line::kRefusedType);
  Check(event.size() == 3);
  Check(event[std::string(event_line::kBytes)].is_number_integer() &&
        event[std::string(event_line::kBytes)].get<int64_t>() == bytes);
  Check(event[std::string(event_line::kError)] == refusal);
}

}  // namespace llmctl::event_line_fuzz

#endif  // LLMCTL_TESTS_FUZZ_EVENT_LINE_CHECKS_H_
