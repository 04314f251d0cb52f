// UTF-8 and Unicode helpers for the tokenizer: validation, lossy decoding the way Rust's
// String::from_utf8_lossy does it (so decoded text matches the `tokenizers` library), the GPT-2
// byte-to-unicode map of byte-level BPE, Unicode White_Space, and canonical normalization (NFC/NFD,
// Qwen2 uses NFC).
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_UNICODE_H_
#define LLMCTL_COMMON_TOKENIZER_UNICODE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace llmctl::tokenizer_internal {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the UTF-8 sequence that starts with `lead`, for text already known to be valid.
inline size_t Utf8SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Byte offset of the first byte that is not part of well-formed UTF-8 (no overlongs, no surrogates,
// nothing above U+10FFFF), or std::nullopt when all of `text` is well formed.
std::optional<size_t> FindInvalidUtf8(std::string_view text);

// Decodes the code point at text[*pos] and advances *pos past it. `text` must be valid UTF-8.
char32_t DecodeUtf8(std::string_view text, size_t* pos);

void AppendUtf8(char32_t cp, std::string* out);

// Bytes to text, each maximal ill-formed subsequence replaced by one U+FFFD, exactly like Rust's
// String::from_utf8_lossy.
std::string Utf8Lossy(std::string_view bytes);

// Unicode White_Space (Rust's char::is_whitespace and regex `\s`).
bool IsWhiteSpace(char32_t cp);

// GPT-2's reversible byte <-> printable code point map used by byte-level BPE.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char;
  std::array<std::string, 256> byte_to_utf8;  // byte_to_char, UTF-8 encoded
};
const ByteLevelAlphabet& GetByteLevelAlphabet();
// The byte a byte-level code point stands for, or std::nullopt for code points outside the
// alphabet.
std::optional<uint8_t> ByteLevelCharToByte(char32_t cp);

// Canonical composition (NFC) and decomposition (NFD). `text` must be valid UTF-8.
std::string NormalizeNfc(std::string_view text);
std::string NormalizeNfd(std::string_view text);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_UNICODE_H_
