#include "trainer/tokenizer/pipeline.h"

#include <algorithm>
#include <utility>

#include "trainer/tokenizer/precompiled.h"
#include "trainer/tokenizer/regex.h"
#include "trainer/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

// Builds a stage as its interface type (StatusOr cannot convert unique_ptr<Derived> by itself).
template <typename Base, typename Derived, typename... Args>
StatusOr<std::unique_ptr<Base>> MakeStage(Args&&... args) {
  return std::unique_ptr<Base>(std::make_unique<Derived>(std::forward<Args>(args)...));
}

// ------------------------------------------------------------------------------------------------------------
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

// {"String": "..."} or {"Regex": "..."}.
StatusOr<std::unique_ptr<Pattern>> ParsePattern(const JsonSource& src, const Json& json,
                                                const std::string& path) {
  ASSIGN_OR_RETURN(const Json* pattern, RequireMember(src, json, path, "pattern"));
  const std::string pattern_path = JoinPath(path, "pattern");
  const Json* literal = FindMember(*pattern, "String");
  const Json* regex = FindMember(*pattern, "Regex");
  if ((literal == nullptr) == (regex == nullptr)) {
    return src.Invalid(pattern_path, R"(expected {"String": "..."} or {"Regex": "..."})");
  }
  const Json& value = literal != nullptr ? *literal : *regex;
  if (!value.is_string()) return src.Invalid(pattern_path, "expected a string");
  const auto& text = value.get_ref<const std::string&>();
  StatusOr<std::unique_ptr<Pattern>> compiled =
      literal != nullptr ? Pattern::Literal(text) : Pattern::Regex(text);
  if (!compiled.ok()) return src.Invalid(pattern_path, compiled.status().message());
  return std::move(*compiled);
}

// A field holding exactly one character (the library's `char`).
StatusOr<std::string> RequireChar(const JsonSource& src, const Json& json, const std::string& path,
                                  std::string_view key) {
  ASSIGN_OR_RETURN(std::string value, RequireString(src, json, path, key));
  if (value.empty() || Utf8SequenceLength(static_cast<unsigned char>(value[0])) != value.size()) {
    return src.Invalid(JoinPath(path, key), "expected exactly one character");
  }
  return value;
}

char32_t FirstCodePoint(std::string_view text) {
  size_t pos = 0;
  return DecodeUtf8(text, &pos);
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

Status ReplaceMatches(const Pattern& pattern, std::string_view content, std::string* text) {
  std::vector<MatchSpan> matches;
  RETURN_IF_ERROR(pattern.FindAll(*text, &matches));
  if (matches.empty()) return Status::Ok();
  std::string out;
  out.reserve(text->size());
  size_t pos = 0;
  for (const MatchSpan& m : matches) {
    out.append(*text, pos, m.begin - pos).append(content);
    pos = m.end;
  }
  out.append(*text, pos);
  *text = std::move(out);
  return Status::Ok();
}

std::string ToByteLevel(std::string_view text) {
  const ByteLevelAlphabet& alphabet = GetByteLevelAlphabet();
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) out += alphabet.byte_to_utf8[static_cast<unsigned char>(c)];
  return out;
}

enum class PrependScheme { kAlways, kFirst, kNever };

// Metaspace's prepend_scheme, or the older add_prefix_space flag.
StatusOr<PrependScheme> ParsePrependScheme(const JsonSource& src, const Json& json,
                                           const std::string& path) {
  PrependScheme scheme = PrependScheme::kAlways;
  const Json* scheme_json = FindMember(json, "prepend_scheme");
  if (scheme_json != nullptr) {
    const std::string name = scheme_json->is_string() ? scheme_json->get<std::string>() : "";
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else {
      return src.Invalid(JoinPath(path, "prepend_scheme"),
                         R"(expected "always", "first" or "never")");
    }
  }
  const Json* legacy = FindMember(json, "add_prefix_space");
  if (legacy != nullptr) {
    if (!legacy->is_boolean()) {
      return src.Invalid(JoinPath(path, "add_prefix_space"), "expected true or false");
    }
    if (!legacy->get<bool>()) {
      if (scheme_json != nullptr && scheme != PrependScheme::kNever) {
        return src.Invalid(path, "add_prefix_space does not match prepend_scheme");
      }
      scheme = PrependScheme::kNever;
    }
  }
  return scheme;
}

// ------------------------------------------------------------------------------------------------------------
// Normalizers

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->Normalize(text));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status Normalize(std::string* text) const override {
    return ReplaceMatches(*pattern_, content_, text);
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class NfcNormalizer : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    *text = NormalizeNfc(*text);
    return Status::Ok();
  }
};

