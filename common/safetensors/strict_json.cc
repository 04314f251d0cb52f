#include "common/safetensors/strict_json.h"

#include <set>
#include <vector>

#include "common/foreign_json.h"
#include "common/text.h"

namespace llmctl::safetensors::internal {
namespace {

using Json = nlohmann::json;

// Nesting deeper than this cannot be a real header (the deepest legal value is a shape array at
// depth 3); refusing early keeps a hostile "[[[[..." from exhausting memory or the stack.
constexpr int kMaxJsonDepth = 64;

struct JsonTooDeep {};

}  // namespace

// The message can quote the offending input, so it goes through OnOneLine.
std::string JsonErrorText(const std::exception& e) {
  return OnOneLine(WithoutJsonCategory(e.what()), kMaxQuotedBytes);
}

StatusOr<Json> ParseJsonStrict(std::string_view text, const std::string& what) {
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return DataLossError(what + " is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  }
  std::vector<std::set<std::string, std::less<>>> open_objects;  // keys seen, per enclosing object
  std::string duplicate;
  int duplicate_depth = 0;
  const Json::parser_callback_t callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxJsonDepth) throw JsonTooDeep{};
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) {
        duplicate = key;
        duplicate_depth = depth;
      }
    }
    return true;
  };
  try {
    Json value = Json::parse(text.begin(), text.end(), callback);
    if (!duplicate.empty()) {
      return DataLossError(what + (duplicate_depth == 1 ? " names '" : " repeats the key '") +
                           OnOneLine(duplicate, kMaxQuotedBytes) + "'" +
                           (duplicate_depth == 1 ? " twice" : " within one object"));
    }
    return value;
  } catch (const JsonTooDeep&) {
    return DataLossError(what + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const Json::exception& e) {
    return DataLossError(what + " is not valid JSON: " + JsonErrorText(e));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(what + " is too large to parse");
  }
}

}  // namespace llmctl::safetensors::internal
