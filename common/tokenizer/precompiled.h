// The "Precompiled" normalizer: SentencePiece's normalization rules (nmt_nfkc for T5: NFKC plus
// removing control characters and mapping odd spaces to " "), compiled by SentencePiece into the
// blob tokenizer.json stores in base64 as "precompiled_charsmap".
//
// The blob, as SentencePiece writes it and the spm_precompiled crate reads it: a little-endian
// uint32 trie size in bytes; a Darts-clone double-array trie of that many bytes (little-endian
// uint32 units) whose keys are UTF-8 strings and whose values are offsets into the rest of the
// blob; and that rest, a pool of NUL-terminated replacement strings.
//
// Normalization follows the library's Precompiled normalizer, quirks included: the text is cut into
// extended grapheme clusters; a cluster shorter than 6 bytes whose bytes start with a key is
// replaced whole by the replacement of the *shortest* such key (so "e" + U+0301 becomes "é", and
// whatever follows the key in the cluster is dropped); any other cluster goes character by
// character, each replaced when it starts with a key, else kept.
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_PRECOMPILED_H_
#define LLMCTL_COMMON_TOKENIZER_PRECOMPILED_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/regex.h"

namespace llmctl::tokenizer_internal {

class PrecompiledNormalizer : public Normalizer {
 public:
  // `charsmap` is the decoded blob. Fails when it is truncated, its strings are not UTF-8, or a
  // trie entry points outside them (the library would accept the last and panic on the text that
  // reaches it).
  static StatusOr<std::unique_ptr<PrecompiledNormalizer>> Create(std::string charsmap);

  Status Normalize(std::string* text) const override;

 private:
  PrecompiledNormalizer() = default;
  Status ValidateTrie() const;
  // The replacement of the shortest key that `chunk` starts with, or std::nullopt. As in the
  // library, a NUL byte ends the key search.
  std::optional<std::string_view> Transform(std::string_view chunk) const;
  // Appends the normalized form of one extended grapheme cluster.
  void AppendGrapheme(std::string_view grapheme, std::string* out) const;

  std::vector<uint32_t> units_;  // the double-array trie, never empty
  std::string pool_;             // the replacement strings, valid UTF-8
  // Replacements of the ASCII characters, computed once: ASCII text without "\r\n" is one
  // character per grapheme cluster, so it skips the cluster search and the trie.
  std::array<std::optional<std::string>, 128> ascii_;
  std::unique_ptr<Pattern> grapheme_;  // \X
};

// Reads {"type": "Precompiled", "precompiled_charsmap": "<base64>"} at `path`; errors name `src`
// and the field.
StatusOr<std::unique_ptr<Normalizer>> ParsePrecompiled(const JsonSource& src, const Json& json,
                                                       const std::string& path);

// Standard base64 with padding, decoded as strictly as the library's decoder (the base64 crate's
// STANDARD engine): no whitespace, canonical padding, no stray bits in the last character.
StatusOr<std::string> DecodeBase64(std::string_view text);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_PRECOMPILED_H_
