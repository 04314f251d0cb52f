#include "common/foreign_json.h"

#include <cstddef>
#include <string>
#include <utility>

#include "common/text.h"

namespace llmctl {

namespace {

// nlohmann's DOM builder, ended at the first array or object nested past kMaxForeignJsonDepth: a
// SAX handler that returns false stops the parse there. (A parse callback that returns false only
// drops the value: the parser reads its text through, and its stacks grow a word and two bits a
// level, 408 MB for a 60 MB hub listing of "[[[[".)
class DepthLimitedDomBuilder {
 public:
  using Json = nlohmann::json;
  explicit DepthLimitedDomBuilder(Json* value) : builder_(*value, /*allow_exceptions=*/false) {}

  bool null() { return builder_.null(); }
  bool boolean(bool value) { return builder_.boolean(value); }
  bool number_integer(Json::number_integer_t value) { return builder_.number_integer(value); }
  bool number_unsigned(Json::number_unsigned_t value) { return builder_.number_unsigned(value); }
  bool number_float(Json::number_float_t value, const Json::string_t& text) {
    return builder_.number_float(value, text);
  }
  bool string(Json::string_t& value) { return builder_.string(value); }
  bool binary(Json::binary_t& value) { return builder_.binary(value); }
  bool key(Json::string_t& value) { return builder_.key(value); }
  bool start_object(std::size_t elements) { return Enter() && builder_.start_object(elements); }
  bool end_object() {
    --depth_;
    return builder_.end_object();
  }
  bool start_array(std::size_t elements) { return Enter() && builder_.start_array(elements); }
  bool end_array() {
    --depth_;
    return builder_.end_array();
  }
  template <typename Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const Exception& error) {
    error_ = error.what();
    return false;
  }

  bool too_deep() const { return too_deep_; }
  // The parser's message for text that is not JSON (a syntax error, a number past a double's
  // range); empty when there was none.
  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (depth_ == kMaxForeignJsonDepth) {
      too_deep_ = true;
      return false;
    }
    ++depth_;
    return true;
  }

  // What nlohmann::json::parse builds with (detail: not its documented API, but the SAX events
  // are).
  nlohmann::detail::json_sax_dom_parser<Json> builder_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::string error_;
};

}  // namespace

StatusOr<nlohmann::json> ParseJsonWithinDepth(std::string_view text) {
  nlohmann::json value;
  DepthLimitedDomBuilder builder(&value);
  if (nlohmann::json::sax_parse(text, &builder)) return value;
  if (builder.too_deep()) {
    return InvalidArgumentError(std::string("arrays and objects nested more than ")
                                    .append(std::to_string(kMaxForeignJsonDepth))
                                    .append(" levels deep"));
  }
  // The parser quotes the offending bytes, which need not be UTF-8; messages must be.
  return InvalidArgumentError("not valid JSON: " + ReplaceInvalidUtf8(builder.error()));
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
