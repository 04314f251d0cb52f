#include "common/tokenizer/unicode.h"

#include <algorithm>
#include <iterator>
#include <vector>

namespace llmctl::tokenizer_internal {
namespace {

#include "common/tokenizer/unicode_data.inc"

// Hangul syllables compose and decompose arithmetically (Unicode 3.12).
constexpr char32_t kHangulSBase = 0xAC00;
constexpr char32_t kHangulLBase = 0x1100;
constexpr char32_t kHangulVBase = 0x1161;
constexpr char32_t kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19;
constexpr char32_t kHangulVCount = 21;
constexpr char32_t kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulNCount;

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Length of the well-formed prefix of the sequence starting at text[pos] (mirrors Rust's
// Utf8Chunks): returns {consumed, valid}. When !valid, `consumed` bytes form one maximal ill-formed
// subsequence.
std::pair<size_t, bool> ScanSequence(std::string_view text, size_t pos) {
  const auto at = [&](size_t i) -> unsigned char {
    return i < text.size() ? static_cast<unsigned char>(text[i]) : 0;
  };
  const unsigned char lead = at(pos);
  if (lead < 0x80) return {1, true};
  size_t width = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    width = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    width = 3;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    width = 4;
  } else {
    return {1, false};
  }
  const unsigned char second = at(pos + 1);
  bool second_ok = false;
  switch (lead) {
    case 0xE0:
      second_ok = second >= 0xA0 && second <= 0xBF;
      break;
    case 0xED:
      second_ok = second >= 0x80 && second <= 0x9F;  // excludes surrogates
      break;
    case 0xF0:
      second_ok = second >= 0x90 && second <= 0xBF;
      break;
    case 0xF4:
      second_ok = second >= 0x80 && second <= 0x8F;  // nothing above U+10FFFF
      break;
    default:
      second_ok = IsContinuation(second);
  }
  if (pos + 1 >= text.size() || !second_ok) return {1, false};
  for (size_t k = 2; k < width; ++k) {
    if (pos + k >= text.size() || !IsContinuation(at(pos + k))) return {k, false};
  }
  return {width, true};
}

int CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = std::end(kCombiningClassRanges);
  const auto* it = std::upper_bound(std::begin(kCombiningClassRanges), end, cp,
                                    [](char32_t c, const uint32_t(&r)[3]) { return c < r[0]; });
  if (it == std::begin(kCombiningClassRanges)) return 0;
  --it;
  return cp <= (*it)[1] ? static_cast<int>((*it)[2]) : 0;
}

void AppendDecomposition(char32_t cp, std::u32string* out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const char32_t s = cp - kHangulSBase;
    out->push_back(kHangulLBase + s / kHangulNCount);
    out->push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out->push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  if (cp < 0xC0) {
    out->push_back(cp);
    return;
  }
  const auto* end = std::end(kDecompositionIndex);
  const auto* it = std::lower_bound(std::begin(kDecompositionIndex), end, cp,
                                    [](const uint32_t(&e)[3], char32_t c) { return e[0] < c; });
  if (it == end || (*it)[0] != cp) {
    out->push_back(cp);
    return;
  }
  out->append(kDecompositionData + (*it)[1], (*it)[2]);
}

std::optional<char32_t> Compose(char32_t first, char32_t second) {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount) {
    return kHangulSBase +
           ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) * kHangulTCount;
  }
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount &&
      (first - kHangulSBase) % kHangulTCount == 0 && second > kHangulTBase &&
      second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  const auto* end = std::end(kCompositions);
  const auto* it =
      std::lower_bound(std::begin(kCompositions), end, std::pair(first, second),
                       [](const uint32_t(&e)[3], std::pair<char32_t, char32_t> key) {
                         return e[0] < key.first || (e[0] == key.first && e[1] < key.second);
                       });
  if (it != end && (*it)[0] == first && (*it)[1] == second) return (*it)[2];
  return std::nullopt;
}

