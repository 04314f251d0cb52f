#include "common/tokenizer/unigram.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

// The library's K_UNK_PENALTY: an unknown character scores this far below the lowest piece, so any
// segmentation into known pieces beats it.
constexpr double kUnknownPenalty = 10.0;

// The best segmentation of word[0, end) found so far, as the library's BestPathNode.
struct BestPath {
  int32_t piece_id = -1;
  double score = 0.0;
  int64_t start = -1;  // where its last piece starts; -1 while no segmentation reaches `end`
};

// 1e0 ... 1e308, as double literals (correctly rounded), like serde_json's POW10 table.
const std::array<double, 309>& PowersOfTen() {
  static const std::array<double, 309> table = [] {
    std::array<double, 309> out{};
    for (int i = 0; i < 309; ++i) {
      const std::string literal = "1e" + std::to_string(i);
      out[i] = std::strtod(literal.c_str(), nullptr);
    }
    return out;
  }();
  return table;
}

}  // namespace

StatusOr<double> LibraryJsonDouble(double value) {
  if (!std::isfinite(value)) return InvalidArgumentError("number out of range");
  // The shortest digits that read back as `value`: the text the file holds.
  char text[64];
  const std::to_chars_result printed = std::to_chars(text, text + sizeof(text), value);
  if (printed.ec != std::errc()) return InternalError("cannot print a double");
  const std::string_view digits(text, printed.ptr - text);
  bool negative = false;
  uint64_t significand = 0;
  int64_t exponent = 0;
  bool after_point = false;
  bool significand_full = false;  // serde_json ignores digits once the next one would overflow
  size_t i = 0;
  if (i < digits.size() && digits[i] == '-') {
    negative = true;
    ++i;
  }
  for (; i < digits.size() && digits[i] != 'e'; ++i) {
    if (digits[i] == '.') {
      after_point = true;
      continue;
    }
    const auto digit = static_cast<uint64_t>(digits[i] - '0');
    if (!significand_full && significand <= (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      significand = significand * 10 + digit;
      if (after_point) --exponent;
    } else {
      significand_full = true;
      if (!after_point) ++exponent;
    }
  }
  if (i < digits.size()) {
    int64_t written_exponent = 0;
    const char* begin = digits.data() + i + 1;
    if (*begin == '+') ++begin;
    std::from_chars(begin, digits.data() + digits.size(), written_exponent);
    exponent += written_exponent;
  }
  // serde_json's f64_from_parts without float_roundtrip.
  double result = static_cast<double>(significand);
  const std::array<double, 309>& pow10 = PowersOfTen();
  while (true) {
    const uint64_t magnitude = exponent < 0 ? -static_cast<uint64_t>(exponent) : exponent;
    if (magnitude < pow10.size()) {
      if (exponent >= 0) {
        result *= pow10[magnitude];
        if (std::isinf(result)) return InvalidArgumentError("number out of range");
      } else {
        result /= pow10[magnitude];
      }
      break;
    }
    if (result == 0.0) break;
    if (exponent >= 0) return InvalidArgumentError("number out of range");
    result /= 1e308;
    exponent += 308;
  }
  return negative ? -result : result;
}

StatusOr<std::unique_ptr<UnigramModel>> UnigramModel::Create(std::deque<UnigramPiece> vocab,
                                                             std::optional<int32_t> unk_id,
                                                             bool byte_fallback) {
  if (vocab.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgumentError("too many pieces");
  }
  if (unk_id.has_value() && static_cast<size_t>(*unk_id) >= vocab.size()) {
    return InvalidArgumentError("unk_id " + std::to_string(*unk_id) +
                                " is not in the vocabulary of " + std::to_string(vocab.size()) +
                                " pieces");
  }
  std::unique_ptr<UnigramModel> model(new UnigramModel());
  model->unk_id_ = unk_id;
  model->byte_fallback_ = byte_fallback;
  double min_score = std::numeric_limits<double>::infinity();
  model->scores_.reserve(vocab.size());
  std::vector<int32_t> relisted;  // ids whose piece comes again later
  for (size_t id = 0; id < vocab.size(); ++id) {
    const UnigramPiece& piece = vocab[id];
    min_score = std::min(min_score, piece.score);
    model->scores_.push_back(piece.score);
    if (std::optional<int32_t> earlier = model->pieces_.IdOf(piece.text)) {
      relisted.push_back(*earlier);
    }
    // A piece listed twice is found as its last entry, whose score then counts, as in the library.
    model->pieces_.Set(piece.text, static_cast<int32_t>(id));
  }
  for (const int32_t id : relisted) {
    model->relisted_ids_[id] = *model->pieces_.IdOf(vocab[id].text);
  }
  // Freed here, not when Create returns: the trie is built from the table, and the load then never
  // holds the parser's list and the trie at once.
  vocab = std::deque<UnigramPiece>();
  model->pieces_.IndexIds();
  model->BuildTrie();
  model->unknown_score_ = min_score - kUnknownPenalty;
  model->byte_ids_.fill(-1);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    if (auto id = model->TokenToId(name)) model->byte_ids_[b] = *id;
  }
  return model;
}

