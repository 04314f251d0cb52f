#include "common/tokenizer/decoder.h"

#include <optional>
#include <utility>

#include "common/tokenizer/regex.h"
#include "common/tokenizer/stage_common.h"
#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

char32_t FirstCodePoint(std::string_view text) {
  size_t pos = 0;
  return DecodeUtf8(text, &pos);
}

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

}  // namespace

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

}  // namespace llmctl::tokenizer_internal
