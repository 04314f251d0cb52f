#include "common/event_line.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/foreign_json.h"
#include "common/text.h"

namespace llmctl::event_line {
namespace {

// Why the line breaks the rule, "" when it keeps it; its `type` then in `type`. The parse itself
// refuses bad UTF-8 too, but a separate check gives the clearer message.
std::string EventLineRefusal(std::string_view line, int64_t bytes, std::string* type_out) {
  if (bytes > kMaxBytes || static_cast<int64_t>(line.size()) > kMaxBytes) {
    return std::to_string(std::max<int64_t>(bytes, static_cast<int64_t>(line.size()))) +
           " bytes, more than the " + std::to_string(kMaxBytes) + "-byte cap on an event line";
  }
  if (const size_t bad = FirstInvalidUtf8(line); bad != std::string_view::npos) {
    return "not valid UTF-8 (byte " + std::to_string(bad) + ")";
  }
  const nlohmann::json event = ParseForeignJson(line);
  if (event.is_discarded()) {
    return "not valid JSON, or nested past " + std::to_string(kMaxForeignJsonDepth) + " levels";
  }
  if (!event.is_object()) return "not a JSON object";
  const auto type = event.find("type");
  if (type == event.end()) return "no \"type\"";
  if (!type->is_string()) return "its \"type\" is not a string";
  if (type->get_ref<const std::string&>().empty()) return "its \"type\" is empty";
  if (type_out != nullptr) *type_out = type->get<std::string>();
  return "";
}

}  // namespace

std::string Refusal(std::string_view line, int64_t bytes) {
  return EventLineRefusal(line, bytes, nullptr);
}

std::string RefusedLine(int64_t bytes, std::string_view refusal) {
  nlohmann::ordered_json event;
  event["type"] = kRefusedType;
  event[std::string(kBytes)] = bytes;
  event[std::string(kError)] = refusal;
  // The refusal names no byte of the line, but a replacement must never throw.
  return DumpLossy(event);
}

Accepted Accept(std::string line, int64_t bytes) {
  Accepted accepted;
  accepted.refusal = EventLineRefusal(line, bytes, &accepted.type);
  if (!accepted.refusal.empty()) {
    accepted.type = std::string(kRefusedType);
    accepted.json = RefusedLine(bytes, accepted.refusal);
    return accepted;
  }
  accepted.json = std::move(line);
  return accepted;
}

}  // namespace llmctl::event_line
