#include "common/data/token_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/atomic_file.h"
#include "common/byte_size.h"
#include "common/checked_math.h"
#include "common/files.h"

namespace llmctl::data {
namespace {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

// A fingerprint is a line of key=value pairs; anything near this size is not one.
constexpr uint32_t kMaxFingerprintBytes = 1 << 16;
constexpr std::string_view kRerun = "; re-run llm-train --prepare";

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// Size of the whole file for these counts, or nullopt on overflow (a lying header).
std::optional<uint64_t> FileSize(uint64_t fingerprint_bytes, uint64_t num_examples,
                                 uint64_t total_tokens) {
  uint64_t offsets, ids, size;
  if (__builtin_add_overflow(num_examples, 1, &offsets) ||
      __builtin_mul_overflow(offsets, 8, &offsets) ||
      __builtin_mul_overflow(total_tokens, 4, &ids)) {
    return std::nullopt;
  }
  size = sizeof(TokenFileHeader) + Align8(fingerprint_bytes);
  if (__builtin_add_overflow(size, offsets, &size) || __builtin_add_overflow(size, ids, &size) ||
      __builtin_add_overflow(size, total_tokens, &size) || size > (uint64_t{1} << 62)) {
    return std::nullopt;
  }
  return Align8(size);
}

template <typename T>
std::span<const std::byte> Bytes(std::span<const T> values) {
  return std::as_bytes(values);
}

// The header of `bytes`, checked against their size: the sections it describes fit exactly.
StatusOr<TokenFileHeader> ReadHeader(std::span<const std::byte> bytes, const std::string& path) {
  const std::string rerun(kRerun);
  if (bytes.size() < sizeof(kTokenFileMagic) ||
      std::memcmp(bytes.data(), kTokenFileMagic, sizeof(kTokenFileMagic)) != 0) {
    return FailedPreconditionError(path + " is not an llmctl token file (bad magic)" + rerun);
  }
  if (bytes.size() < sizeof(TokenFileHeader)) {
    return DataLossError(path + " is truncated: " + std::to_string(bytes.size()) +
                         " bytes, shorter than the 64-byte header" + rerun);
  }
  TokenFileHeader header;
  std::memcpy(&header, bytes.data(), sizeof(header));
  if (header.version != kTokenFileVersion) {
    return FailedPreconditionError(
        path + " is token file version " + std::to_string(header.version) +
        " but this build reads version " + std::to_string(kTokenFileVersion) + rerun);
  }
  if (header.fingerprint_bytes > kMaxFingerprintBytes) {
    return DataLossError(path + ": fingerprint length " + std::to_string(header.fingerprint_bytes) +
                         " is implausible (corrupt header)" + rerun);
  }
  if (header.num_examples == 0) return DataLossError(path + " holds no examples" + rerun);
  const std::optional<uint64_t> expected_size =
      FileSize(header.fingerprint_bytes, header.num_examples, header.total_tokens);
  if (!expected_size.has_value()) {
    return DataLossError(path + ": header counts overflow (corrupt header)" + rerun);
  }
  if (bytes.size() < *expected_size) {
    return DataLossError(path + " is truncated: " + std::to_string(bytes.size()) +
                         " bytes, the header describes " + std::to_string(*expected_size) + rerun);
  }
  if (bytes.size() > *expected_size) {
    return DataLossError(path + " has " + std::to_string(bytes.size() - *expected_size) +
                         " bytes past the end the header describes" + rerun);
  }
  return header;
}

// Offsets are always checked (n + 1 loads): they are what keeps input_ids() inside the mapping.
Status CheckOffsets(std::span<const uint64_t> offsets, uint64_t total_tokens,
                    const std::string& path) {
  const std::string rerun(kRerun);
  if (offsets.front() != 0) {
    return DataLossError(path + ": offsets start at " + std::to_string(offsets.front()) +
                         ", not 0 (corrupt file)" + rerun);
  }
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] <= offsets[i - 1] || offsets[i] > total_tokens) {
      return DataLossError(path + ": offset of example " + std::to_string(i) + " (" +
                           std::to_string(offsets[i]) + ") is not increasing within [0, " +
                           std::to_string(total_tokens) + "] (corrupt file)" + rerun);
    }
  }
  if (offsets.back() != total_tokens) {
    return DataLossError(path + ": offsets end at " + std::to_string(offsets.back()) + " but the " +
                         "header counts " + std::to_string(total_tokens) + " tokens" + rerun);
  }
  return Status::Ok();
}