class NfdNormalizer : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    *text = NormalizeNfd(*text);
    return Status::Ok();
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(std::string* text) const override {
    size_t begin = 0;
    size_t end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhiteSpace(DecodeUtf8(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && ((*text)[start] & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!IsWhiteSpace(DecodeUtf8(*text, &next))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return Status::Ok();
  }

 private:
  bool left_;
  bool right_;
};

class ByteLevelNormalizer : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    *text = ToByteLevel(*text);
    return Status::Ok();
  }
};

// ------------------------------------------------------------------------------------------------------------
// Pre-tokenizers

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

// ------------------------------------------------------------------------------------------------------------
// Post-processors

class TemplatePostProcessor : public PostProcessor {
 public:
  // Each element is either the ids of a special token or std::nullopt for the sequence ($A).
  explicit TemplatePostProcessor(std::vector<std::optional<std::vector<int32_t>>> pieces)
      : pieces_(std::move(pieces)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids->size() + 4);
    for (const auto& piece : pieces_) {
      if (piece.has_value()) {
        out.insert(out.end(), piece->begin(), piece->end());
      } else {
        out.insert(out.end(), ids->begin(), ids->end());
      }
    }
    *ids = std::move(out);
  }

 private:
  std::vector<std::optional<std::vector<int32_t>>> pieces_;
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->AddSpecialTokens(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// ByteLevel's post-processor only trims offsets; it never changes ids.
class NoOpPostProcessor : public PostProcessor {
 public:
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {}
};

StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const JsonSource& src, const Json& json,
                                                       const std::string& path) {
  ASSIGN_OR_RETURN(const Json* single, RequireMember(src, json, path, "single"));
  const std::string single_path = JoinPath(path, "single");
  if (!single->is_array()) return src.Invalid(single_path, "expected an array of pieces");
  const Json* specials = FindMember(json, "special_tokens");
  const std::string specials_path = JoinPath(path, "special_tokens");
  if (specials != nullptr && !specials->is_object()) {
    return src.Invalid(specials_path, "expected an object");
  }
  std::vector<std::optional<std::vector<int32_t>>> pieces;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string piece_path = IndexPath(single_path, i);
    if (const Json* sequence = FindMember(piece, "Sequence")) {
      const Json* id = FindMember(*sequence, "id");
      if (id == nullptr || !id->is_string() || (*id != "A" && *id != "B")) {
        return src.Invalid(piece_path, R"(expected {"Sequence": {"id": "A", ...}})");
      }
      if (*id == "B") return src.Invalid(piece_path, "the single-sequence template uses $B");
      pieces.emplace_back(std::nullopt);
      continue;
    }
    const Json* special = FindMember(piece, "SpecialToken");
    if (special == nullptr) {
      return src.Invalid(piece_path, R"(expected {"Sequence": ...} or {"SpecialToken": ...})");
    }
    ASSIGN_OR_RETURN(const std::string name,
                     RequireString(src, *special, JoinPath(piece_path, "SpecialToken"), "id"));
    const Json* entry = specials != nullptr ? FindMember(*specials, name) : nullptr;
    if (entry == nullptr) {
      return src.Invalid(specials_path,
                         "missing special token \"" + name + "\" used by the template");
    }
    const std::string entry_path = JoinPath(specials_path, name);
    ASSIGN_OR_RETURN(const Json* ids_json, RequireMember(src, *entry, entry_path, "ids"));
    if (!ids_json->is_array()) return src.Invalid(JoinPath(entry_path, "ids"), "expected an array");
    std::vector<int32_t> ids;
    for (size_t k = 0; k < ids_json->size(); ++k) {
      ASSIGN_OR_RETURN(const int32_t id,
                       AsTokenId(src, (*ids_json)[k], IndexPath(JoinPath(entry_path, "ids"), k)));
      ids.push_back(id);
    }
    pieces.emplace_back(std::move(ids));
  }
  return MakeStage<PostProcessor, TemplatePostProcessor>(std::move(pieces));
}

// Bert's and Roberta's processors: "cls" and "sep" are [token, id] pairs around the sequence.
StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const JsonSource& src, const Json& json,
                                                     const std::string& path) {
  std::vector<int32_t> ids[2];
  const char* const keys[2] = {"cls", "sep"};
  for (int k = 0; k < 2; ++k) {
    ASSIGN_OR_RETURN(const Json* pair, RequireMember(src, json, path, keys[k]));
    const std::string pair_path = JoinPath(path, keys[k]);
    if (!pair->is_array() || pair->size() != 2 || !(*pair)[0].is_string()) {
      return src.Invalid(pair_path, "expected [token, id]");
    }
    ASSIGN_OR_RETURN(const int32_t id, AsTokenId(src, (*pair)[1], IndexPath(pair_path, 1)));
    ids[k].push_back(id);
  }
  std::vector<std::optional<std::vector<int32_t>>> pieces = {ids[0], std::nullopt, ids[1]};
  return MakeStage<PostProcessor, TemplatePostProcessor>(std::move(pieces));
}

