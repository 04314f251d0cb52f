// Fuzz target for Tokenizer::FromJson: any bytes must load or fail with a Status, never crash, hang
// or leak; a file that loads must encode and decode a short text.
//
// Replayed over tests/fuzz/corpus/tokenizer/ by the `tokenizer_fuzz_replay` test. To fuzz for real
// (clang with libFuzzer; on Debian: apt-get install clang libclang-rt-14-dev), from the repository
// root, in bash:
//
//   SRCS="tests/fuzz/tokenizer_fuzz.cc common/status.cc common/files.cc common/text.cc
//         common/foreign_json.cc common/errno_status.cc common/byte_size.cc
//         common/atomic_file.cc $(ls common/tokenizer/*.cc | grep -v -e _test -e _bench)"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -I. $SRCS
//       $(pkg-config --cflags --libs libpcre2-8) -o /tmp/tokenizer_fuzz     # (one line)
//   mkdir -p /tmp/tokenizer_corpus
//   OPTS="-max_total_time=120 -max_len=8192 -timeout=10 -dict=tests/fuzz/tokenizer_fuzz.dict"
//   /tmp/tokenizer_fuzz $OPTS /tmp/tokenizer_corpus tests/fuzz/corpus/tokenizer
//
// New inputs land in /tmp/tokenizer_corpus. Inputs that crash (crash-*, timeout-*) go into
// tests/fuzz/corpus/tokenizer/ with the fix; so do a few that reach new code (`-merge=1` finds
// them), keeping the checked-in corpus small.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  llmctl::StatusOr<llmctl::Tokenizer> tokenizer = llmctl::Tokenizer::FromJson(json, "fuzz.json");
  if (!tokenizer.ok()) return 0;
  // Spaces, a newline run, digits, an added-token look-alike, accents, CJK and an emoji: every
  // stage runs.
  constexpr std::string_view kText =
      "Hi  there,\n\n<s>it's 1234 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x99\x82</s>";
  for (bool add_special_tokens : {false, true}) {
    llmctl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(kText, add_special_tokens);
    if (!ids.ok()) continue;
    (void)tokenizer->Decode(*ids, /*skip_special_tokens=*/false);
    (void)tokenizer->Decode(*ids, /*skip_special_tokens=*/true);
  }
  // Decoding arbitrary ids, including ones the vocabulary lacks.
  std::vector<int32_t> ids;
  for (int32_t id = -1; id < 300; ++id) ids.push_back(id);
  (void)tokenizer->Decode(ids, /*skip_special_tokens=*/false);
  (void)tokenizer->TokenToId("<s>");
  (void)tokenizer->IdToToken(0);
  return 0;
}