// The content hash, every id and mask value, and the header's statistics against the tokens.
Status VerifyContents(const TokenFileHeader& header, std::span<const uint64_t> offsets,
                      std::span<const int32_t> ids, std::span<const uint8_t> mask,
                      const std::string& path) {
  const std::string rerun(kRerun);
  uint64_t hash = Fnv1a64(Bytes(offsets));
  hash = Fnv1a64(Bytes(ids), hash);
  hash = Fnv1a64(Bytes(mask), hash);
  if (hash != header.content_hash) {
    return DataLossError(path + ": content hash mismatch (corrupt file)" + rerun);
  }
  int32_t max_id = -1;
  uint64_t targets = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || mask[t] > 1) {
      return DataLossError(path + ": token " + std::to_string(t) + " has id " +
                           std::to_string(ids[t]) + " and mask " + std::to_string(mask[t]) +
                           " (corrupt file)" + rerun);
    }
    max_id = std::max(max_id, ids[t]);
    targets += mask[t];
  }
  for (size_t i = 0; i + 1 < offsets.size(); ++i) targets -= mask[offsets[i]];
  if (max_id != header.max_token_id || targets != header.target_tokens) {
    return DataLossError(path + ": header statistics disagree with the tokens (corrupt file)" +
                         rerun);
  }
  return Status::Ok();
}

// Tokens a TokenFileWriter gathers before it writes them to its scratch files: 1 MiB of ids.
constexpr size_t kScratchBufferTokens = size_t{1} << 18;