// Decomposes and puts each run of non-starters in canonical order (a stable sort by combining
// class).
std::u32string Decompose(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) AppendDecomposition(DecodeUtf8(text, &pos), &out);
  size_t i = 0;
  while (i < out.size()) {
    if (CombiningClass(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && CombiningClass(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + i, out.begin() + j,
                     [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
  return out;
}

// The canonical composition algorithm of UAX #15: a character combines with the last starter unless
// a character of the same or higher class (or a starter) sits between them.
void Compose(std::u32string* s) {
  if (s->empty()) return;
  size_t starter = 0;
  int last_class = CombiningClass((*s)[0]);
  if (last_class != 0) last_class = 256;  // no starter yet: nothing may combine
  size_t out = 1;
  for (size_t i = 1; i < s->size(); ++i) {
    const char32_t ch = (*s)[i];
    const int ch_class = CombiningClass(ch);
    std::optional<char32_t> composite;
    if (last_class < ch_class || last_class == 0) composite = Compose((*s)[starter], ch);
    if (composite.has_value() && last_class != 256) {
      (*s)[starter] = *composite;
      continue;
    }
    if (ch_class == 0) {
      starter = out;
      last_class = 0;
    } else {
      last_class = ch_class;
    }
    (*s)[out++] = ch;
  }
  s->resize(out);
}

std::string ToUtf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) AppendUtf8(cp, &out);
  return out;
}

bool IsAscii(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

ByteLevelAlphabet MakeByteLevelAlphabet() {
  ByteLevelAlphabet alphabet;
  const auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    alphabet.byte_to_char[b] = printable(b) ? static_cast<char32_t>(b) : next++;
    AppendUtf8(alphabet.byte_to_char[b], &alphabet.byte_to_utf8[b]);
  }
  return alphabet;
}

}  // namespace

std::optional<size_t> FindInvalidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const auto [consumed, valid] = ScanSequence(text, pos);
    if (!valid) return pos;
    pos += consumed;
  }
  return std::nullopt;
}

char32_t DecodeUtf8(std::string_view text, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(text[*pos]);
  const size_t len = Utf8SequenceLength(b0);
  char32_t cp = 0;
  switch (len) {
    case 1:
      cp = b0;
      break;
    case 2:
      cp = b0 & 0x1F;
      break;
    case 3:
      cp = b0 & 0x0F;
      break;
    default:
      cp = b0 & 0x07;
  }
  for (size_t k = 1; k < len && *pos + k < text.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(text[*pos + k]) & 0x3F);
  }
  *pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const auto [consumed, valid] = ScanSequence(bytes, pos);
    if (valid) {
      out.append(bytes.substr(pos, consumed));
    } else {
      AppendUtf8(kReplacementChar, &out);
    }
    pos += consumed;
  }
  return out;
}

bool IsWhiteSpace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

const ByteLevelAlphabet& GetByteLevelAlphabet() {
  static const ByteLevelAlphabet* const alphabet = new ByteLevelAlphabet(MakeByteLevelAlphabet());
  return *alphabet;
}

std::optional<uint8_t> ByteLevelCharToByte(char32_t cp) {
  // The alphabet maps printable bytes to themselves and the other 68 bytes, in order, to
  // U+0100..U+0143.
  static const std::array<int16_t, 324>* const table = [] {
    auto* t = new std::array<int16_t, 324>();
    t->fill(-1);
    const ByteLevelAlphabet& alphabet = GetByteLevelAlphabet();
    for (int b = 0; b < 256; ++b) (*t)[alphabet.byte_to_char[b]] = static_cast<int16_t>(b);
    return t;
  }();
  if (cp >= table->size() || (*table)[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>((*table)[cp]);
}

std::string NormalizeNfc(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  std::u32string s = Decompose(text);
  Compose(&s);
  return ToUtf8(s);
}

std::string NormalizeNfd(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  return ToUtf8(Decompose(text));
}

}  // namespace llmctl::tokenizer_internal
