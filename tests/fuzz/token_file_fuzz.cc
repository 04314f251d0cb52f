// Fuzz target for a token file (common/data/token_file.h: TokenFile::FromBuffer, what
// TokenFile::Open runs on the mapping): the tokenized dataset that `llm-train --prepare` or
// `llmctl estimate` wrote into the token cache, which another process (or a full disk, or a crash
// mid-write) may have left in any state; llm-train and `llmctl estimate` map and trust it.
//
// The input's first byte sets the options and what the target repairs before parsing, so that the
// mutations also reach the checks past the size and the content hash, which random bytes would
// never pass: bit 0 Options::verify_contents; bit 1 the magic, version and file size the header
// describes (when at most 1 MiB); bit 2 the content hash, max_token_id and target_tokens computed
// from the sections; bits 3-4 the micro-batch size - 1, bit 5 shuffle, bit 6 drop_last, bit 7 two
// data-parallel ranks instead of one, for a BatchIterator over what parses. The rest is the file.
//
// Beyond "no crash, no exception, no hang" (and no read outside the buffer: AddressSanitizer), the
// header's promises:
// - a refusal is FailedPrecondition (stale: magic, version) or DataLoss (corrupt), names the file
//   and ends with what to do ("re-run llm-train --prepare");
// - what parses has at least one example, each of at least one token, their lengths adding up to
//   total_tokens, every example's ids and mask inside the buffer, and the fingerprint the header's
//   length; with verify_contents every id is within [0, max_token_id] (the bound the trainer checks
//   against the embedding's vocabulary), max_token_id is one of them, every mask value is 0 or 1
//   and target_tokens counts mask 1 at positions >= 1;
// - the batches drawn from it hold the examples' own tokens, padded, labels the id or -100, and a
//   position restored gives the same batch again.
//
// Replayed over tests/fuzz/corpus/token_file/ by the `token_file_fuzz_replay` test, with seeded
// mutations. To fuzz for real (clang with libFuzzer: apt-get install clang libclang-rt-14-dev),
// from the repository root, in bash:
//
//   SRCS="tests/fuzz/token_file_fuzz.cc
//         $(ls common/*.cc | grep -v -e _test.cc -e _bench -e _main.cc -e logging.cc)
//         common/data/dataset.cc common/data/file_util.cc common/data/token_file.cc
//         common/data/batch_iterator.cc"
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
//       -I. $SRCS $(pkg-config --cflags --libs yaml-cpp) -o /tmp/token_file_fuzz  # one line
//   mkdir -p /tmp/token_file_corpus
//   /tmp/token_file_fuzz -max_total_time=300 -max_len=4096 -timeout=10 -rss_limit_mb=2048
//       -dict=tests/fuzz/token_file_fuzz.dict /tmp/token_file_corpus
//       tests/fuzz/corpus/token_file                                             # one line
//
// Inputs that crash go into tests/fuzz/corpus/token_file/ with the fix.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/data/batch_iterator.h"
#include "common/data/file_util.h"
#include "common/data/token_file.h"
#include "common/status.h"

