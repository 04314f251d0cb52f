// A vocabulary (BPE's tokens, Unigram's pieces) that holds each token's bytes once: the distinct
// tokens back to back in one buffer, an open-addressing hash table of their indices for token ->
// id, and their indices ordered by id for id -> token. A map from token to id beside a map from id
// to token held every token twice, each in a 64-byte hash node with its bucket (and a heap block
// for a token past 15 bytes): for 256,000 Llama 3-shaped tokens the tokenizer kept 52.8 MiB,
// now 20.8, of which this table is 11.0 (3.1 of token bytes, 2.9 of entries, 4 of slots, 1 by id).
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_TOKEN_TABLE_H_
#define LLMCTL_COMMON_TOKENIZER_TOKEN_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmctl::tokenizer_internal {

class TokenTable {
 public:
  // Gives `token` the id `id` (non-negative), adding the token when it is new: a token set twice
  // keeps its last id, as a JSON object keeps its last member. Clears the id order that IndexIds
  // makes.
  void Set(std::string_view token, int32_t id);

  // Orders the tokens by id for TokenOf and frees the spare capacity the tables grew with; call it
  // once the last token is set.
  void IndexIds();

  std::optional<int32_t> IdOf(std::string_view token) const;
  // The token with `id`, the smallest (bytewise) when several tokens share it, or nullopt; valid
  // while the table is and is not set again. Answers nullopt before IndexIds.
  std::optional<std::string_view> TokenOf(int32_t id) const;

  // Distinct tokens.
  size_t size() const { return entries_.size(); }
  // The largest id, or -1 when there is no token; set by IndexIds.
  int32_t max_id() const { return max_id_; }

 private:
  // 32-bit offsets: tokenizer.json is at most 256 MiB, so its tokens are too.
  struct Entry {
    uint32_t begin;  // where the token's bytes start in bytes_
    uint32_t size;
    int32_t id;
  };

  std::string_view TokenAt(uint32_t entry) const {
    return {bytes_.data() + entries_[entry].begin, entries_[entry].size};
  }
  // The slot that holds `token`'s entry, or the empty slot where it would go.
  size_t FindSlot(std::string_view token, uint64_t hash) const;
  // Doubles slots_ and puts every entry back.
  void Grow();

  std::string bytes_;           // every distinct token's bytes, back to back
  std::vector<Entry> entries_;  // in the order tokens were first set
  // Open addressing with linear probing, at most half full, its size a power of two: each slot is
  // 0 (empty) or the high 32 bits of the token's hash above the entry's index + 1, so that most
  // probes of another token are told apart without reading its bytes.
  std::vector<uint64_t> slots_;
  // Entry indices by ascending id, one per id (the smallest token of those that share it); dense
  // ids 0..n-1 put id i at position i.
  std::vector<uint32_t> by_id_;
  int32_t max_id_ = -1;
};

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_TOKEN_TABLE_H_