// The first `size` bytes of the file `from` appended to `to`, chained into `hash` on the way.
Status CopyHashing(int from, uint64_t size, int to, uint64_t& hash) {
  std::vector<std::byte> buffer(std::min<uint64_t>(size, kScratchBufferTokens * 4));
  for (uint64_t done = 0; done < size;) {
    const ssize_t n = ::pread(from, buffer.data(), std::min<uint64_t>(buffer.size(), size - done),
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return UnavailableError(std::string("scratch file: ").append(std::strerror(errno)));
    if (n == 0) return InternalError("scratch file: shorter than what was written to it");
    const std::span<const std::byte> piece(buffer.data(), static_cast<size_t>(n));
    hash = Fnv1a64(piece, hash);
    RETURN_IF_ERROR(WriteAll(to, piece.data(), piece.size()));
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

}  // namespace

TokenFileWriter::TokenFileWriter(std::string path, UniqueFd ids_scratch, UniqueFd mask_scratch)
    : path_(std::move(path)),
      ids_scratch_(std::move(ids_scratch)),
      mask_scratch_(std::move(mask_scratch)) {
  ids_buffer_.reserve(kScratchBufferTokens);
  mask_buffer_.reserve(kScratchBufferTokens);
}

StatusOr<TokenFileWriter> TokenFileWriter::Create(std::string path) {
  UniqueFd scratch[2];
  for (UniqueFd& fd : scratch) {
    // Named as WriteFileAtomically's temporaries are: RemoveAtomicWriteLeftovers(path) clears one
    // a crash left before the unlink.
    const std::string name = AtomicWriteTemporaryName(path);
    fd = UniqueFd(::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid() || ::unlink(name.c_str()) != 0) {
      const int error = errno;
      return UnavailableError(std::string("cannot write ")
                                  .append(path)
                                  .append(": scratch file ")
                                  .append(name)
                                  .append(": ")
                                  .append(std::strerror(error)));
    }
  }
  return TokenFileWriter(std::move(path), std::move(scratch[0]), std::move(scratch[1]));
}

Status TokenFileWriter::Add(const TokenizedExample& e) {
  const auto example = [&] { return path_ + ": example " + std::to_string(num_examples()); };
  if (e.input_ids.empty() || e.input_ids.size() != e.labels.size()) {
    return InvalidArgumentError(example() + " has " + std::to_string(e.input_ids.size()) +
                                " ids and " + std::to_string(e.labels.size()) +
                                " labels (must be equal and non-zero)");
  }
  for (size_t t = 0; t < e.input_ids.size(); ++t) {
    if (e.input_ids[t] < 0) return InvalidArgumentError(example() + " has a negative token id");
    if (e.labels[t] != e.input_ids[t] && e.labels[t] != kIgnoreIndex) {
      return InvalidArgumentError(example() + " token " + std::to_string(t) + " has label " +
                                  std::to_string(e.labels[t]) + ", neither its id nor -100");
    }
  }
  // Flushed before an example that would not fit, so the buffers keep the size reserved for them.
  if (ids_buffer_.size() + e.input_ids.size() > kScratchBufferTokens) {
    RETURN_IF_ERROR(FlushScratch());
  }
  for (size_t t = 0; t < e.input_ids.size(); ++t) {
    const bool target = e.labels[t] != kIgnoreIndex;
    max_token_id_ = std::max(max_token_id_, e.input_ids[t]);
    // Position 0 is never a target: the model predicts token t from tokens before it.
    if (t > 0 && target) ++target_tokens_;
    mask_buffer_.push_back(target ? 1 : 0);
  }
  ids_buffer_.insert(ids_buffer_.end(), e.input_ids.begin(), e.input_ids.end());
  offsets_.push_back(offsets_.back() + e.input_ids.size());
  return Status::Ok();
}

Status TokenFileWriter::FlushScratch() {
  Status status = WriteAll(ids_scratch_.get(), ids_buffer_.data(), ids_buffer_.size() * 4);
  if (status.ok()) status = WriteAll(mask_scratch_.get(), mask_buffer_.data(), mask_buffer_.size());
  if (!status.ok()) {
    return Status(status.code(), std::string("cannot write ")
                                     .append(path_)
                                     .append(": scratch file: ")
                                     .append(status.message()));
  }
  ids_buffer_.clear();
  mask_buffer_.clear();
  return Status::Ok();
}

Status TokenFileWriter::Finish(std::string_view fingerprint, int32_t bos_id, int32_t eos_id) {
  if (num_examples() == 0) return InvalidArgumentError(path_ + ": no examples to write");
  if (fingerprint.size() > kMaxFingerprintBytes) {
    return InvalidArgumentError(path_ + ": fingerprint longer than " +
                                std::to_string(kMaxFingerprintBytes) + " bytes");
  }
  RETURN_IF_ERROR(FlushScratch());
  TokenFileHeader header{};
  std::memcpy(header.magic, kTokenFileMagic, sizeof(header.magic));
  header.version = kTokenFileVersion;
  header.fingerprint_bytes = static_cast<uint32_t>(fingerprint.size());
  header.num_examples = static_cast<uint64_t>(num_examples());
  header.total_tokens = offsets_.back();
  header.target_tokens = target_tokens_;
  header.bos_id = bos_id;
  header.eos_id = eos_id;
  header.max_token_id = max_token_id_;

  return WriteFileAtomically(path_, [&](int fd) -> Status {
    static constexpr char kZeros[8] = {};
    // The content hash covers the sections in file order, so the reader checks it in one pass; it
    // is computed as they are copied out of the scratch files, which are read once, and the header
    // that carries it is written over its placeholder last.
    RETURN_IF_ERROR(WriteAll(fd, &header, sizeof(header)));
    RETURN_IF_ERROR(WriteAll(fd, fingerprint.data(), fingerprint.size()));
    RETURN_IF_ERROR(WriteAll(fd, kZeros, Align8(fingerprint.size()) - fingerprint.size()));
    RETURN_IF_ERROR(WriteAll(fd, offsets_.data(), offsets_.size() * sizeof(uint64_t)));
    uint64_t hash = Fnv1a64(Bytes(std::span<const uint64_t>(offsets_)));
    RETURN_IF_ERROR(CopyHashing(ids_scratch_.get(), header.total_tokens * 4, fd, hash));
    RETURN_IF_ERROR(CopyHashing(mask_scratch_.get(), header.total_tokens, fd, hash));
    const uint64_t body = sizeof(header) + Align8(fingerprint.size()) +
                          offsets_.size() * sizeof(uint64_t) + header.total_tokens * 5;
    RETURN_IF_ERROR(WriteAll(fd, kZeros, Align8(body) - body));
    header.content_hash = hash;
    if (::lseek(fd, 0, SEEK_SET) != 0) return UnavailableError(std::strerror(errno));
    return WriteAll(fd, &header, sizeof(header));
  });
}

Status CheckRoomToPrepare(const std::string& path, int64_t file_bytes,
                          std::optional<uint64_t> available) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const std::string what =
      std::string("cannot prepare ")
          .append(path)
          .append(" (its scratch files, then the file: twice the ")
          .append(FormatBytes(static_cast<uint64_t>(std::max<int64_t>(file_bytes, 0))))
          .append(" it is estimated at)");
  if (!available.has_value()) {
    ASSIGN_OR_RETURN(available, AvailableBytes(what, dir));
  }
  // Unavailable, as the files report a write the disk refused: lack of room is the machine's
  // failure, not the input's (llm-train --prepare exits kFailed for it, not kInvalidInput).
  const Status room = CheckRoomIn(what, dir, *available, SaturatingMul<int64_t>(file_bytes, 2), 0);
  if (room.ok()) return room;
  return UnavailableError(room.message());
}

StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path, Options options) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::Open(path));
  std::unique_ptr<TokenFile> file(new TokenFile());
  file->path_ = path;
  file->mapping_ = std::move(mapping);
  RETURN_IF_ERROR(file->Parse(file->mapping_->bytes(), options));
  return file;
}