namespace {

using llmctl::StatusCode;
using llmctl::StatusOr;
using llmctl::data::TokenFile;
// The format's header (token_file.h states it and asserts its offsets; token_file_test.cc writes
// fields at those offsets): the repairs and checks below share it, never the reader's code.
using llmctl::data::TokenFileHeader;

constexpr char kName[] = "fuzz/tokens.bin";
constexpr size_t kMaxRepairedBytes = size_t{1} << 20;

// Aborts naming the check that failed, so a crash's report says which promise broke.
// (__builtin_LINE rather than std::source_location: clang 14 with libstdc++ 12 lacks the latter.)
void Check(bool condition, int line = __builtin_LINE()) {
  if (condition) return;
  std::fprintf(stderr, "check failed at %s:%d\n", __FILE__, line);
  std::abort();
}

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// The sections' places in a file of `header`, or false when they do not fit in `limit` bytes.
struct Layout {
  uint64_t offsets = 0, ids = 0, mask = 0, end = 0;
};
bool LayoutOf(const TokenFileHeader& header, uint64_t limit, Layout* layout) {
  const uint64_t n = header.num_examples, tokens = header.total_tokens;
  if (header.fingerprint_bytes > limit || n >= limit / 8 || tokens >= limit / 5) return false;
  layout->offsets = sizeof(TokenFileHeader) + Align8(header.fingerprint_bytes);
  layout->ids = layout->offsets + 8 * (n + 1);
  layout->mask = layout->ids + 4 * tokens;
  layout->end = Align8(layout->mask + tokens);
  return layout->end <= limit;
}

// Makes the header agree with the sections (bit 2): the hash, the largest id and the targets.
void RepairContents(std::vector<uint64_t>& words, size_t size) {
  auto* bytes = reinterpret_cast<unsigned char*>(words.data());
  TokenFileHeader header;
  std::memcpy(&header, bytes, sizeof(header));
  Layout layout;
  if (!LayoutOf(header, size, &layout) || layout.end != size) return;
  const auto section = [&](uint64_t from, uint64_t to) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes) + from, to - from);
  };
  uint64_t hash = llmctl::data::Fnv1a64(section(layout.offsets, layout.ids));
  hash = llmctl::data::Fnv1a64(section(layout.ids, layout.mask), hash);
  hash = llmctl::data::Fnv1a64(section(layout.mask, layout.mask + header.total_tokens), hash);
  header.content_hash = hash;
  int32_t max_id = -1;
  uint64_t targets = 0;
  for (uint64_t t = 0; t < header.total_tokens; ++t) {
    int32_t id;
    std::memcpy(&id, bytes + layout.ids + 4 * t, 4);
    max_id = std::max(max_id, id);
    targets += bytes[layout.mask + t];
  }
  for (uint64_t i = 0; i < header.num_examples; ++i) {
    uint64_t offset;
    std::memcpy(&offset, bytes + layout.offsets + 8 * i, 8);
    if (offset < header.total_tokens) targets -= bytes[layout.mask + offset];
  }
  header.max_token_id = max_id;
  header.target_tokens = targets;
  std::memcpy(bytes, &header, sizeof(header));
}

