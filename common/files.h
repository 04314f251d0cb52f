// Reading files: whole small files, and read-only memory mappings of large ones.
#ifndef LLMCTL_COMMON_FILES_H_
#define LLMCTL_COMMON_FILES_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace llmctl {

// The whole file. NotFound when missing, PermissionDenied when unreadable, InvalidArgument for
// anything but a regular file (a directory, a device such as /dev/zero, a FIFO, a socket: refused
// at once, never read or waited on), DataLoss when it is larger than `max_bytes` (so a wrong path
// to a huge file fails fast).
StatusOr<std::string> ReadFileToString(const std::string& path,
                                       size_t max_bytes = std::numeric_limits<size_t>::max());

// Where `path` lies inside the directory `dir`, both with their symbolic links resolved (those of
// the part that exists) and "." and ".." applied: the relative path below `dir`, or "" when `path`
// is `dir` itself, lies outside it, or either cannot be resolved. How the agent keeps what it
// serves and what it resumes from inside a run, whatever links or ".." a path holds.
std::string PathInside(const std::string& path, const std::string& dir);

// A read-only MAP_PRIVATE mapping of a whole file, unmapped on destruction. Errors as
// ReadFileToString. An empty file maps to an empty span.
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

}  // namespace llmctl

#endif  // LLMCTL_COMMON_FILES_H_
