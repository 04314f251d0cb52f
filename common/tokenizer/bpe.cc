#include "common/tokenizer/bpe.h"

#include <queue>
#include <tuple>

#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // "▁", U+2581

// One symbol of a word being merged: a doubly linked list inside a vector, as in the library's
// Word.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};

// Lowest rank first, then leftmost: the library's merge order, which decides ties between equal
// pairs.
struct LaterMerge {
  bool operator()(const QueuedMerge& a, const QueuedMerge& b) const {
    return std::tie(a.rank, a.pos) > std::tie(b.rank, b.pos);
  }
};

void AddSymbol(int32_t id, int32_t len, std::vector<Symbol>* symbols) {
  const auto index = static_cast<int32_t>(symbols->size());
  if (!symbols->empty()) symbols->back().next = index;
  symbols->push_back({id, index - 1, -1, len});
}

// Merges the word's symbols pair by pair, lowest rank first, until no pair of neighbours has a
// merge: `find_merge(left, right)` is the merge of two ids (its rank and new id), or null.
template <typename FindMerge>
void ApplyMerges(const FindMerge& find_merge, std::vector<Symbol>* word) {
  std::vector<Symbol>& symbols = *word;
  std::priority_queue<QueuedMerge, std::vector<QueuedMerge>, LaterMerge> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.len == 0 || current.next == -1) continue;
    const Symbol right = symbols[current.next];
    // Skip entries made stale by an earlier merge of either side.
    const auto* m = find_merge(current.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;

    symbols[current.next].len = 0;
    current.id = top.new_id;
    current.len += right.len;
    current.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (current.prev >= 0) {
      if (const auto* left_merge = find_merge(symbols[current.prev].id, current.id)) {
        queue.push({left_merge->rank, current.prev, left_merge->new_id});
      }
    }
    if (current.next >= 0) {
      if (const auto* right_merge = find_merge(current.id, symbols[current.next].id)) {
        queue.push({right_merge->rank, top.pos, right_merge->new_id});
      }
    }
  }
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(TokenTable vocab, const MergeList& merges,
                                                     BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->vocab_ = std::move(vocab);
  model->vocab_.IndexIds();
  model->options_ = std::move(options);
  model->byte_ids_.fill(-1);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    if (auto id = model->TokenToId(name)) model->byte_ids_[b] = *id;
  }
  model->merges_.reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left, right] = merges[rank];
    const auto unknown = [&](std::string_view token) {
      return InvalidArgumentError(std::string("merges[")
                                      .append(std::to_string(rank))
                                      .append("]: token \"")
                                      .append(token)
                                      .append("\" is not in the vocab"));
    };
    const std::optional<int32_t> left_id = model->TokenToId(left);
    if (!left_id) return unknown(left);
    const std::optional<int32_t> right_id = model->TokenToId(right);
    if (!right_id) return unknown(right);
    merged.assign(left).append(right);
    const std::optional<int32_t> merged_id = model->TokenToId(merged);
    if (!merged_id) {
      return InvalidArgumentError("merges[" + std::to_string(rank) + "]: merged token \"" + merged +
                                  "\" is not in the vocab");
    }
    // A repeated pair keeps its last rank, as the library's map does.
    model->merges_[PairKey(*left_id, *right_id)] = {static_cast<int32_t>(rank), *merged_id};
  }
  model->split_at_metaspace_ = !model->options_.ignore_merges && model->TokenToId(kMetaspace);
  for (size_t i = 0; i < merges.size() && model->split_at_metaspace_; ++i) {
    const auto [left, right] = merges[i];
    if (right.starts_with(kMetaspace) && !left.ends_with(kMetaspace)) {
      model->split_at_metaspace_ = false;
    }
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  return vocab_.IdOf(token);
}

std::optional<std::string_view> BpeModel::IdToToken(int32_t id) const { return vocab_.TokenOf(id); }

Status BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return Status::Ok();
  if (options_.ignore_merges) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      return Status::Ok();
    }
  }
  if (!split_at_metaspace_) return TokenizeCached(word, ids);
  // Cut before every "▁" that follows another character than "▁" (see split_at_metaspace_).
  size_t begin = 0;
  for (size_t pos = word.find(kMetaspace, 1); pos != std::string_view::npos;
       pos = word.find(kMetaspace, pos + kMetaspace.size())) {
    if (word.substr(0, pos).ends_with(kMetaspace)) continue;
    RETURN_IF_ERROR(TokenizeCached(word.substr(begin, pos - begin), ids));
    begin = pos;
  }
  return TokenizeCached(word.substr(begin), ids);
}

Status BpeModel::TokenizeCached(std::string_view word, std::vector<int32_t>* ids) const {
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return Status::Ok();
    }
  }
  const size_t first = ids->size();
  RETURN_IF_ERROR(MergeWord(word, ids));
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kMaxCacheEntries) {
      cache_.emplace(std::string(word), std::vector<int32_t>(ids->begin() + first, ids->end()));
    }
  }
  return Status::Ok();
}

Status BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  // A run of unknown characters waiting to become one unk token (fused) or several.
  int32_t pending_unk_id = -1;
  int32_t pending_unk_len = 0;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t len =
        std::min(Utf8SequenceLength(static_cast<unsigned char>(word[pos])), word.size() - pos);
    const std::string_view ch = word.substr(pos, len);
    pos += len;
    if (auto id = TokenToId(ch)) {
      if (pending_unk_id >= 0) {
        AddSymbol(pending_unk_id, pending_unk_len, &symbols);
        pending_unk_id = -1;
      }
      AddSymbol(*id, static_cast<int32_t>(len), &symbols);
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes_known = true;
      for (char c : ch) all_bytes_known &= byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes_known) {
        // Like the library, a pending (fused) unknown token is not flushed here: it lands after
        // these bytes.
        for (char c : ch) AddSymbol(byte_ids_[static_cast<unsigned char>(c)], 1, &symbols);
        continue;
      }
    }
    if (!options_.unk_token.has_value()) continue;  // no unk token: the character is dropped
    const std::optional<int32_t> unk_id = TokenToId(*options_.unk_token);
    if (!unk_id) {
      return FailedPreconditionError(
          "unk_token \"" + *options_.unk_token +
          "\" is needed for an unknown character but is not in the vocab");
    }
    if (pending_unk_id >= 0 && options_.fuse_unk) {
      pending_unk_len += static_cast<int32_t>(len);
    } else {
      if (pending_unk_id >= 0) AddSymbol(pending_unk_id, pending_unk_len, &symbols);
      pending_unk_id = *unk_id;
      pending_unk_len = static_cast<int32_t>(len);
    }
  }
  if (pending_unk_id >= 0) AddSymbol(pending_unk_id, pending_unk_len, &symbols);

  const auto find_merge = [this](int32_t left, int32_t right) -> const Merge* {
    const auto it = merges_.find(PairKey(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  ApplyMerges(find_merge, &symbols);
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids->push_back(s.id);
  }
  return Status::Ok();
}

}  // namespace llmctl::tokenizer_internal
