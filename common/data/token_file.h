// Token files: a prepared, tokenized dataset that training memory-maps.
//
// `llm-train --prepare` tokenizes the JSONL once (PrepareTokenFile); training opens the result
// (TokenFile::Open) and never touches the tokenizer. The header carries a fingerprint of everything
// that produced the tokens (tokenizer, data file, format, template, max_seq_length, mask_prompt,
// samples), so a changed input is detected by comparing fingerprints, not by guessing from
// timestamps.
//
// Layout, little-endian, every section 8-byte aligned:
//   header (64 bytes):
//     char[8]  magic "LLMCTLTK"           u32 version (1)          u32 fingerprint_bytes
//     u64 num_examples                     u64 total_tokens         u64 target_tokens
//     u64 content_hash (FNV-1a 64 of the offsets, ids and mask sections, in that order)
//     i32 bos_id (-1: none)                i32 eos_id (-1: none)
//     i32 max_token_id                     u32 reserved (0)
//   fingerprint: fingerprint_bytes of UTF-8, zero-padded to a multiple of 8
//   offsets:     u64 × (num_examples + 1); example i is tokens [offsets[i], offsets[i+1])
//   ids:         i32 × total_tokens
//   mask:        u8 × total_tokens; 1 where the token is a training target (label = id), 0 where
//   the
//                label is ignored (-100). One byte instead of an i32 label: labels are always id or
//                -100.
//   zero padding to a multiple of 8
// target_tokens counts mask == 1 at positions ≥ 1 of each example: the labels a loss actually sees,
// since the model predicts token t from the tokens before it and position 0 has none.
#ifndef LLMCTL_COMMON_DATA_TOKEN_FILE_H_
#define LLMCTL_COMMON_DATA_TOKEN_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/data/dataset.h"
#include "common/data/file_util.h"
#include "common/data/text_encoder.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "common/unique_fd.h"

namespace llmctl::data {

inline constexpr char kTokenFileMagic[8] = {'L', 'L', 'M', 'C', 'T', 'L', 'T', 'K'};
inline constexpr uint32_t kTokenFileVersion = 1;

// The 64-byte header as the layout above has it: the one statement of it that the writer, the
// reader and the fuzz target's repairs (tests/fuzz/token_file_fuzz.cc) share. The offsets are
// asserted so that a field moved here fails to build rather than changing the format.
struct TokenFileHeader {
  char magic[8];
  uint32_t version;
  uint32_t fingerprint_bytes;
  uint64_t num_examples;
  uint64_t total_tokens;
  uint64_t target_tokens;
  uint64_t content_hash;
  int32_t bos_id;
  int32_t eos_id;
  int32_t max_token_id;
  uint32_t reserved;
};
static_assert(sizeof(TokenFileHeader) == 64 && std::is_trivially_copyable_v<TokenFileHeader>);
static_assert(offsetof(TokenFileHeader, version) == 8 &&
              offsetof(TokenFileHeader, fingerprint_bytes) == 12 &&
              offsetof(TokenFileHeader, num_examples) == 16 &&
              offsetof(TokenFileHeader, total_tokens) == 24 &&
              offsetof(TokenFileHeader, target_tokens) == 32 &&
              offsetof(TokenFileHeader, content_hash) == 40 &&
              offsetof(TokenFileHeader, bos_id) == 48 && offsetof(TokenFileHeader, eos_id) == 52 &&
              offsetof(TokenFileHeader, max_token_id) == 56 &&
              offsetof(TokenFileHeader, reserved) == 60);

// Builds a token file an example at a time, holding in memory only each example's offset (8 bytes),
// whatever the dataset's size: ids and mask go to two scratch files as examples arrive, and Finish
// writes the file from them. The scratch files lie beside `path` (its filesystem must hold the
// result anyway; /tmp may be memory), named as WriteFileAtomically's temporaries
// (AtomicWriteTemporaryName), and are unlinked as soon as they are made, so nothing of them
// outlives the writer, whether it finishes, fails or its process dies after the unlink; one that
// a crash left before it is what RemoveAtomicWriteLeftovers(path) removes.
class TokenFileWriter {
 public:
  static StatusOr<TokenFileWriter> Create(std::string path);

  // Appends `example`: non-empty, labels equal to the id or kIgnoreIndex, else InvalidArgument.
  Status Add(const TokenizedExample& example);
  // Writes `path` via WriteFileAtomically: until it returns OK, `path` is as it was. Without an
  // example it is an error: a token file always holds at least one. Call it once, last.
  Status Finish(std::string_view fingerprint, int32_t bos_id, int32_t eos_id);

  int64_t num_examples() const { return static_cast<int64_t>(offsets_.size()) - 1; }

 private:
  TokenFileWriter(std::string path, UniqueFd ids_scratch, UniqueFd mask_scratch);
  Status FlushScratch();

