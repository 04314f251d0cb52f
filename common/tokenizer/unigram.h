// The Unigram model of Hugging Face `tokenizers` (SentencePiece's unigram language model, as T5 and
// Flan-T5 use it): every piece has a score (a log probability), and a word becomes the
// segmentation whose pieces' scores sum highest (Viterbi). A character no piece covers becomes the
// unknown piece, scored 10 below the lowest piece, and runs of unknown pieces are fused into one
// (the library always fuses); with byte_fallback such a run becomes its `<0xNN>` byte pieces.
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_UNIGRAM_H_
#define LLMCTL_COMMON_TOKENIZER_UNIGRAM_H_

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/model.h"
#include "common/tokenizer/token_table.h"

namespace llmctl::tokenizer_internal {

struct UnigramPiece {
  std::string text;
  double score = 0.0;
};

class UnigramModel : public Model {
 public:
  // A piece's id is its index in `vocab`. Fails when `unk_id` is set but outside `vocab`, as the
  // library does. `vocab` is freed once its pieces are in the model's table, before the trie is
  // built from the table, so that a load holds the parsed list or the trie, never both.
  static StatusOr<std::unique_ptr<UnigramModel>> Create(std::deque<UnigramPiece> vocab,
                                                        std::optional<int32_t> unk_id,
                                                        bool byte_fallback);

  Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::optional<std::string_view> IdToToken(int32_t id) const override;
  size_t size() const override { return scores_.size(); }
  int32_t max_id() const override { return static_cast<int32_t>(scores_.size()) - 1; }

 private:
  UnigramModel() = default;
  // Builds the trie over the pieces in pieces_, once they are all set and indexed.
  void BuildTrie();
  // The child of `node` along `byte`, or -1.
  int32_t Child(int32_t node, unsigned char byte) const;
  // Appends the ids of a run of unknown pieces (or of pieces that are the unknown token itself,
  // which the library fuses too): the vocabulary's id for the whole run if it has one, else its
  // byte pieces under byte_fallback, else the unknown id.
  void AppendFusedUnknown(std::string_view run, std::vector<int32_t>* ids) const;

  // Constant after construction.
  // Each piece's bytes once, for piece -> id (a piece listed twice: its last id, as in the library)
  // and id -> piece, where a vector by id beside a hash map held T5's 32,100 pieces twice.
  TokenTable pieces_;
  std::vector<double> scores_;  // by id
  // The earlier ids of a piece listed again, each to its last id: the table keeps only that one,
  // while the library answers every id with its own entry. Empty but in a malformed file.
  std::unordered_map<int32_t, int32_t> relisted_ids_;
  // A byte trie over the pieces, for the pieces that start at each position of a word: its nodes
  // numbered breadth first, each node's children in ascending byte order, so that node n's
  // children are the nodes [trie_first_child_[n], trie_first_child_[n + 1]) and one binary search
  // of their bytes finds an edge. 9 bytes a node in three flat arrays, where a hash node per edge
  // beside a vector of nodes took about 42: T5's 32,100 pieces make 135,443 nodes.
  std::vector<int32_t> trie_first_child_;  // by node, and one past the last node
  std::vector<unsigned char> trie_bytes_;  // by node: the byte on the edge into it (0 at the root)
  std::vector<int32_t> trie_piece_ids_;    // by node: the piece that ends there, or -1
  std::optional<int32_t> unk_id_;
  double unknown_score_ = 0.0;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_ids_;  // id of "<0xNN>", -1 when absent
};

// The double the library reads for a JSON number that nlohmann read as `value`. The library's JSON
// parser (serde_json without its float_roundtrip feature) computes significand / 10^k in two
// roundings, so for about one score in sixteen of a SentencePiece model it lands one ulp away from
// the correctly rounded value; Viterbi ties are decided by those last bits. Exact for numbers
// written in their shortest round-trip form, as tokenizers and Python's json write them.
StatusOr<double> LibraryJsonDouble(double value);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_UNIGRAM_H_
