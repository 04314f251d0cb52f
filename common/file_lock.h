// An exclusive flock(2) on a file, held while the FileLock lives: closing its descriptor releases
// it, so a process that dies releases it too. The embedded daemons' starts, llmctl's first probe of
// this machine and the preparation of a token file each take one.
#ifndef LLMCTL_COMMON_FILE_LOCK_H_
#define LLMCTL_COMMON_FILE_LOCK_H_

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "common/unique_fd.h"

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

// A daemon's hold on its data directory, for as long as the returned descriptor is open: `dir`/
// `lock_name` (flock, exclusive, never waited for), with this process's pid written into it. A
// second daemon on the same directory would work on the same state beside the first (llmctld: its
// secrets file rewritten whole from memory, one database, one CA; llm-agent: its socket taken and
// the same runs recovered and supervised twice). FailedPrecondition while another process holds it:
// "another DAEMON (pid N) is using the data directory DIR; REMEDY". The descriptor is closed on
// exec, so a program the daemon starts does not hold it on.
StatusOr<UniqueFd> LockDataDirectory(const std::string& dir, std::string_view lock_name,
                                     std::string_view daemon, std::string_view remedy);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_FILE_LOCK_H_