  std::string path_;
  UniqueFd ids_scratch_;             // i32 × total_tokens, the ids section
  UniqueFd mask_scratch_;            // u8 × total_tokens, the mask section
  std::vector<int32_t> ids_buffer_;  // not yet in ids_scratch_
  std::vector<uint8_t> mask_buffer_;
  std::vector<uint64_t> offsets_ = {0};  // the offsets section
  uint64_t target_tokens_ = 0;
  int32_t max_token_id_ = -1;
};

// OK when the directory of `path` has room to prepare a token file of about `file_bytes` there:
// twice that, since its scratch files are all on disk when Finish writes the file from them. Else
// Unavailable (as a write the disk refused) with CheckRoomIn's message naming the directory, the
// bytes needed and the bytes free, so that a preparation that cannot fit is refused before its
// first byte rather than failing with ENOSPC midway. `available` is the filesystem's free bytes
// (AvailableBytes) unless given.
Status CheckRoomToPrepare(const std::string& path, int64_t file_bytes,
                          std::optional<uint64_t> available = std::nullopt);

class TokenFile {
 public:
  struct Options {
    // Hash every section and check ids and mask values (one pass over the file, ~1 s per GB). Off,
    // only the header and offsets are checked, which is enough to never read outside the mapping.
    bool verify_contents = true;
  };

  // Maps `path` and validates it; errors name the file and end with what to do ("re-run llm-train
  // --prepare") where the file is stale or corrupt.
  static StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path, Options options);
  static StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path) {
    return Open(path, Options());
  }
  // Validates a file image in memory; borrows `bytes`, which must outlive the object.
  static StatusOr<std::unique_ptr<TokenFile>> FromBuffer(std::span<const std::byte> bytes,
                                                         std::string display_name, Options options);

  const std::string& path() const { return path_; }
  const std::string& fingerprint() const { return fingerprint_; }
  int64_t num_examples() const { return num_examples_; }
  int64_t total_tokens() const { return total_tokens_; }
  int64_t target_tokens() const { return target_tokens_; }  // see the layout comment
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  // Largest id in the file: the trainer checks it against the embedding's vocabulary size.
  int32_t max_token_id() const { return max_token_id_; }

  int64_t length(int64_t example) const {
    return static_cast<int64_t>(offsets_[example + 1] - offsets_[example]);
  }
  std::span<const int32_t> input_ids(int64_t example) const {
    return ids_.subspan(offsets_[example], length(example));
  }
  // 1 where the label is the id itself, 0 where it is kIgnoreIndex.
  std::span<const uint8_t> label_mask(int64_t example) const {
    return mask_.subspan(offsets_[example], length(example));
  }

 private:
  TokenFile() = default;
  Status Parse(std::span<const std::byte> bytes, const Options& options);

  std::unique_ptr<MappedFile> mapping_;
  std::string path_;
  std::string fingerprint_;
  int64_t num_examples_ = 0;
  int64_t total_tokens_ = 0;
  int64_t target_tokens_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t max_token_id_ = -1;
  std::span<const uint64_t> offsets_;  // [num_examples + 1]
  std::span<const int32_t> ids_;       // [total_tokens]
  std::span<const uint8_t> mask_;      // [total_tokens]
};

// What `llm-train --prepare` was asked for; all of it goes into the fingerprint.
struct PrepareOptions {
  DatasetFormat format = DatasetFormat::kAlpaca;
  PromptTemplate prompt_template = PromptTemplate::kAlpaca;
  int64_t max_seq_length = 512;
  bool mask_prompt = true;
  int64_t samples = 0;  // use the first N records; 0 = all (the labs' num_train_samples)
};

// A trial's data options from its keys (data.format, data.template, data.max_seq_length,
// data.mask_prompt, data.samples). Text records have no prompt: their template is none unless the
// trial sets one, which ValidateTrialConfig refuses (data.template's default, alpaca, is for
// instruction records).
StatusOr<PrepareOptions> PrepareOptionsFor(const TrialConfig& config);

// "llmctl-tokens v1; tokenizer=<encoder fingerprint>; data=fnv1a64:<hex>; format=alpaca;
// template=alpaca; max_seq_length=512; mask_prompt=true; samples=all".
std::string MakeFingerprint(std::string_view tokenizer_fingerprint, uint64_t data_hash,
                            const PrepareOptions& options);
// The fingerprint a token file prepared now from `data_path` would carry (reads and hashes the
// file); compare with TokenFile::fingerprint() to decide whether to prepare again.
StatusOr<std::string> ExpectedFingerprint(const std::string& data_path, const TextEncoder& encoder,
                                          const PrepareOptions& options);

struct PrepareStats {
  int64_t records_in_file = 0;
  int64_t examples = 0;  // written (min(samples, records))
  int64_t total_tokens = 0;
  int64_t target_tokens = 0;    // label tokens the loss sees (positions ≥ 1 not masked)
  int64_t truncated = 0;        // examples cut to max_seq_length
  int64_t without_targets = 0;  // examples left with no trained label (prompt fills max_seq_length)
  int64_t max_length = 0;       // longest example, in tokens
  std::string fingerprint;
};

// Reads `data_path` a piece at a time, renders and tokenizes each record as its line ends and hands
// it to a TokenFileWriter for `out_path`: neither the file's text nor its tokens are held. Errors
// name the data file and line; on any, `out_path` is as it was. Refused first when `out_path`'s
// directory lacks room (CheckRoomToPrepare) for a token a byte of `data_path` (5 file bytes each),
// or samples x max_seq_length tokens when fewer.
StatusOr<PrepareStats> PrepareTokenFile(const std::string& data_path, const TextEncoder& encoder,
                                        const PrepareOptions& options, const std::string& out_path);

}  // namespace llmctl::data

#endif  // LLMCTL_COMMON_DATA_TOKEN_FILE_H_
