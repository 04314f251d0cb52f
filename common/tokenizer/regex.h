// Patterns for Split/Replace and the regex pre-tokenizers, on PCRE2 (UTF + UCP).
//
// The `tokenizers` library runs these patterns on Oniguruma with Ruby syntax; PCRE2 with UCP gives
// the same Unicode classes (\s is White_Space, \p{L}, \p{N}, (?i:...)), and MULTILINE gives Ruby's
// line anchors. Iteration copies Oniguruma's find_iter: an empty match right after the previous
// match is skipped.
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_REGEX_H_
#define LLMCTL_COMMON_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

// PCRE2's opaque types, declared here so that pcre2.h stays out of this header.
struct pcre2_real_code_8;
struct pcre2_real_match_context_8;

namespace llmctl::tokenizer_internal {

// [begin, end) byte offsets of one match.
struct MatchSpan {
  size_t begin;
  size_t end;
};

// A compiled pattern: either a literal string or a regular expression. Thread-safe after
// construction.
class Pattern {
 public:
  static StatusOr<std::unique_ptr<Pattern>> Literal(std::string_view text);
  static StatusOr<std::unique_ptr<Pattern>> Regex(std::string_view regex);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // Replaces *matches with the successive non-overlapping matches in `text` (valid UTF-8). Fails
  // only when the regex engine gives up (match or memory limit), so a hostile pattern cannot hang
  // the trainer.
  Status FindAll(std::string_view text, std::vector<MatchSpan>* matches) const;

  // The pattern as written, for error messages.
  const std::string& source() const { return source_; }

 private:
  Pattern() = default;

  std::string source_;
  std::string literal_;  // non-empty for literal patterns: matched with a plain search
  pcre2_real_code_8* code_ = nullptr;              // owned; null for literal patterns
  pcre2_real_match_context_8* context_ = nullptr;  // owned
};

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_REGEX_H_
