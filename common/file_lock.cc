#include "common/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

namespace llmctl {
namespace {

// How often AcquireWithin tries again while another holds the lock.
constexpr std::chrono::milliseconds kRetryInterval{50};

StatusOr<int> OpenLockFile(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return FailedPreconditionError(path.string() + ": " + std::strerror(errno));
  return fd;
}

}  // namespace

StatusOr<FileLock> FileLock::Acquire(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(const int fd, OpenLockFile(path));
  while (::flock(fd, LOCK_EX) != 0) {
    const int error = errno;
    if (error == EINTR) continue;
    ::close(fd);
    return FailedPreconditionError(path.string() + ": lock: " + std::strerror(error));
  }
  return FileLock(fd);
}

StatusOr<FileLock> FileLock::AcquireWithin(const std::filesystem::path& path,
                                           std::chrono::milliseconds wait) {
  ASSIGN_OR_RETURN(const int fd, OpenLockFile(path));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EINTR) continue;
    if (error != EWOULDBLOCK || std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      if (error != EWOULDBLOCK) {
        return FailedPreconditionError(path.string() + ": lock: " + std::strerror(error));
      }
      return Status(StatusCode::kDeadlineExceeded, path.string() +
                                                       ": another process has held its lock for " +
                                                       std::to_string(wait.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(kRetryInterval);
  }
  return FileLock(fd);
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace llmctl
