#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace llmctl {
namespace {

std::atomic<uint64_t> g_temp_counter{0};

Status ErrnoError(int error, const std::string& what) {
  return UnavailableError(what + ": " + std::strerror(error));
}

}  // namespace

Status WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return UnavailableError(std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, const std::function<Status(int fd)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(g_temp_counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create " + tmp);
  Status status = write(fd);
  // fsync before rename: otherwise a crash can leave the new name pointing at unwritten blocks.
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, "fsync");
  if (::close(fd) != 0 && status.ok()) status = ErrnoError(errno, "close");
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, "rename to " + path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return Status(status.code(), "cannot write " + path + ": " + status.message());
  }
  return Status::Ok();
}

}  // namespace llmctl
