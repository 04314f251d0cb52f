#include "common/data/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace llmctl::data {
namespace {}  // namespace

uint64_t Fnv1a64(std::span<const std::byte> bytes, uint64_t hash) {
  for (std::byte b : bytes) {
    hash ^= static_cast<uint64_t>(b);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

uint64_t Fnv1a64(std::string_view text, uint64_t hash) {
  return Fnv1a64(std::as_bytes(std::span(text.data(), text.size())), hash);
}

StatusOr<uint64_t> Fnv1a64File(const std::string& path) {
  uint64_t hash = kFnv1a64Offset;
  RETURN_IF_ERROR(ReadFileInPieces(path, [&](std::string_view piece) {
    hash = Fnv1a64(piece, hash);
    return Status::Ok();
  }));
  return hash;
}

std::string HexU64(uint64_t value) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[i] = kHex[value & 15];
  return out;
}

}  // namespace llmctl::data