StatusOr<std::unique_ptr<TokenFile>> TokenFile::FromBuffer(std::span<const std::byte> bytes,
                                                           std::string display_name,
                                                           Options options) {
  std::unique_ptr<TokenFile> file(new TokenFile());
  file->path_ = std::move(display_name);
  RETURN_IF_ERROR(file->Parse(bytes, options));
  return file;
}

Status TokenFile::Parse(std::span<const std::byte> bytes, const Options& options) {
  ASSIGN_OR_RETURN(const TokenFileHeader header, ReadHeader(bytes, path_));
  const std::byte* p = bytes.data() + sizeof(TokenFileHeader);
  fingerprint_.assign(reinterpret_cast<const char*>(p), header.fingerprint_bytes);
  p += Align8(header.fingerprint_bytes);
  // The mapping is page-aligned and every section starts at a multiple of 8, so these casts are
  // aligned; FromBuffer callers hand in 8-aligned buffers (std::string and vector data are).
  offsets_ = {reinterpret_cast<const uint64_t*>(p), header.num_examples + 1};
  p += offsets_.size_bytes();
  ids_ = {reinterpret_cast<const int32_t*>(p), header.total_tokens};
  p += ids_.size_bytes();
  mask_ = {reinterpret_cast<const uint8_t*>(p), header.total_tokens};

  RETURN_IF_ERROR(CheckOffsets(offsets_, header.total_tokens, path_));
  if (options.verify_contents)
    RETURN_IF_ERROR(VerifyContents(header, offsets_, ids_, mask_, path_));
  if (header.total_tokens > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      header.target_tokens > header.total_tokens) {
    return DataLossError(path_ + ": implausible token counts (corrupt header)" +
                         std::string(kRerun));
  }
  num_examples_ = static_cast<int64_t>(header.num_examples);
  total_tokens_ = static_cast<int64_t>(header.total_tokens);
  target_tokens_ = static_cast<int64_t>(header.target_tokens);
  bos_id_ = header.bos_id;
  eos_id_ = header.eos_id;
  max_token_id_ = header.max_token_id;
  return Status::Ok();
}

std::string MakeFingerprint(std::string_view tokenizer_fingerprint, uint64_t data_hash,
                            const PrepareOptions& options) {
  return "llmctl-tokens v" + std::to_string(kTokenFileVersion) +
         "; tokenizer=" + std::string(tokenizer_fingerprint) +
         "; data=fnv1a64:" + HexU64(data_hash) +
         "; format=" + std::string(DatasetFormatName(options.format)) +
         "; template=" + std::string(PromptTemplateName(options.prompt_template)) +
         "; max_seq_length=" + std::to_string(options.max_seq_length) +
         "; mask_prompt=" + (options.mask_prompt ? "true" : "false") +
         "; samples=" + (options.samples > 0 ? std::to_string(options.samples) : "all");
}

