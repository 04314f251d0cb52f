// JSON that another process or a user wrote: an event line, a gRPC field's JSON, a probe, a run's
// files, a config.json. Parsed, copied, shown and written without an exception or a crash.
//
// nlohmann's parser keeps its own stack, but copying a value and dump() recurse once per level:
// 50,000 levels of '[' (100 KB, well inside an event line's 1 MiB) overflow a thread's 8 MB stack.
// And dump() throws on a string that is not UTF-8 (a trainer's last stderr line, cut anywhere).
#ifndef LLMCTL_COMMON_FOREIGN_JSON_H_
#define LLMCTL_COMMON_FOREIGN_JSON_H_

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

}  // namespace llmctl

#endif  // LLMCTL_COMMON_FOREIGN_JSON_H_
