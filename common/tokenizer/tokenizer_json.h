// tokenizer.json read in one pass of nlohmann's SAX parser: model.vocab and model.merges, nearly
// all of a file (Llama 3's 128,000 tokens and 280,147 merges are most of its 9 MB), go straight
// into the tables the model is built from, and only the rest is kept as JSON. As one JSON document
// the file took 5 to 24 times its size besides the tables (a value is 16 bytes, a string, array or
// object a heap block more): 75 MiB for a 13.3 MiB Llama 3-shaped file, 830 MiB for 37 MiB of
// "[],".
//
// Internal to common/tokenizer.
#ifndef LLMCTL_COMMON_TOKENIZER_TOKENIZER_JSON_H_
#define LLMCTL_COMMON_TOKENIZER_TOKENIZER_JSON_H_

#include <cstddef>
#include <deque>
#include <string_view>

#include "common/status.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/model.h"
#include "common/tokenizer/token_table.h"
#include "common/tokenizer/unigram.h"

namespace llmctl::tokenizer_internal {

// Values kept as JSON outside model.vocab and model.merges at most. Real files keep a few thousand
// there (most of them added_tokens, 8 values each: Llama 3's 256 take 2,049); a hostile file's
// "[]," takes about 70 bytes as JSON for 3 of text, which under the 256 MiB file size limit would
// be 6 GB.
inline constexpr size_t kMaxKeptJsonValues = size_t{1} << 20;

// What model.vocab or model.merges was.
enum class MemberShape {
  kAbsent,  // missing or null
  kObject,
  kArray,
  kOther,  // a string, number or boolean
};

// model.vocab: an object's entries checked as token ids (a BPE vocabulary), an array's as
// [piece, score] (a Unigram one). `error` is the first entry that fails, naming it; the entries
// stop there. The pieces are a deque, whose count no SAX event gives beforehand: it grows a block
// at a time, where a vector doubled, holding up to twice the pieces and, as it moved them to a
// larger block, both blocks at once.
struct StreamedVocab {
  MemberShape shape = MemberShape::kAbsent;
  TokenTable token_ids;
  std::deque<UnigramPiece> pieces;
  Status error;
};

// model.merges: an array's entries, "left right" or ["left", "right"]; `error` is the first that is
// neither, naming it.
struct StreamedMerges {
  MemberShape shape = MemberShape::kAbsent;
  MergeList merges;
  Status error;
};

struct TokenizerJson {
  Json kept;  // the top-level object without model.vocab and model.merges
  StreamedVocab vocab;
  StreamedMerges merges;
};

// `text` read, or InvalidArgument naming `src`: not JSON or nested past 64 levels
// (ParseJsonWithinDepth's messages), not an object at the top level, or more than
// kMaxKeptJsonValues values to keep. tokenizer_config.json is read the same way (it has no model).
StatusOr<TokenizerJson> ReadTokenizerJson(const JsonSource& src, std::string_view text);

}  // namespace llmctl::tokenizer_internal

#endif  // LLMCTL_COMMON_TOKENIZER_TOKENIZER_JSON_H_
