#include "common/foreign_json.h"

#include <string>
#include <utility>

#include "common/text.h"

namespace llmctl {

namespace foreign_json_internal {

Status SaxParseFailure(bool too_deep, const std::string& parser_error) {
  if (too_deep) {
    return InvalidArgumentError(std::string("arrays and objects nested more than ")
                                    .append(std::to_string(kMaxForeignJsonDepth))
                                    .append(" levels deep"));
  }
  // The parser quotes the offending bytes, which need not be UTF-8; messages must be.
  return InvalidArgumentError("not valid JSON: " +
                              ReplaceInvalidUtf8(WithoutJsonCategory(parser_error)));
}

}  // namespace foreign_json_internal

std::string_view WithoutJsonCategory(std::string_view what) {
  if (what.starts_with("[json.exception.")) {
    const size_t close = what.find("] ");
    if (close != std::string_view::npos) what.remove_prefix(close + 2);
  }
  return what;
}

StatusOr<nlohmann::json> ParseJsonWithinDepth(std::string_view text) {
  nlohmann::json value;
  // What nlohmann::json::parse builds with (detail: not its documented API, but the SAX events
  // are).
  nlohmann::detail::json_sax_dom_parser<nlohmann::json> builder(value, /*allow_exceptions=*/false);
  RETURN_IF_ERROR(SaxParseWithinDepth(text, &builder));
  return value;
}

nlohmann::json ParseForeignJson(std::string_view text) {
  StatusOr<nlohmann::json> value = ParseJsonWithinDepth(text);
  if (!value.ok()) return nlohmann::json(nlohmann::json::value_t::discarded);
  return std::move(*value);
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
