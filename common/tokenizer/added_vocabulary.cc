#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <limits>

#include "common/tokenizer/regex.h"
#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

// The single_word and lstrip/rstrip rules: the library tests these with Rust's regex crate, where
// \s is White_Space and \w is [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}].
bool IsWordChar(char32_t cp) {
  static const Pattern* const word = [] {
    auto compiled = Pattern::Regex(R"(^[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])");
    return compiled.ok() ? compiled->release() : nullptr;
  }();
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  if (word == nullptr) return false;
  std::string encoded;
  AppendUtf8(cp, &encoded);
  std::vector<MatchSpan> matches;
  return word->FindAll(encoded, &matches).ok() && !matches.empty();
}

// Start of the last character of text[0, end).
size_t PreviousCharStart(std::string_view text, size_t end) {
  size_t pos = end - 1;
  while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

char32_t CharAt(std::string_view text, size_t pos) { return DecodeUtf8(text, &pos); }

}  // namespace

void AddedVocabulary::Trie::Insert(std::string_view pattern, int32_t entry) {
  if (nodes.empty()) nodes.emplace_back();
  int32_t node = 0;
  for (char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t next = -1;
    for (const auto& [b, child] : nodes[node].children) {
      if (b == byte) next = child;
    }
    if (next < 0) {
      next = static_cast<int32_t>(nodes.size());
      nodes[node].children.emplace_back(byte, next);
      nodes.emplace_back();
    }
    node = next;
  }
  nodes[node].entry = entry;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
}

int32_t AddedVocabulary::Trie::LongestAt(std::string_view text, size_t pos, size_t* length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    int32_t next = -1;
    for (const auto& [b, child] : nodes[node].children) {
      if (b == byte) next = child;
    }
    if (next < 0) break;
    node = next;
    if (nodes[node].entry >= 0) {
      best = nodes[node].entry;
      *length = i + 1 - pos;
    }
  }
  return best;
}

StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Create(
    const std::vector<AddedToken>& tokens, const Model& model, const Normalizer* normalizer) {
  std::unique_ptr<AddedVocabulary> vocab(new AddedVocabulary());
  int64_t next_id = static_cast<int64_t>(model.size());
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;  // the library ignores these
    std::optional<int32_t> id = vocab->TokenToId(token.content);
    if (!id) id = model.TokenToId(token.content);
    if (!id) {
      if (next_id > std::numeric_limits<int32_t>::max()) {
        return InvalidArgumentError("too many added tokens");
      }
      id = static_cast<int32_t>(next_id++);
    }
    std::string pattern = token.content;
    if (token.normalized && normalizer != nullptr) RETURN_IF_ERROR(normalizer->Normalize(&pattern));
    vocab->by_content_[token.content] = *id;
    if (token.special) vocab->special_.insert(token.content);
    Entry entry{token, *id, std::move(pattern)};
    const auto [it, inserted] = vocab->by_id_.emplace(*id, vocab->entries_.size());
    if (inserted) {
      vocab->entries_.push_back(std::move(entry));
    } else {
      vocab->entries_[it->second] = std::move(entry);  // a later definition of the same id wins
    }
    vocab->max_id_ = std::max(vocab->max_id_, *id);
  }
  StringIdMap seen_patterns[2];
  for (size_t i = 0; i < vocab->entries_.size(); ++i) {
    const Entry& entry = vocab->entries_[i];
    if (entry.pattern.empty()) continue;  // normalized away: it can never match
    const int which = entry.token.normalized ? 1 : 0;
    const auto [it, inserted] = seen_patterns[which].emplace(entry.pattern, entry.id);
    if (!inserted) {
      // The library's matcher refuses duplicate patterns too, so such a file never loads there.
      return InvalidArgumentError("added tokens with ids " + std::to_string(it->second) + " and " +
                                  std::to_string(entry.id) + " both match \"" + entry.pattern +
                                  "\"");
    }
    (entry.token.normalized ? vocab->normalized_trie_ : vocab->raw_trie_)
        .Insert(entry.pattern, static_cast<int32_t>(i));
  }
  return vocab;
}

std::optional<int32_t> AddedVocabulary::TokenToId(std::string_view content) const {
  const auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::IdToToken(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &entries_[it->second].pattern;
}

void AddedVocabulary::FindSplits(std::string_view text, const Trie& trie,
                                 std::vector<Split>* splits) const {
  splits->clear();
  if (text.empty()) return;
  if (trie.nodes.empty()) {
    splits->push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    const int32_t index = trie.first_byte[static_cast<unsigned char>(text[pos])]
                              ? trie.LongestAt(text, pos, &length)
                              : -1;
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;  // the next match is searched after this one even when this one is rejected
    const Entry& entry = entries_[index];
    if (entry.token.single_word) {
      const bool start_space =
          start == 0 || !IsWordChar(CharAt(text, PreviousCharStart(text, start)));
      const bool stop_space = stop == text.size() || !IsWordChar(CharAt(text, stop));
      if (!start_space || !stop_space) continue;
    }
    if (entry.token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t prev = PreviousCharStart(text, new_start);
        if (!IsWhiteSpace(CharAt(text, prev))) break;
        new_start = prev;
      }
      // Spaces an earlier token already took stay with it.
      start = std::max(new_start, start_offset);
    }
    if (entry.token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!IsWhiteSpace(DecodeUtf8(text, &next))) break;
        stop = next;
      }
    }
    if (start_offset < start) splits->push_back({start_offset, start, -1});
    splits->push_back({start, stop, entry.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) splits->push_back({start_offset, text.size(), -1});
}

Status AddedVocabulary::ExtractAndNormalize(std::string_view text, const Normalizer* normalizer,
                                            std::vector<Piece>* pieces) const {
  pieces->clear();
  std::vector<Split> raw;
  std::vector<Split> normalized;
  FindSplits(text, raw_trie_, &raw);
  for (const Split& split : raw) {
    if (split.id >= 0) {
      pieces->push_back({std::string(), split.id, split.begin == 0});
      continue;
    }
    std::string piece(text.substr(split.begin, split.end - split.begin));
    if (normalizer != nullptr) RETURN_IF_ERROR(normalizer->Normalize(&piece));
    FindSplits(piece, normalized_trie_, &normalized);
    for (const Split& sub : normalized) {
      if (sub.id >= 0) {
        pieces->push_back({std::string(), sub.id, false});
      } else {
        pieces->push_back(
            {piece.substr(sub.begin, sub.end - sub.begin), -1, split.begin == 0 && sub.begin == 0});
      }
    }
  }
  return Status::Ok();
}

}  // namespace llmctl::tokenizer_internal