void UnigramModel::BuildTrie() {
  // The ids of the distinct pieces (TokenOf has no piece for the earlier ids of a piece listed
  // twice) in their pieces' byte order: the pieces under a node are then a range of them, the one
  // that ends there first, and its children's ranges follow one another in their bytes' order.
  const auto piece = [this](int32_t id) { return *pieces_.TokenOf(id); };
  std::vector<int32_t> sorted;
  sorted.reserve(pieces_.size());
  for (int32_t id = 0; id <= pieces_.max_id(); ++id) {
    if (pieces_.TokenOf(id)) sorted.push_back(id);
  }
  std::sort(sorted.begin(), sorted.end(),
            [&piece](int32_t a, int32_t b) { return piece(a) < piece(b); });
  // A node for each distinct prefix: each piece adds one for each byte past the prefix it shares
  // with the piece before it.
  size_t nodes = 1;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string_view text = piece(sorted[i]);
    const std::string_view before = i > 0 ? piece(sorted[i - 1]) : std::string_view();
    nodes +=
        text.end() - std::mismatch(text.begin(), text.end(), before.begin(), before.end()).first;
  }
  trie_first_child_.reserve(nodes + 1);
  trie_bytes_.reserve(nodes);
  trie_piece_ids_.reserve(nodes);
  trie_bytes_.push_back(0);  // the root
  trie_piece_ids_.push_back(-1);
  // Breadth first: the nodes of one depth, each as its range of `sorted`, make the next depth's
  // nodes in order, so that a node's children are numbered one after another.
  struct Range {
    uint32_t begin;
    uint32_t end;
  };
  std::vector<Range> depth_nodes = {{0, static_cast<uint32_t>(sorted.size())}};
  std::vector<Range> next_depth_nodes;
  for (size_t depth = 0; !depth_nodes.empty(); ++depth) {
    const size_t first_node = trie_first_child_.size();
    for (size_t n = 0; n < depth_nodes.size(); ++n) {
      trie_first_child_.push_back(static_cast<int32_t>(trie_bytes_.size()));
      uint32_t i = depth_nodes[n].begin;
      const uint32_t end = depth_nodes[n].end;
      // The empty piece sits on the root, where no search looks: the library never matches it
      // either.
      if (i < end && piece(sorted[i]).size() == depth) {
        trie_piece_ids_[first_node + n] = sorted[i++];
      }
      while (i < end) {
        const char byte = piece(sorted[i])[depth];
        uint32_t j = i + 1;
        while (j < end && piece(sorted[j])[depth] == byte) ++j;
        trie_bytes_.push_back(static_cast<unsigned char>(byte));
        trie_piece_ids_.push_back(-1);
        next_depth_nodes.push_back({i, j});
        i = j;
      }
    }
    depth_nodes.swap(next_depth_nodes);
    next_depth_nodes.clear();
  }
  trie_first_child_.push_back(static_cast<int32_t>(trie_bytes_.size()));
}

