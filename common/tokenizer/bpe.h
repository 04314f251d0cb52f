// The BPE model of Hugging Face `tokenizers`: a vocabulary, ranked merges, optional byte fallback
// (`<0xNN>` tokens, as in Llama 2), unknown-token fusing and `ignore_merges` (Llama 3).
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_BPE_H_
#define LLMCTL_COMMON_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/model.h"
#include "common/tokenizer/token_table.h"

namespace llmctl::tokenizer_internal {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

// Merges as a file lists them, best first: (left, right) token pairs in one buffer, as a file's
// 250,000 merges would take 64 bytes each in std::string pairs before their text.
class MergeList {
 public:
  void Add(std::string_view left, std::string_view right) {
    text_.append(left);
    ends_.push_back(text_.size());
    text_.append(right);
    ends_.push_back(text_.size());
  }
  size_t size() const { return ends_.size() / 2; }
  // The i-th merge's (left, right), valid while the list is.
  std::pair<std::string_view, std::string_view> operator[](size_t i) const {
    const size_t begin = i == 0 ? 0 : ends_[2 * i - 1];
    const std::string_view text = text_;
    return {text.substr(begin, ends_[2 * i] - begin),
            text.substr(ends_[2 * i], ends_[2 * i + 1] - ends_[2 * i])};
  }

 private:
  std::string text_;
  std::vector<size_t> ends_;  // where each merge's left and right end in text_
};

class BpeModel : public Model {
 public:
  // Every token of a merge and the merged token must be in `vocab`; the error names the merge's
  // index.
  static StatusOr<std::unique_ptr<BpeModel>> Create(TokenTable vocab, const MergeList& merges,
                                                    BpeOptions options);

  // Appends the ids of one pre-tokenized word (non-empty, valid UTF-8). Fails only when an unknown
  // character needs unk_token and that token is not in the vocabulary (the library fails there
  // too).
  Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const override;

  std::optional<int32_t> TokenToId(std::string_view token) const override;
  // Two tokens may share an id in a malformed file: the smaller is the id's token, so the choice is
  // stable.
  std::optional<std::string_view> IdToToken(int32_t id) const override;
  // Number of distinct tokens, like the library's get_vocab_size().
  size_t size() const override { return vocab_.size(); }
  int32_t max_id() const override { return vocab_.max_id(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  BpeModel() = default;
  Status TokenizeCached(std::string_view word, std::vector<int32_t>* ids) const;
  Status MergeWord(std::string_view word, std::vector<int32_t>* ids) const;

  // Constant after construction.
  TokenTable vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_;  // id of "<0xNN>", -1 when absent
  BpeOptions options_;
  // SentencePiece-style files run BPE on the whole text as one word. When no merge can join a token
  // that ends in a non-"▁" character to one that starts with "▁" (true of SentencePiece
  // vocabularies), no token ever spans such a boundary, so the word can be cut there and each
  // "▁word" cached: same ids, much faster.
  bool split_at_metaspace_ = false;

  // Words seen before, as the library caches them; results are identical with or without the cache.
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>
      cache_;  // guarded by cache_mutex_
};

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_BPE_H_
