#include "common/foreign_json.h"

namespace llmctl {

nlohmann::json ParseForeignJson(std::string_view text) {
  bool too_deep = false;
  // The callback sees each value's depth as it starts; discarding the first one too deep keeps
  // the parser from building it, and its text is still read through (iteratively).
  nlohmann::json value = nlohmann::json::parse(
      text,
      [&too_deep](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
        if (depth >= kMaxForeignJsonDepth &&
            (event == nlohmann::json::parse_event_t::object_start ||
             event == nlohmann::json::parse_event_t::array_start)) {
          too_deep = true;
          return false;
        }
        return true;
      },
      /*allow_exceptions=*/false);
  if (too_deep) return nlohmann::json(nlohmann::json::value_t::discarded);
  return value;
}

bool NestsAtMost(const nlohmann::json& value, int levels) {
  if (!value.is_structured()) return true;
  if (levels == 0) return false;
  for (const nlohmann::json& item : value) {
    if (!NestsAtMost(item, levels - 1)) return false;
  }
  return true;
}

std::string ShortJson(const nlohmann::json& value) {
  if (!NestsAtMost(value, 16)) return value.is_array() ? "[...]" : "{...}";
  std::string text = DumpLossy(value);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

}  // namespace llmctl
