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

StatusOr<UniqueFd> LockDataDirectory(const std::string& dir, std::string_view lock_name,
                                     std::string_view daemon, std::string_view remedy) {
  const std::string path = dir + "/" + std::string(lock_name);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    return FailedPreconditionError(
        std::string("cannot open ").append(path).append(": ").append(std::strerror(errno)));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return FailedPreconditionError(
          std::string("cannot lock ").append(path).append(": ").append(std::strerror(errno)));
    }
    // The holder's pid, when it wrote one (it writes it just after taking the lock).
    std::string holder;
    char text[32] = {};
    const ssize_t got = ::pread(fd.get(), text, sizeof(text) - 1, 0);
    if (got > 0) {
      const std::string pid(text, static_cast<size_t>(got));
      const size_t digits = pid.find_first_not_of("0123456789");
      if (digits != 0) holder = std::string(" (pid ").append(pid.substr(0, digits)).append(")");
    }
    return FailedPreconditionError(std::string("another ")
                                       .append(daemon)
                                       .append(holder)
                                       .append(" is using the data directory ")
                                       .append(dir)
                                       .append("; ")
                                       .append(remedy));
  }
  // A pid that cannot be written loses only the pid in a second daemon's refusal: the lock holds.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) == 0) (void)!::pwrite(fd.get(), pid.data(), pid.size(), 0);
  return fd;
}

}  // namespace llmctl
