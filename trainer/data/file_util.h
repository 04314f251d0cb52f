// File helpers shared by trainer/data/: hashing, whole-file reads, atomic writes, read-only
// mappings.
#ifndef LLMCTL_TRAINER_DATA_FILE_UTIL_H_
#define LLMCTL_TRAINER_DATA_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/atomic_file.h"
#include "common/status.h"
#include "common/text.h"

namespace llmctl::data {

// 64-bit FNV-1a. Not cryptographic: it detects changed inputs and corrupted files, which is all the
// fingerprints and the token file's checksum need. Chain calls by passing the previous result as
// `hash`.
inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ULL;
uint64_t Fnv1a64(std::span<const std::byte> bytes, uint64_t hash = kFnv1a64Offset);
uint64_t Fnv1a64(std::string_view text, uint64_t hash = kFnv1a64Offset);
// Hash of a whole file (for the tokenizer's fingerprint: Fnv1a64File("tokenizer.json")).
StatusOr<uint64_t> Fnv1a64File(const std::string& path);
// 16 lowercase hex digits.
std::string HexU64(uint64_t value);

// The whole file; NotFound when missing.
StatusOr<std::string> ReadFileToString(const std::string& path);

// Atomic writes: WriteFileAtomically and WriteAll live in common/atomic_file.h.

// A read-only MAP_PRIVATE mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }

 private:
  MappedFile() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// FirstInvalidUtf8 lives in common/text.h.

}  // namespace llmctl::data

#endif  // LLMCTL_TRAINER_DATA_FILE_UTIL_H_