int32_t UnigramModel::Child(int32_t node, unsigned char byte) const {
  const unsigned char* const begin = trie_bytes_.data() + trie_first_child_[node];
  const unsigned char* const end = trie_bytes_.data() + trie_first_child_[node + 1];
  const unsigned char* const found = std::lower_bound(begin, end, byte);
  return found != end && *found == byte ? static_cast<int32_t>(found - trie_bytes_.data()) : -1;
}

Status UnigramModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  // Forward pass: best[end] is the best segmentation of word[0, end). Positions are visited in
  // order and a candidate replaces the best only when strictly better, so ties keep the earliest
  // found, as in the library's encode_optimized.
  std::vector<BestPath> best(word.size() + 1);
  for (size_t start = 0; start < word.size();) {
    const size_t char_length = Utf8SequenceLength(static_cast<unsigned char>(word[start]));
    const double score_so_far = best[start].score;
    bool covers_one_character = false;
    const auto offer = [&](size_t end, int32_t piece_id, double score) {
      BestPath& target = best[end];
      const double candidate = score + score_so_far;
      if (target.start < 0 || candidate > target.score) {
        target = {piece_id, candidate, static_cast<int64_t>(start)};
        return true;
      }
      return false;
    };
    int32_t node = 0;
    for (size_t end = start; end < word.size(); ++end) {
      node = Child(node, static_cast<unsigned char>(word[end]));
      if (node < 0) break;
      const int32_t piece_id = trie_piece_ids_[node];
      if (piece_id < 0) continue;
      offer(end + 1, piece_id, scores_[piece_id]);
      if (end + 1 - start == char_length) covers_one_character = true;
    }
    if (!covers_one_character && offer(start + char_length, unk_id_.value_or(-1), unknown_score_) &&
        !unk_id_) {
      return InvalidArgumentError("unknown character \"" +
                                  std::string(word.substr(start, char_length)) +
                                  "\" and the Unigram model has no unk_id");
    }
    start += char_length;
  }

  // Backward pass, fusing runs of unknown pieces.
  std::vector<std::pair<size_t, size_t>> pieces;  // [begin, end) in reverse order
  std::vector<int32_t> piece_ids;
  size_t end = word.size();
  while (end > 0) {
    const BestPath& path = best[end];
    const auto begin = static_cast<size_t>(path.start);
    if (unk_id_ && path.piece_id == *unk_id_ && !pieces.empty() && piece_ids.back() == -1) {
      pieces.back().first = begin;  // extends the run found just after this piece
    } else {
      pieces.emplace_back(begin, end);
      piece_ids.push_back(unk_id_ && path.piece_id == *unk_id_ ? -1 : path.piece_id);
    }
    end = begin;
  }
  for (size_t i = pieces.size(); i-- > 0;) {
    if (piece_ids[i] >= 0) {
      ids->push_back(piece_ids[i]);
    } else {
      const auto [begin, run_end] = pieces[i];
      AppendFusedUnknown(word.substr(begin, run_end - begin), ids);
    }
  }
  return Status::Ok();
}

void UnigramModel::AppendFusedUnknown(std::string_view run, std::vector<int32_t>* ids) const {
  if (std::optional<int32_t> id = TokenToId(run)) {
    ids->push_back(*id);
    return;
  }
  if (byte_fallback_ && std::all_of(run.begin(), run.end(), [this](char c) {
        return byte_ids_[static_cast<unsigned char>(c)] >= 0;
      })) {
    for (const char c : run) ids->push_back(byte_ids_[static_cast<unsigned char>(c)]);
    return;
  }
  ids->push_back(*unk_id_);  // a run exists only when unk_id does
}

std::optional<int32_t> UnigramModel::TokenToId(std::string_view token) const {
  return pieces_.IdOf(token);
}

std::optional<std::string_view> UnigramModel::IdToToken(int32_t id) const {
  const auto relisted = relisted_ids_.find(id);
  return pieces_.TokenOf(relisted == relisted_ids_.end() ? id : relisted->second);
}

}  // namespace llmctl::tokenizer_internal