void CheckBatches(const TokenFile& file, uint8_t choice) {
  llmctl::data::BatchOptions options;
  options.micro_batch_size = 1 + ((choice >> 3) & 3);
  options.seed = choice;
  options.shuffle = (choice & 32) != 0;
  options.drop_last = (choice & 64) != 0;
  options.world_size = (choice & 128) != 0 ? 2 : 1;
  options.rank = options.world_size - 1;
  StatusOr<llmctl::data::BatchIterator> iterator =
      llmctl::data::BatchIterator::Create(file, options);
  if (!iterator.ok()) {
    Check(iterator.status().code() == StatusCode::kInvalidArgument ||
          iterator.status().code() == StatusCode::kFailedPrecondition);
    return;
  }
  for (int draw = 0; draw < 3; ++draw) {
    const llmctl::data::BatchPosition position = iterator->position();
    const llmctl::data::Batch batch = iterator->Next();
    // Without drop_last, an epoch's last round may leave a later rank nothing (the trainer always
    // sets drop_last: BatchOptionsFor).
    Check(batch.rows <= options.micro_batch_size);
    Check(batch.rows >= 1 || (!options.drop_last && options.world_size > 1));
    Check(batch.input_ids.size() == static_cast<size_t>(batch.rows * batch.seq_len));
    Check(batch.labels.size() == batch.input_ids.size());
    Check(batch.lengths.size() == static_cast<size_t>(batch.rows));
    Check(batch.example_indices.size() == static_cast<size_t>(batch.rows));
    int64_t longest = 0;
    for (int64_t r = 0; r < batch.rows; ++r) {
      const int64_t example = batch.example_indices[r];
      Check(example >= 0 && example < file.num_examples());
      Check(batch.lengths[r] == file.length(example));
      longest = std::max(longest, batch.lengths[r]);
      const std::span<const int32_t> ids = file.input_ids(example);
      for (int64_t t = 0; t < batch.seq_len; ++t) {
        const int64_t id = batch.input_ids[r * batch.seq_len + t];
        const int64_t label = batch.labels[r * batch.seq_len + t];
        if (t < batch.lengths[r]) Check(id == ids[t]);
        Check(label == id || label == llmctl::data::kIgnoreIndex);
      }
    }
    Check(batch.seq_len == longest);
    Check(batch.num_target_tokens >= 0 && batch.num_target_tokens <= batch.rows * batch.seq_len);
    // The position before a batch gives that batch again: what a resumed run relies on.
    StatusOr<llmctl::data::BatchIterator> again =
        llmctl::data::BatchIterator::Create(file, options);
    Check(again.ok() && again->Restore(position).ok());
    const llmctl::data::Batch repeated = again->Next();
    Check(repeated.example_indices == batch.example_indices &&
          repeated.input_ids == batch.input_ids && repeated.labels == batch.labels);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t choice = data[0];
  size_t file_size = size - 1;
  // An 8-aligned copy, as the mapping (page-aligned) and FromBuffer's callers give.
  std::vector<uint64_t> words(Align8(std::max(file_size, sizeof(TokenFileHeader))) / 8, 0);
  std::memcpy(words.data(), data + 1, file_size);
  auto* bytes = reinterpret_cast<unsigned char*>(words.data());

  if ((choice & 2) != 0) {
    file_size = std::max(file_size, sizeof(TokenFileHeader));
    TokenFileHeader header;
    std::memcpy(&header, bytes, sizeof(header));
    std::memcpy(header.magic, llmctl::data::kTokenFileMagic, sizeof(header.magic));
    header.version = llmctl::data::kTokenFileVersion;
    std::memcpy(bytes, &header, sizeof(header));
    Layout layout;
    if (LayoutOf(header, kMaxRepairedBytes, &layout)) {
      words.resize(layout.end / 8, 0);
      bytes = reinterpret_cast<unsigned char*>(words.data());
      file_size = layout.end;
    }
  }
  if ((choice & 4) != 0) RepairContents(words, file_size);

  TokenFile::Options options;
  options.verify_contents = (choice & 1) != 0;
  const std::span<const std::byte> buffer(reinterpret_cast<const std::byte*>(bytes), file_size);
  StatusOr<std::unique_ptr<TokenFile>> file = TokenFile::FromBuffer(buffer, kName, options);
  if (!file.ok()) {
    const llmctl::Status& status = file.status();
    Check(status.code() == StatusCode::kFailedPrecondition ||
          status.code() == StatusCode::kDataLoss);
    Check(status.message().find(kName) != std::string::npos);
    Check(std::string_view(status.message()).ends_with("; re-run llm-train --prepare"));
    return 0;
  }

  const TokenFile& tokens = **file;
  TokenFileHeader header;
  std::memcpy(&header, bytes, sizeof(header));
  Check(tokens.path() == kName);
  Check(tokens.fingerprint().size() == header.fingerprint_bytes);
  Check(tokens.num_examples() >= 1 && tokens.total_tokens() >= tokens.num_examples());
  Check(tokens.target_tokens() >= 0 && tokens.target_tokens() <= tokens.total_tokens());
  const auto inside = [&](const void* begin, size_t length) {
    const auto* at = static_cast<const unsigned char*>(begin);
    return at >= bytes && at + length <= bytes + file_size;
  };
  int64_t total = 0, targets = 0;
  int32_t max_id = -1;
  for (int64_t i = 0; i < tokens.num_examples(); ++i) {
    const int64_t length = tokens.length(i);
    Check(length >= 1 && length <= tokens.total_tokens() - total);
    total += length;
    const std::span<const int32_t> ids = tokens.input_ids(i);
    const std::span<const uint8_t> mask = tokens.label_mask(i);
    Check(ids.size() == static_cast<size_t>(length) && mask.size() == ids.size());
    Check(inside(ids.data(), ids.size_bytes()) && inside(mask.data(), mask.size()));
    if (!options.verify_contents) continue;
    for (size_t t = 0; t < ids.size(); ++t) {
      Check(ids[t] >= 0 && ids[t] <= tokens.max_token_id());
      Check(mask[t] <= 1);
      max_id = std::max(max_id, ids[t]);
      if (t > 0) targets += mask[t];
    }
  }
  Check(total == tokens.total_tokens());
  if (options.verify_contents) {
    Check(max_id == tokens.max_token_id() && targets == tokens.target_tokens());
  }
  if (options.verify_contents) CheckBatches(tokens, choice);
  return 0;
}
