// Decoders: tokenizer.json's "decoder", which turns tokens back into text (Replace, ByteFallback,
// Fuse, Strip, ByteLevel, Metaspace, Sequence).
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_DECODER_H_
#define LLMCTL_COMMON_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_util.h"

namespace llmctl::tokenizer_internal {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// Reads one {"type": ...} object of tokenizer.json at `path` (for errors). Unknown or unsupported
// types are errors that name the type.
StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const JsonSource& src, const Json& json,
                                                const std::string& path, int depth = 0);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_DECODER_H_
