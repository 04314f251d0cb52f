// Post-processors: tokenizer.json's "post_processor", which adds the special tokens around an
// encoded sequence (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence).
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_POST_PROCESSOR_H_
#define LLMCTL_COMMON_TOKENIZER_POST_PROCESSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_util.h"

namespace llmctl::tokenizer_internal {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens of a single sequence (called only when the caller asked for them).
  virtual void AddSpecialTokens(std::vector<int32_t>* ids) const = 0;
};

// Reads one {"type": ...} object of tokenizer.json at `path` (for errors). Unknown or unsupported
// types are errors that name the type.
StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const JsonSource& src, const Json& json,
                                                            const std::string& path, int depth = 0);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_POST_PROCESSOR_H_
