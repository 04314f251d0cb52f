#include "common/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "common/tokenizer/regex.h"
#include "common/tokenizer/stage_common.h"
#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

// Splitting a piece around pattern matches (the library's NormalizedString::split).

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Segment {
  size_t begin;
  size_t end;
  bool is_match;
};

// The whole text as alternating gaps and matches, like the library's Pattern::find_matches.
std::vector<Segment> ToSegments(size_t text_size, const std::vector<MatchSpan>& matches,
                                bool invert) {
  std::vector<Segment> segments;
  segments.reserve(2 * matches.size() + 1);
  size_t prev = 0;
  for (const MatchSpan& m : matches) {
    if (prev != m.begin) segments.push_back({prev, m.begin, invert});
    segments.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev != text_size) segments.push_back({prev, text_size, invert});
  return segments;
}

// Turns segments into the byte ranges that become pieces; the fold for each behavior is the
// library's.
std::vector<std::pair<size_t, size_t>> ApplyBehavior(const std::vector<Segment>& segments,
                                                     SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(segments.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& s : segments) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

void AppendSubPieces(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& ranges,
                     std::vector<Piece>* out) {
  for (const auto& [begin, end] : ranges) {
    if (begin >= end) continue;  // the library drops empty pieces
    out->push_back({piece.text.substr(begin, end - begin), -1, piece.at_origin && begin == 0});
  }
}

Status SplitPiece(const Piece& piece, const Pattern& pattern, bool invert, SplitBehavior behavior,
                  std::vector<Piece>* out) {
  std::vector<MatchSpan> matches;
  RETURN_IF_ERROR(pattern.FindAll(piece.text, &matches));
  AppendSubPieces(piece, ApplyBehavior(ToSegments(piece.text.size(), matches, invert), behavior),
                  out);
  return Status::Ok();
}

// Runs `split` on every piece that is not an added token and drops the empty results.
template <typename SplitFn>
Status SplitPieces(std::vector<Piece>* pieces, const SplitFn& split) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (Piece& piece : *pieces) {
    if (piece.added_id >= 0) {
      out.push_back(std::move(piece));
      continue;
    }
    const size_t first = out.size();
    RETURN_IF_ERROR(split(piece, &out));
    out.erase(std::remove_if(out.begin() + first, out.end(),
                             [](const Piece& p) { return p.added_id < 0 && p.text.empty(); }),
              out.end());
  }
  *pieces = std::move(out);
  return Status::Ok();
}

