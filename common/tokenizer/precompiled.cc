#include "common/tokenizer/precompiled.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "common/tokenizer/unicode.h"

namespace llmctl::tokenizer_internal {
namespace {

// The library replaces a grapheme cluster whole only when it is shorter than this many bytes.
constexpr size_t kWholeGraphemeLimit = 6;

// Darts-clone's packed unit, decoded as the spm_precompiled crate decodes it.
bool HasLeaf(uint32_t unit) { return ((unit >> 8) & 1) == 1; }
uint32_t Value(uint32_t unit) { return unit & ((1u << 31) - 1); }
uint32_t Label(uint32_t unit) { return unit & ((1u << 31) | 0xFF); }
size_t Offset(uint32_t unit) {
  return static_cast<size_t>(unit >> 10) << ((unit & (1u << 9)) >> 6);
}

uint32_t ReadLittleEndian32(std::string_view bytes, size_t pos) {
  return static_cast<uint32_t>(static_cast<unsigned char>(bytes[pos])) |
         static_cast<uint32_t>(static_cast<unsigned char>(bytes[pos + 1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(bytes[pos + 2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(bytes[pos + 3])) << 24;
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

StatusOr<std::string> DecodeBase64(std::string_view text) {
  if (text.size() % 4 != 0) {
    return InvalidArgumentError("not valid base64: the length (" + std::to_string(text.size()) +
                                ") is not a multiple of 4");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int padding = 0;
    if (last && text[i + 3] == '=') padding = text[i + 2] == '=' ? 2 : 1;
    uint32_t group = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      int value = 0;  // for the '=' of the padding
      if (k < 4 - padding) {
        value = Base64Value(c);
        if (value < 0) {
          return InvalidArgumentError("not valid base64: unexpected byte " +
                                      std::to_string(static_cast<unsigned char>(c)) +
                                      " at offset " + std::to_string(i + k));
        }
      }
      group = group << 6 | static_cast<uint32_t>(value);
    }
    // The bits a padded group does not use must be zero, as the library's decoder requires.
    if ((padding == 1 && (group & 0xFF) != 0) || (padding == 2 && (group & 0xFFFF) != 0)) {
      return InvalidArgumentError("not valid base64: stray bits before the padding at offset " +
                                  std::to_string(i));
    }
    out.push_back(static_cast<char>(group >> 16));
    if (padding < 2) out.push_back(static_cast<char>(group >> 8 & 0xFF));
    if (padding < 1) out.push_back(static_cast<char>(group & 0xFF));
  }
  return out;
}

StatusOr<std::unique_ptr<PrecompiledNormalizer>> PrecompiledNormalizer::Create(
    std::string charsmap) {
  if (charsmap.size() < 4) {
    return InvalidArgumentError("truncated: " + std::to_string(charsmap.size()) +
                                " bytes, less than the 4-byte trie size");
  }
  // As the crate does: trie_size / 4 units; whatever follows them is the string pool.
  const size_t unit_count = ReadLittleEndian32(charsmap, 0) / 4;
  if (unit_count == 0) return InvalidArgumentError("the trie is empty");
  if ((charsmap.size() - 4) / 4 < unit_count) {
    return InvalidArgumentError("truncated: the trie needs " + std::to_string(unit_count * 4) +
                                " bytes but only " + std::to_string(charsmap.size() - 4) +
                                " follow its size");
  }
  std::unique_ptr<PrecompiledNormalizer> normalizer(new PrecompiledNormalizer());
  normalizer->units_.resize(unit_count);
  for (size_t i = 0; i < unit_count; ++i) {
    normalizer->units_[i] = ReadLittleEndian32(charsmap, 4 + 4 * i);
  }
  normalizer->pool_ = charsmap.substr(4 + 4 * unit_count);
  if (std::optional<size_t> bad = FindInvalidUtf8(normalizer->pool_)) {
    return InvalidArgumentError("the normalized strings are not UTF-8 (byte " +
                                std::to_string(*bad) + " of the string pool)");
  }
  RETURN_IF_ERROR(normalizer->ValidateTrie());
  for (size_t byte = 0; byte < normalizer->ascii_.size(); ++byte) {
    const char c = static_cast<char>(byte);
    if (std::optional<std::string_view> replacement = normalizer->Transform({&c, 1})) {
      normalizer->ascii_[byte] = std::string(*replacement);
    }
  }
  ASSIGN_OR_RETURN(normalizer->grapheme_, Pattern::Regex(R"(\X)"));
  return normalizer;
}

// Walks every node a search can reach, so that a malformed blob fails here and not on the text
// that reaches its bad entry.
Status PrecompiledNormalizer::ValidateTrie() const {
  std::vector<size_t> pending = {Offset(units_[0])};
  std::unordered_set<size_t> seen(pending.begin(), pending.end());
  while (!pending.empty()) {
    const size_t base = pending.back();
    pending.pop_back();
    if ((base & ~size_t{0xFF}) >= units_.size()) continue;  // no child lies inside the trie
    for (uint32_t byte = 1; byte < 256; ++byte) {
      const size_t child = base ^ byte;
      if (child >= units_.size() || Label(units_[child]) != byte) continue;
      const size_t next = child ^ Offset(units_[child]);
      if (HasLeaf(units_[child])) {
        if (next >= units_.size()) {
          return InvalidArgumentError("a trie entry lies outside the trie (unit " +
                                      std::to_string(next) + " of " +
                                      std::to_string(units_.size()) + ")");
        }
        const uint32_t offset = Value(units_[next]);
        if (offset > pool_.size() ||
            (offset < pool_.size() && (static_cast<unsigned char>(pool_[offset]) & 0xC0) == 0x80)) {
          return InvalidArgumentError(
              "a trie entry points outside the normalized strings (offset " +
              std::to_string(offset) + " of " + std::to_string(pool_.size()) + ")");
        }
      }
      if (seen.insert(next).second) pending.push_back(next);
    }
  }
  return Status::Ok();
}

std::optional<std::string_view> PrecompiledNormalizer::Transform(std::string_view chunk) const {
  size_t node = Offset(units_[0]);
  for (const char c : chunk) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte == 0) break;
    node ^= byte;
    // (Out of range only in a malformed trie; ValidateTrie skipped such children too.)
    if (node >= units_.size() || Label(units_[node]) != byte) return std::nullopt;
    const bool has_leaf = HasLeaf(units_[node]);
    node ^= Offset(units_[node]);
    if (has_leaf) {
      // The first key found is the shortest: the library takes that one.
      const size_t begin = Value(units_[node]);
      const size_t end = pool_.find('\0', begin);
      return std::string_view(pool_).substr(begin, end == std::string::npos ? end : end - begin);
    }
  }
  return std::nullopt;
}

void PrecompiledNormalizer::AppendGrapheme(std::string_view grapheme, std::string* out) const {
  if (grapheme.size() < kWholeGraphemeLimit) {
    if (std::optional<std::string_view> replacement = Transform(grapheme)) {
      out->append(*replacement);
      return;
    }
  }
  for (size_t pos = 0; pos < grapheme.size();) {
    const size_t length = Utf8SequenceLength(static_cast<unsigned char>(grapheme[pos]));
    const std::string_view character = grapheme.substr(pos, length);
    std::optional<std::string_view> replacement = Transform(character);
    out->append(replacement.has_value() ? *replacement : character);
    pos += length;
  }
}

Status PrecompiledNormalizer::Normalize(std::string* text) const {
  const bool plain_ascii =
      std::all_of(text->begin(), text->end(), [](char c) { return (c & 0x80) == 0; }) &&
      text->find("\r\n") == std::string::npos;
  std::string out;
  out.reserve(text->size());
  if (plain_ascii) {
    for (const char c : *text) {
      const std::optional<std::string>& replacement = ascii_[static_cast<unsigned char>(c)];
      if (replacement.has_value()) {
        out.append(*replacement);
      } else {
        out.push_back(c);
      }
    }
  } else {
    // The library cuts the text with unicode-segmentation's extended grapheme clusters (UAX #29,
    // Unicode 16); PCRE2's \X implements the same rules from its own Unicode tables (10.42, in
    // Debian 12: Unicode 14, without rule GB9c that keeps Indic conjuncts together). Only clusters
    // under 6 bytes are treated differently from single characters, and a conjunct is longer, so
    // the versions can disagree only on characters new since Unicode 14 or on a short cluster
    // that starts with a key right after a conjunct (such as "क्क़" + U+0301).
    std::vector<MatchSpan> clusters;
    RETURN_IF_ERROR(grapheme_->FindAll(*text, &clusters));
    for (const MatchSpan& cluster : clusters) {
      AppendGrapheme(std::string_view(*text).substr(cluster.begin, cluster.end - cluster.begin),
                     &out);
    }
  }
  *text = std::move(out);
  return Status::Ok();
}

StatusOr<std::unique_ptr<Normalizer>> ParsePrecompiled(const JsonSource& src, const Json& json,
                                                       const std::string& path) {
  ASSIGN_OR_RETURN(const std::string encoded,
                   RequireString(src, json, path, "precompiled_charsmap"));
  const std::string field = JoinPath(path, "precompiled_charsmap");
  StatusOr<std::string> charsmap = DecodeBase64(encoded);
  if (!charsmap.ok()) return src.Invalid(field, charsmap.status().message());
  StatusOr<std::unique_ptr<PrecompiledNormalizer>> normalizer =
      PrecompiledNormalizer::Create(std::move(*charsmap));
  if (!normalizer.ok()) return src.Invalid(field, normalizer.status().message());
  return std::unique_ptr<Normalizer>(std::move(*normalizer));
}

}  // namespace llmctl::tokenizer_internal
