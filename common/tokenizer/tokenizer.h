// Tokenizer: a Hugging Face tokenizer.json (BPE and Unigram models) that encodes and decodes id for
// id like the `tokenizers` library. No LibTorch.
//
// Supported, i.e. the families LLaMA-style models and BLIP-2's Flan-T5 use:
//   - SentencePiece-style BPE with byte fallback (Llama 2, TinyLlama, Mistral): normalizer
//     Sequence[Prepend("▁"), Replace(" ", "▁")] and no pre-tokenizer, or the newer Metaspace
//     pre-tokenizer; `<0xNN>` byte tokens, fuse_unk; decoders Replace/ByteFallback/Fuse/Strip or
//     Metaspace.
//   - Byte-level BPE (Llama 3, Qwen2, GPT-2, SmolLM): Split with the file's regex (run on PCRE2),
//     ByteLevel, Digits, NFC, ignore_merges.
//   - SentencePiece Unigram (T5, Flan-T5, BLIP-2's T5 variants): Viterbi over the pieces' scores,
//     unknown characters fused into one unk, byte_fallback; the Precompiled normalizer (the
//     SentencePiece charsmap, e.g. nmt_nfkc), Replace with a regex (" {2,}"), Strip, and the
//     WhitespaceSplit + Metaspace pre-tokenizers.
//   - Merges as "a b" strings or [a, b] pairs; added tokens (special, normalized, lstrip, rstrip,
//     single_word); post-processors TemplateProcessing, Bert/RobertaProcessing, ByteLevel and
//     Sequence.
// Anything else (WordPiece or WordLevel models, NFKC, Lowercase, the Whitespace pre-tokenizer, BPE
// dropout, ...) fails to load with an error naming the file and the feature. The file's
// "truncation" and "padding" settings are ignored: the trainer truncates and pads itself.
//
// Example:
//   ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load("models/tinyllama"));
//   ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode("Hi", /*add_special_tokens=*/true));
//   if (tok.eos_id()) ids.push_back(*tok.eos_id());
//   std::string text = tok.Decode(ids, /*skip_special_tokens=*/true);
//
// Thread-safety: all const methods may be called concurrently (the word cache has its own lock).
#ifndef LLMCTL_COMMON_TOKENIZER_TOKENIZER_H_
#define LLMCTL_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl {

namespace tokenizer_internal {
struct TokenizerState;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one. In a directory,
  // tokenizer_config.json (when present) overrides the BOS/EOS/PAD tokens, as transformers does.
  // Errors: NotFound (no file), InvalidArgument (malformed JSON or field, with the file and field
  // named), Unimplemented (a feature this class does not support, named).
  static StatusOr<Tokenizer> Load(const std::string& path);

  // Parses tokenizer.json text; `source_name` is used in error messages.
  static StatusOr<Tokenizer> FromJson(std::string_view json, std::string_view source_name);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text`; with `add_special_tokens` the post-processor's tokens (BOS for Llama) are
  // added. Special-token text inside `text` (e.g. "</s>") becomes that token, as in the library.
  // Errors: InvalidArgument when `text` is not valid UTF-8; ResourceExhausted when the file's regex
  // gives up on the input (a pathological pattern).
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const;

  // The text of `ids`. Unknown ids are skipped, as in the library; invalid UTF-8 from byte tokens
  // becomes U+FFFD.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;

  // Number of embedding rows the ids need: the largest id + 1 (model vocabulary and added tokens).
  int32_t vocab_size() const;

  // BOS/EOS/PAD: from tokenizer_config.json when Load found one, else from the post-processor's
  // template (the token before / after the sequence), else from well-known names (<s>, </s>,
  // <|begin_of_text|>,
  // <|end_of_text|>, <|endoftext|>, <pad>, ...). Qwen2 has no BOS, many files have no PAD.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // Whether Encode(text, /*add_special_tokens=*/true) puts BOS first / EOS last.
  bool adds_bos() const;
  bool adds_eos() const;

  // Where it was loaded from (path or source_name).
  const std::string& source() const;

 private:
  explicit Tokenizer(std::unique_ptr<tokenizer_internal::TokenizerState> state);

  std::unique_ptr<tokenizer_internal::TokenizerState> state_;  // never null
};

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TOKENIZER_TOKENIZER_H_
