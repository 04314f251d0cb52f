// File helpers shared by common/data/: hashing, whole-file reads, atomic writes, read-only
// mappings.
#ifndef LLMCTL_COMMON_DATA_FILE_UTIL_H_
#define LLMCTL_COMMON_DATA_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/atomic_file.h"
#include "common/files.h"
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

// ReadFileToString and MappedFile live in common/files.h, FirstInvalidUtf8 in common/text.h.

}  // namespace llmctl::data

#endif  // LLMCTL_COMMON_DATA_FILE_UTIL_H_
