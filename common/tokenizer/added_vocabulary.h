// tokenizer.json's "added_tokens": the added and special tokens, and how the `tokenizers` library's
// AddedVocabulary finds them in the text.
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
#define LLMCTL_COMMON_TOKENIZER_ADDED_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/model.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace llmctl::tokenizer_internal {

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// Added and special tokens: found in the text before the model runs (tokens with normalized=false
// in the raw text, the others in the normalized text), leftmost-longest, with the
// lstrip/rstrip/single_word rules.
class AddedVocabulary {
 public:
  // Assigns ids the way the library does when it loads a file: a token already in the model keeps
  // the model's id, a new one gets the next id after the model's vocabulary.
  static StatusOr<std::unique_ptr<AddedVocabulary>> Create(const std::vector<AddedToken>& tokens,
                                                           const Model& model,
                                                           const Normalizer* normalizer);

  // Splits `text` (valid UTF-8) into added tokens and normalized text pieces.
  Status ExtractAndNormalize(std::string_view text, const Normalizer* normalizer,
                             std::vector<Piece>* pieces) const;

  std::optional<int32_t> TokenToId(std::string_view content) const;
  // The text an id decodes from (for normalized tokens, their normalized form), or nullptr.
  const std::string* IdToToken(int32_t id) const;
  bool IsSpecial(std::string_view token) const { return special_.contains(token); }
  int32_t max_id() const { return max_id_; }

 private:
  struct Entry {
    AddedToken token;
    int32_t id;
    std::string pattern;  // what is searched for: the content, normalized for normalized tokens
  };
  // A byte trie over the patterns; leaves point into entries_.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;
      int32_t entry = -1;
    };
    std::vector<Node> nodes;
    bool first_byte[256] = {};
    void Insert(std::string_view pattern, int32_t entry);
    // The entry of the longest pattern that starts at text[pos], or -1.
    int32_t LongestAt(std::string_view text, size_t pos, size_t* length) const;
  };
  struct Split {
    size_t begin;
    size_t end;
    int32_t id;  // -1 for text between tokens
  };

  AddedVocabulary() = default;
  void FindSplits(std::string_view text, const Trie& trie, std::vector<Split>* splits) const;

  std::vector<Entry> entries_;  // by id order of insertion; the last definition of an id wins
  std::unordered_map<int32_t, size_t> by_id_;
  StringIdMap by_content_;
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_;
  Trie raw_trie_;
  Trie normalized_trie_;
  int32_t max_id_ = -1;
};

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
