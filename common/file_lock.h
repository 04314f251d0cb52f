// An exclusive flock(2) on a file, held while the FileLock lives: closing its descriptor releases
// it, so a process that dies releases it too. The embedded daemons' starts, llmctl's first probe of
// this machine and the preparation of a token file each take one.
#ifndef LLMCTL_COMMON_FILE_LOCK_H_
#define LLMCTL_COMMON_FILE_LOCK_H_

#include <chrono>
#include <filesystem>
#include <utility>

#include "common/status.h"

namespace llmctl {

class FileLock {
 public:
  // Creates the file (0600) when absent, never through a symbolic link, and waits for the lock.
  static StatusOr<FileLock> Acquire(const std::filesystem::path& path);
  // Acquire, waiting at most `wait`: DeadlineExceeded, naming the file, while another holds it
  // longer.
  static StatusOr<FileLock> AcquireWithin(const std::filesystem::path& path,
                                          std::chrono::milliseconds wait);
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace llmctl

#endif  // LLMCTL_COMMON_FILE_LOCK_H_
