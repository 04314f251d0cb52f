// TextEncoder: the one thing the data pipeline needs from a tokenizer.
//
// common/data/ must not depend on a particular tokenizer implementation (or on LibTorch), so
// examples are tokenized through this interface. TokenizerTextEncoder adapts any class with
// llmctl::Tokenizer's methods; ByteTextEncoder is a trivial stand-in for tests.
#ifndef LLMCTL_COMMON_DATA_TEXT_ENCODER_H_
#define LLMCTL_COMMON_DATA_TEXT_ENCODER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace llmctl::data {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;

  // Token ids for `text`. The data pipeline always passes add_special_tokens=false and places
  // BOS/EOS itself, so an example's layout does not depend on the tokenizer's post-processor.
  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                bool add_special_tokens) const = 0;
  // -1 when the tokenizer has none (Qwen2 has no BOS); the pipeline then leaves it out.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // Identifies the vocabulary and merges (e.g. "fnv1a64:<hash of tokenizer.json>"); it goes into
  // the token file's fingerprint, so a different tokenizer forces a re-prepare.
  virtual std::string fingerprint() const = 0;
};

// Adapts a tokenizer with `StatusOr<std::vector<int32_t>> Encode(std::string_view, bool) const` and
// `bos_id()`/`eos_id()` returning int32_t (-1 = none) or std::optional<int32_t>
// (llmctl::Tokenizer). A template, so this library needs no link dependency on the tokenizer's.
// Borrows `tokenizer`, which must outlive the adapter. `fingerprint` is typically "fnv1a64:" +
// HexU64(Fnv1a64File(tokenizer.json)).
template <typename Tokenizer>
class TokenizerTextEncoder final : public TextEncoder {
 public:
  TokenizerTextEncoder(const Tokenizer& tokenizer, std::string fingerprint)
      : tokenizer_(tokenizer), fingerprint_(std::move(fingerprint)) {}

  StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                        bool add_special_tokens) const override {
    return tokenizer_.Encode(text, add_special_tokens);
  }
  int32_t bos_id() const override { return IdOrNone(tokenizer_.bos_id()); }
  int32_t eos_id() const override { return IdOrNone(tokenizer_.eos_id()); }
  std::string fingerprint() const override { return fingerprint_; }

 private:
  template <typename Id>
  static int32_t IdOrNone(const Id& id) {
    if constexpr (requires { id.value_or(-1); }) {
      return static_cast<int32_t>(id.value_or(-1));
    } else {
      return static_cast<int32_t>(id);
    }
  }

  const Tokenizer& tokenizer_;
  std::string fingerprint_;
};

// One token per byte: id = byte + 3, with 0 = pad, 1 = BOS, 2 = EOS (vocabulary of 259). For tests
// and for smoke runs that need no tokenizer file.
class ByteTextEncoder final : public TextEncoder {
 public:
  static constexpr int32_t kBos = 1;
  static constexpr int32_t kEos = 2;
  static constexpr int32_t kOffset = 3;

  StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                        bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() + 1);
    if (add_special_tokens) ids.push_back(kBos);
    for (char c : text) ids.push_back(static_cast<unsigned char>(c) + kOffset);
    return ids;
  }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  std::string fingerprint() const override { return "bytes-v1"; }
};

}  // namespace llmctl::data

#endif  // LLMCTL_COMMON_DATA_TEXT_ENCODER_H_
