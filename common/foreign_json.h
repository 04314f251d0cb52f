// JSON that another process or a user wrote: an event line, a gRPC field's JSON, a probe, a run's
// files, a config.json. Parsed, copied, shown and written without an exception or a crash.
//
// nlohmann's parser keeps its own stack, but copying a value and dump() recurse once per level:
// 50,000 levels of '[' (100 KB, well inside an event line's 1 MiB) overflow a thread's 8 MB stack.
// And dump() throws on a string that is not UTF-8 (a trainer's last stderr line, cut anywhere).
#ifndef LLMCTL_COMMON_FOREIGN_JSON_H_
#define LLMCTL_COMMON_FOREIGN_JSON_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl {

// Deeper than any document llmctl reads (an event: 3; a config.json: 4; a tokenizer.json's
// sequences: 16) and far from a stack's end.
inline constexpr int kMaxForeignJsonDepth = 64;

// `text` parsed, or InvalidArgument: "not valid JSON: " and the parser's message, or "arrays and
// objects nested more than 64 levels deep". The parse ends at the first array or object nested
// past kMaxForeignJsonDepth: nlohmann's parser would keep a level of stack for each one after it.
StatusOr<nlohmann::json> ParseJsonWithinDepth(std::string_view text);

// ParseJsonWithinDepth for a reader that builds its own tables from the parse's events instead of
// a whole document: nlohmann::json::sax_parse(text, handler), with the same depth limit and
// errors. `handler` has the events of nlohmann's SAX interface (null, boolean, number_integer,
// number_unsigned, number_float, string, binary, start_object, key, end_object, start_array,
// end_array), each returning true; parse errors do not reach it.
template <typename Handler>
Status SaxParseWithinDepth(std::string_view text, Handler* handler);

// `text` parsed, or a discarded value (is_discarded()) where ParseJsonWithinDepth fails: what
// nlohmann::json::parse(text, nullptr, false) returns, for foreign text.
nlohmann::json ParseForeignJson(std::string_view text);

// Whether `value` nests at most `levels` levels of arrays and objects (a scalar: 0). Recurses at
// most `levels` deep.
bool NestsAtMost(const nlohmann::json& value, int levels);

// `value` for a message: at most 40 characters ("..." past them), "[...]" or "{...}" for one nested
// past 16 levels, and invalid UTF-8 replaced.
std::string ShortJson(const nlohmann::json& value);

// value.dump() with invalid UTF-8 replaced by U+FFFD instead of throwing: for writing a value that
// holds another process's or the user's text. Either of nlohmann's json types.
template <typename Json>
std::string DumpLossy(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// DumpLossy with every character past ASCII written as \uXXXX: JSON for the user's terminal
// (`report --format json` and its kind), where another process's U+009B (CSI) or U+202E (a
// right-to-left override) would act as itself; a JSON reader reads the same strings back.
template <typename Json>
std::string DumpForTerminal(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
}

// nlohmann's message without its category prefix ("[json.exception.parse_error.101] "), which
// names the library, not what is wrong with the text: a user read it in front of what was wrong
// with their tokenizer.json.
std::string_view WithoutJsonCategory(std::string_view what);

namespace foreign_json_internal {

// `handler`'s events, ended at the first array or object nested past kMaxForeignJsonDepth: a SAX
// handler that returns false stops the parse there. (A parse callback that returns false only
// drops the value: the parser reads its text through, and its stacks grow a word and two bits a
// level, 408 MB for a 60 MB hub listing of "[[[[".)
template <typename Handler>
class DepthLimitedSax {
 public:
  using Json = nlohmann::json;
  explicit DepthLimitedSax(Handler* handler) : handler_(*handler) {}

  bool null() { return handler_.null(); }
  bool boolean(bool value) { return handler_.boolean(value); }
  bool number_integer(Json::number_integer_t value) { return handler_.number_integer(value); }
  bool number_unsigned(Json::number_unsigned_t value) { return handler_.number_unsigned(value); }
  bool number_float(Json::number_float_t value, const Json::string_t& text) {
    return handler_.number_float(value, text);
  }
  bool string(Json::string_t& value) { return handler_.string(value); }
  bool binary(Json::binary_t& value) { return handler_.binary(value); }
  bool key(Json::string_t& value) { return handler_.key(value); }
  bool start_object(std::size_t elements) { return Enter() && handler_.start_object(elements); }
  bool end_object() {
    --depth_;
    return handler_.end_object();
  }
  bool start_array(std::size_t elements) { return Enter() && handler_.start_array(elements); }
  bool end_array() {
    --depth_;
    return handler_.end_array();
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

  Handler& handler_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::string error_;
};

// SaxParseWithinDepth's error for a parse that ended early.
Status SaxParseFailure(bool too_deep, const std::string& parser_error);

}  // namespace foreign_json_internal

template <typename Handler>
Status SaxParseWithinDepth(std::string_view text, Handler* handler) {
  foreign_json_internal::DepthLimitedSax<Handler> limited(handler);
  if (nlohmann::json::sax_parse(text, &limited)) return Status::Ok();
  return foreign_json_internal::SaxParseFailure(limited.too_deep(), limited.error());
}

}  // namespace llmctl

#endif  // LLMCTL_COMMON_FOREIGN_JSON_H_
