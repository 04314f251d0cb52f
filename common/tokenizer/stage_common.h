// What several kinds of tokenizer stage share: building a stage, the fields more than one stage
// type reads (a pattern, one character, Metaspace's prepend scheme) and two text rewrites.
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_STAGE_COMMON_H_
#define LLMCTL_COMMON_TOKENIZER_STAGE_COMMON_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/regex.h"

namespace llmctl::tokenizer_internal {

// Builds a stage as its interface type (StatusOr cannot convert unique_ptr<Derived> by itself).
template <typename Base, typename Derived, typename... Args>
StatusOr<std::unique_ptr<Base>> MakeStage(Args&&... args) {
  return std::unique_ptr<Base>(std::make_unique<Derived>(std::forward<Args>(args)...));
}

// The "pattern" field: {"String": "..."} or {"Regex": "..."}.
StatusOr<std::unique_ptr<Pattern>> ParsePattern(const JsonSource& src, const Json& json,
                                                const std::string& path);

// A field holding exactly one character (the library's `char`).
StatusOr<std::string> RequireChar(const JsonSource& src, const Json& json, const std::string& path,
                                  std::string_view key);

// Replaces every match of `pattern` in `text` by `content`.
Status ReplaceMatches(const Pattern& pattern, std::string_view content, std::string* text);

// Each byte of `text` as its character in GPT-2's byte-level alphabet.
std::string ToByteLevel(std::string_view text);

enum class PrependScheme { kAlways, kFirst, kNever };

// Metaspace's prepend_scheme, or the older add_prefix_space flag.
StatusOr<PrependScheme> ParsePrependScheme(const JsonSource& src, const Json& json,
                                           const std::string& path);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_STAGE_COMMON_H_
