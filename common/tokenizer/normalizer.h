// Normalizers: tokenizer.json's "normalizer", which rewrites the text before it is split (NFC,
// Replace, Strip, Prepend, ByteLevel, Sequence; Precompiled is precompiled.h's).
// Each stage copies the `tokenizers` library's behaviour for the ids it produces (offsets are not
// tracked: nothing here needs them).
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_NORMALIZER_H_
#define LLMCTL_COMMON_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_util.h"

namespace llmctl::tokenizer_internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status Normalize(std::string* text) const = 0;
};

// Reads one {"type": ...} object of tokenizer.json at `path` (for errors). Unknown or unsupported
// types are errors that name the type.
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const JsonSource& src, const Json& json,
                                                      const std::string& path, int depth = 0);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_NORMALIZER_H_