StatusOr<PrepareOptions> PrepareOptionsFor(const TrialConfig& config) {
  PrepareOptions options;
  const DataSettings& data = config.settings().data;
  ASSIGN_OR_RETURN(options.format, ParseDatasetFormat(Name(data.format)));
  if (options.format == DatasetFormat::kText && !config.IsSet("data.template")) {
    options.prompt_template = PromptTemplate::kNone;
  } else {
    ASSIGN_OR_RETURN(options.prompt_template, ParsePromptTemplate(Name(data.prompt_template)));
  }
  options.max_seq_length = data.max_seq_length;
  options.mask_prompt = data.mask_prompt;
  options.samples = data.samples;
  return options;
}

StatusOr<std::string> ExpectedFingerprint(const std::string& data_path, const TextEncoder& encoder,
                                          const PrepareOptions& options) {
  ASSIGN_OR_RETURN(const uint64_t hash, Fnv1a64File(data_path));
  return MakeFingerprint(encoder.fingerprint(), hash, options);
}

StatusOr<PrepareStats> PrepareTokenFile(const std::string& data_path, const TextEncoder& encoder,
                                        const PrepareOptions& options,
                                        const std::string& out_path) {
  if (options.samples < 0) {
    return InvalidArgumentError("samples must be >= 0 (0 = all), got " +
                                std::to_string(options.samples));
  }
  // A token a byte of the JSONL, 5 file bytes each: what byte-level tokenizers give at most for
  // the text (the template's words roughly make up for the JSON's keys and quotes); larger
  // vocabularies give fewer, so this errs towards refusing. A file that cannot be read is named by
  // the read below.
  std::error_code size_error;
  const uintmax_t data_bytes = std::filesystem::file_size(data_path, size_error);
  if (!size_error) {
    int64_t tokens = static_cast<int64_t>(std::min<uintmax_t>(data_bytes, INT64_MAX));
    if (options.samples > 0) {
      tokens = std::min(tokens, SaturatingMul(options.samples, options.max_seq_length));
    }
    RETURN_IF_ERROR(CheckRoomToPrepare(out_path, SaturatingMul<int64_t>(tokens, 5)));
  }
  // One read serves both the hash and the parse, so the fingerprint describes exactly the bytes
  // that were tokenized even if the file changes meanwhile; each record is tokenized as it is
  // read and goes to the writer's scratch files, so neither the file's text nor its tokens are
  // held.
  const ExampleOptions example_options{options.max_seq_length, options.mask_prompt};
  ASSIGN_OR_RETURN(TokenFileWriter writer, TokenFileWriter::Create(out_path));
  PrepareStats stats;
  const auto tokenize = [&](Record record) -> Status {
    ++stats.records_in_file;
    if (options.samples > 0 && stats.records_in_file > options.samples) return Status::Ok();
    const std::string where = data_path + ":" + std::to_string(record.line);
    StatusOr<PromptAndResponse> rendered =
        RenderExample(record, options.format, options.prompt_template);
    if (!rendered.ok()) return rendered.status();
    StatusOr<TokenizedExample> example = TokenizeExample(encoder, *rendered, example_options);
    if (!example.ok()) return example.status().WithContext(where);
    if (example->input_ids.empty()) {
      return InvalidArgumentError(where +
                                  ": the example encodes to no tokens (empty text and a "
                                  "tokenizer without BOS/EOS)");
    }
    // Position 0's label is never a target (nothing precedes it), so count from 1.
    const int64_t targets = std::count_if(example->labels.begin() + 1, example->labels.end(),
                                          [](int32_t l) { return l != kIgnoreIndex; });
    stats.total_tokens += static_cast<int64_t>(example->input_ids.size());
    stats.target_tokens += targets;
    stats.truncated += example->truncated ? 1 : 0;
    stats.without_targets += targets == 0 ? 1 : 0;
    stats.max_length = std::max(stats.max_length, static_cast<int64_t>(example->input_ids.size()));
    return writer.Add(*example);
  };
  uint64_t data_hash = 0;
  RETURN_IF_ERROR(ForEachJsonlRecord(data_path, options.format, tokenize, &data_hash));
  stats.fingerprint = MakeFingerprint(encoder.fingerprint(), data_hash, options);
  stats.examples = writer.num_examples();
  RETURN_IF_ERROR(writer.Finish(stats.fingerprint, encoder.bos_id(), encoder.eos_id()));
  return stats;
}

}  // namespace llmctl::data
