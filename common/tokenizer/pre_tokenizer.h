// Pre-tokenizers: tokenizer.json's "pre_tokenizer", which splits the normalized text into the
// pieces the model encodes one by one (Split, ByteLevel, Metaspace, Digits, WhitespaceSplit,
// Sequence).
// Each stage copies the `tokenizers` library's behaviour for the ids it produces (offsets are not
// tracked: nothing here needs them).
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define LLMCTL_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_util.h"

namespace llmctl::tokenizer_internal {

// A piece of the input on its way to the model.
struct Piece {
  std::string text;
  int32_t added_id = -1;  // >= 0: an added token already resolved; later stages leave it alone
  bool at_origin =
      false;  // starts at byte 0 of the caller's text (Metaspace's prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits and rewrites the pieces that are not added tokens; empty pieces are dropped.
  virtual Status PreTokenize(std::vector<Piece>* pieces) const = 0;
};

// Reads one {"type": ...} object of tokenizer.json at `path` (for errors). Unknown or unsupported
// types are errors that name the type.
StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const JsonSource& src, const Json& json,
                                                          const std::string& path, int depth = 0);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_PRE_TOKENIZER_H_