StatusOr<SplitBehavior> ParseBehavior(const JsonSource& src, const Json& json,
                                      const std::string& path) {
  ASSIGN_OR_RETURN(const std::string name, RequireString(src, json, path, "behavior"));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return src.Invalid(JoinPath(path, "behavior"), "unknown split behavior \"" + name + "\"");
}

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit = text.find(from); hit != std::string_view::npos; hit = text.find(from, pos)) {
    out.append(text.substr(pos, hit - pos)).append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  Status PreTokenize(std::vector<Piece>* pieces) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->PreTokenize(pieces));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Pattern> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  Status PreTokenize(std::vector<Piece>* pieces) const override {
    return SplitPieces(pieces, [this](const Piece& piece, std::vector<Piece>* out) {
      return SplitPiece(piece, *pattern_, invert_, behavior_, out);
    });
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Words between runs of White_Space (Rust's char::is_whitespace), which are dropped.
class WhitespaceSplitPreTokenizer : public PreTokenizer {
 public:
  Status PreTokenize(std::vector<Piece>* pieces) const override {
    return SplitPieces(pieces, [](const Piece& piece, std::vector<Piece>* out) {
      std::vector<std::pair<size_t, size_t>> words;
      size_t word_begin = std::string::npos;
      for (size_t pos = 0; pos < piece.text.size();) {
        const size_t char_begin = pos;
        if (IsWhiteSpace(DecodeUtf8(piece.text, &pos))) {
          if (word_begin != std::string::npos) words.emplace_back(word_begin, char_begin);
          word_begin = std::string::npos;
        } else if (word_begin == std::string::npos) {
          word_begin = char_begin;
        }
      }
      if (word_begin != std::string::npos) words.emplace_back(word_begin, piece.text.size());
      AppendSubPieces(piece, words, out);
      return Status::Ok();
    });
  }
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> gpt2_regex)
      : add_prefix_space_(add_prefix_space), gpt2_regex_(std::move(gpt2_regex)) {}
  Status PreTokenize(std::vector<Piece>* pieces) const override {
    RETURN_IF_ERROR(SplitPieces(pieces, [this](const Piece& piece, std::vector<Piece>* out) {
      Piece prefixed = piece;
      // (Concatenating rather than insert(0, ...) sidesteps a false -Wrestrict in GCC 12.)
      if (add_prefix_space_ && !piece.text.starts_with(' ')) prefixed.text = " " + piece.text;
      if (gpt2_regex_ == nullptr) {
        out->push_back(std::move(prefixed));
        return Status::Ok();
      }
      return SplitPiece(prefixed, *gpt2_regex_, false, SplitBehavior::kIsolated, out);
    }));
    for (Piece& piece : *pieces) {
      if (piece.added_id < 0) piece.text = ToByteLevel(piece.text);
    }
    return Status::Ok();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> gpt2_regex_;  // null when use_regex is false
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split,
                        std::unique_ptr<Pattern> replacement_pattern)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        replacement_pattern_(std::move(replacement_pattern)) {}
  Status PreTokenize(std::vector<Piece>* pieces) const override {
    return SplitPieces(pieces, [this](const Piece& piece, std::vector<Piece>* out) {
      Piece replaced = piece;
      replaced.text = ReplaceAll(piece.text, " ", replacement_);
      const bool starts_with_replacement = replaced.text.starts_with(replacement_);
      if (!starts_with_replacement && (scheme_ == PrependScheme::kAlways ||
                                       (scheme_ == PrependScheme::kFirst && piece.at_origin))) {
        replaced.text.insert(0, replacement_);
      }
      if (!split_) {
        out->push_back(std::move(replaced));
        return Status::Ok();
      }
      return SplitPiece(replaced, *replacement_pattern_, false, SplitBehavior::kMergedWithNext,
                        out);
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  std::unique_ptr<Pattern> replacement_pattern_;
};

}  // namespace

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const JsonSource& src, const Json& json,
                                                          const std::string& path, int depth) {
  if (depth > kMaxNesting) return src.Invalid(path, "pre-tokenizers nested too deeply");
  ASSIGN_OR_RETURN(const std::string type, ComponentType(src, json, path));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, RequireMember(src, json, path, "pretokenizers"));
    const std::string list_path = JoinPath(path, "pretokenizers");
    if (!list->is_array()) return src.Invalid(list_path, "expected an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParsePreTokenizer(src, (*list)[i], IndexPath(list_path, i), depth + 1));
      steps.push_back(std::move(step));
    }
    return MakeStage<PreTokenizer, SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(src, json, path));
    ASSIGN_OR_RETURN(const SplitBehavior behavior, ParseBehavior(src, json, path));
    ASSIGN_OR_RETURN(const bool invert, OptionalBool(src, json, path, "invert", false));
    return MakeStage<PreTokenizer, SplitPreTokenizer>(std::move(pattern), behavior, invert);
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(const bool add_prefix_space,
                     OptionalBool(src, json, path, "add_prefix_space", true));
    ASSIGN_OR_RETURN(const bool use_regex, OptionalBool(src, json, path, "use_regex", true));
    std::unique_ptr<Pattern> regex;
    if (use_regex) {
      // GPT-2's pattern, built into the library's ByteLevel pre-tokenizer.
      ASSIGN_OR_RETURN(
          regex,
          Pattern::Regex(
              R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"));
    }
    return MakeStage<PreTokenizer, ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string replacement, RequireChar(src, json, path, "replacement"));
    ASSIGN_OR_RETURN(const PrependScheme scheme, ParsePrependScheme(src, json, path));
    ASSIGN_OR_RETURN(const bool split, OptionalBool(src, json, path, "split", true));
    ASSIGN_OR_RETURN(auto replacement_pattern, Pattern::Literal(replacement));
    return MakeStage<PreTokenizer, MetaspacePreTokenizer>(std::move(replacement), scheme, split,
                                                          std::move(replacement_pattern));
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(const bool individual,
                     OptionalBool(src, json, path, "individual_digits", false));
    ASSIGN_OR_RETURN(auto digit, Pattern::Regex(R"(\p{N})"));  // Rust's char::is_numeric
    return MakeStage<PreTokenizer, SplitPreTokenizer>(
        std::move(digit), individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
        false);
  }
  if (type == "WhitespaceSplit") return MakeStage<PreTokenizer, WhitespaceSplitPreTokenizer>();
  if (type == "Whitespace" || type == "BertPreTokenizer" || type == "Punctuation" ||
      type == "CharDelimiterSplit" || type == "UnicodeScripts" || type == "FixedLength") {
    return src.Unsupported(JoinPath(path, "type"),
                           "pre-tokenizer \"" + type +
                               "\" is not supported (supported: Sequence, Split, ByteLevel, "
                               "Metaspace, Digits, WhitespaceSplit)");
  }
  return src.Invalid(JoinPath(path, "type"), "unknown pre-tokenizer type \"" + type + "\"");
}

}  // namespace llmctl::tokenizer_internal
