// What the tokenizer needs of a tokenizer.json model (BPE or Unigram): the ids of one
// pre-tokenized word and the vocabulary in both directions.
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_MODEL_H_
#define LLMCTL_COMMON_TOKENIZER_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace llmctl::tokenizer_internal {

// Lets unordered maps keyed by std::string be probed with a std::string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Implementations are constant after construction, so every method may be called concurrently.
class Model {
 public:
  virtual ~Model() = default;

  // Appends the ids of one pre-tokenized word (non-empty, valid UTF-8). Fails only where the
  // library fails too (an unknown character and no unknown token to stand for it).
  virtual Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const = 0;

  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // The token for `id`, valid while the model is, or nullopt.
  virtual std::optional<std::string_view> IdToToken(int32_t id) const = 0;
  // The library's get_vocab_size(): where the ids of new added tokens start.
  virtual size_t size() const = 0;
  virtual int32_t max_id() const = 0;
};

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_MODEL_H_