// ------------------------------------------------------------------------------------------------------------
// Decoders

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    // Decoding cannot fail; a token the regex engine gives up on is left as it is.
    for (std::string& token : *tokens) (void)ReplaceMatches(*pattern_, content_, &token);
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

// "<0xNN>" tokens back to bytes; a run of them that is not valid UTF-8 becomes one U+FFFD per byte.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string bytes;
    const auto flush = [&] {
      if (bytes.empty()) return;
      if (!FindInvalidUtf8(bytes).has_value()) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
    };
    for (std::string& token : *tokens) {
      if (std::optional<uint8_t> byte = ParseByteToken(token)) {
        bytes.push_back(static_cast<char>(*byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // The library parses the two characters with u8::from_str_radix(.., 16), which also takes "+F".
  static std::optional<uint8_t> ParseByteToken(std::string_view token) {
    if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return std::nullopt;
    const int hi = HexValue(token[3]);
    const int lo = HexValue(token[4]);
    if (lo < 0) return std::nullopt;
    if (token[3] == '+') return static_cast<uint8_t>(lo);
    if (hi < 0) return std::nullopt;
    return static_cast<uint8_t>(hi * 16 + lo);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string fused;
    for (const std::string& token : *tokens) fused += token;
    tokens->assign(1, std::move(fused));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, uint64_t start, uint64_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::vector<size_t> offsets;  // byte offset of each character, plus the end
      for (size_t pos = 0; pos < token.size(); pos += Utf8SequenceLength(token[pos])) {
        offsets.push_back(pos);
      }
      const size_t n = offsets.size();
      offsets.push_back(token.size());
      const auto char_at = [&](size_t i) {
        size_t pos = offsets[i];
        return DecodeUtf8(token, &pos);
      };
      size_t start_cut = 0;
      while (start_cut < n && start_cut < start_ && char_at(start_cut) == content_) ++start_cut;
      size_t stop_cut = n;
      while (stop_cut > start_cut && n - stop_cut < stop_ && char_at(stop_cut - 1) == content_) {
        --stop_cut;
      }
      token = token.substr(offsets[start_cut], offsets[stop_cut] - offsets[start_cut]);
    }
  }

 private:
  char32_t content_;
  uint64_t start_;
  uint64_t stop_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      // A token with any character outside the alphabet (an added token, say) contributes its UTF-8
      // as is.
      std::string token_bytes;
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size();) {
        const std::optional<uint8_t> b = ByteLevelCharToByte(DecodeUtf8(token, &pos));
        if (!b) {
          all_mapped = false;
          break;
        }
        token_bytes.push_back(static_cast<char>(*b));
      }
      bytes += all_mapped ? token_bytes : token;
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first)
      : replacement_(replacement), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string& token = (*tokens)[i];
      std::string out;
      out.reserve(token.size());
      for (size_t pos = 0; pos < token.size();) {
        const size_t begin = pos;
        if (DecodeUtf8(token, &pos) != replacement_) {
          out.append(token, begin, pos - begin);
        } else if (i != 0 || !strip_first_) {
          out.push_back(' ');
        }
      }
      (*tokens)[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_;
};

// ------------------------------------------------------------------------------------------------------------
// Added vocabulary helpers: the library tests these with Rust's regex crate, where \s is
// White_Space and \w is [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}].

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

// ------------------------------------------------------------------------------------------------------------
// Parsing

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const JsonSource& src, const Json& json,
                                                      const std::string& path, int depth) {
  if (depth > kMaxNesting) return src.Invalid(path, "normalizers nested too deeply");
  ASSIGN_OR_RETURN(const std::string type, ComponentType(src, json, path));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, RequireMember(src, json, path, "normalizers"));
    const std::string list_path = JoinPath(path, "normalizers");
    if (!list->is_array()) return src.Invalid(list_path, "expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParseNormalizer(src, (*list)[i], IndexPath(list_path, i), depth + 1));
      steps.push_back(std::move(step));
    }
    return MakeStage<Normalizer, SequenceNormalizer>(std::move(steps));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, RequireString(src, json, path, "prepend"));
    return MakeStage<Normalizer, PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(src, json, path));
    ASSIGN_OR_RETURN(std::string content, RequireString(src, json, path, "content"));
    return MakeStage<Normalizer, ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "NFC") return MakeStage<Normalizer, NfcNormalizer>();
  if (type == "NFD") return MakeStage<Normalizer, NfdNormalizer>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const bool left, OptionalBool(src, json, path, "strip_left", true));
    ASSIGN_OR_RETURN(const bool right, OptionalBool(src, json, path, "strip_right", true));
    return MakeStage<Normalizer, StripNormalizer>(left, right);
  }
  if (type == "ByteLevel") return MakeStage<Normalizer, ByteLevelNormalizer>();
  if (type == "Precompiled") return ParsePrecompiled(src, json, path);
  if (type == "NFKC" || type == "NFKD" || type == "Lowercase" || type == "BertNormalizer" ||
      type == "StripAccents" || type == "Nmt") {
    return src.Unsupported(JoinPath(path, "type"),
                           "normalizer \"" + type +
                               "\" is not supported (supported: Sequence, Prepend, Replace, NFC, "
                               "NFD, Strip, ByteLevel, Precompiled)");
  }
  return src.Invalid(JoinPath(path, "type"), "unknown normalizer type \"" + type + "\"");
}

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

StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const JsonSource& src, const Json& json,
                                                            const std::string& path, int depth) {
  if (depth > kMaxNesting) return src.Invalid(path, "post-processors nested too deeply");
  ASSIGN_OR_RETURN(const std::string type, ComponentType(src, json, path));
  if (type == "TemplateProcessing") return ParseTemplate(src, json, path);
  if (type == "BertProcessing" || type == "RobertaProcessing") return ParseClsSep(src, json, path);
  if (type == "ByteLevel") return MakeStage<PostProcessor, NoOpPostProcessor>();
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, RequireMember(src, json, path, "processors"));
    const std::string list_path = JoinPath(path, "processors");
    if (!list->is_array()) return src.Invalid(list_path, "expected an array");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    int adding_steps = 0;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParsePostProcessor(src, (*list)[i], IndexPath(list_path, i), depth + 1));
      const Json* step_type = FindMember((*list)[i], "type");
      if (step_type == nullptr || *step_type != "ByteLevel") ++adding_steps;
      steps.push_back(std::move(step));
    }
    // The library hands the second template one encoding per piece of the first (so it applies its
    // pair template); no real file chains two, and copying that quirk is not worth it.
    if (adding_steps > 1) {
      return src.Unsupported(list_path, "more than one post-processor that adds special tokens");
    }
    return MakeStage<PostProcessor, SequencePostProcessor>(std::move(steps));
  }
  return src.Invalid(JoinPath(path, "type"), "unknown post-processor type \"" + type + "\"");
}

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const JsonSource& src, const Json& json,
                                                const std::string& path, int depth) {
  if (depth > kMaxNesting) return src.Invalid(path, "decoders nested too deeply");
  ASSIGN_OR_RETURN(const std::string type, ComponentType(src, json, path));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const Json* list, RequireMember(src, json, path, "decoders"));
    const std::string list_path = JoinPath(path, "decoders");
    if (!list->is_array()) return src.Invalid(list_path, "expected an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(auto step,
                       ParseDecoder(src, (*list)[i], IndexPath(list_path, i), depth + 1));
      steps.push_back(std::move(step));
    }
    return MakeStage<Decoder, SequenceDecoder>(std::move(steps));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(auto pattern, ParsePattern(src, json, path));
    ASSIGN_OR_RETURN(std::string content, RequireString(src, json, path, "content"));
    return MakeStage<Decoder, ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "ByteFallback") return MakeStage<Decoder, ByteFallbackDecoder>();
  if (type == "Fuse") return MakeStage<Decoder, FuseDecoder>();
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const std::string content, RequireChar(src, json, path, "content"));
    ASSIGN_OR_RETURN(const uint64_t start, OptionalCount(src, json, path, "start", 0));
    ASSIGN_OR_RETURN(const uint64_t stop, OptionalCount(src, json, path, "stop", 0));
    return MakeStage<Decoder, StripDecoder>(FirstCodePoint(content), start, stop);
  }
  if (type == "ByteLevel") return MakeStage<Decoder, ByteLevelDecoder>();
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(const std::string replacement, RequireChar(src, json, path, "replacement"));
    ASSIGN_OR_RETURN(const PrependScheme scheme, ParsePrependScheme(src, json, path));
    return MakeStage<Decoder, MetaspaceDecoder>(FirstCodePoint(replacement),
                                                scheme != PrependScheme::kNever);
  }
  if (type == "WordPiece" || type == "BPEDecoder" || type == "CTC") {
    return src.Unsupported(JoinPath(path, "type"),
                           "decoder \"" + type +
                               "\" is not supported (supported: Sequence, Replace, ByteFallback, "
                               "Fuse, Strip, ByteLevel, Metaspace)");
  }
  return src.Invalid(JoinPath(path, "type"), "unknown decoder type \"" + type + "\"");
}

// ------------------------------------------------------------------------------------------------------------
// Added vocabulary

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
